//! [`Pool`]: a model's sessions, lent to one request at a time, first come
//! first served.
//!
//! The server does not take sessions from the pool: each session has a
//! session thread of its own (`baton_core::run::executor`), which reaches it by
//! index ([`Pool::item`]) and never waits for it, and requests queue in the
//! version's executor, on no thread. [`Pool::take`], which blocks until a
//! session is free, serves callers that run inferences on their own
//! threads (tools, tests); never call it from an async task.
//!
//! A request takes whichever session is free. When none is, it queues, and
//! the next session to come back — whichever it is — goes to the request
//! that has waited longest. Waiting for one particular session instead
//! would leave a request queued behind a long inference while another
//! session sits idle, and an unfair lock lets newcomers overtake a waiting
//! request again and again; both show as a tail several inferences long
//! when requests outnumber sessions.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Items lent out one holder at a time, to waiters in arrival order.
pub(crate) struct Pool<T> {
    items: Box<[Mutex<T>]>,
    state: Mutex<State>,
    returned: Condvar,
}

/// Which items are free, and the queue of waiting requests as tickets: a
/// waiter takes ticket `issued` and is served when `served` reaches it.
struct State {
    free: Vec<usize>,
    issued: u64,
    served: u64,
}

/// One item of a [`Pool`], held until dropped.
pub(crate) struct Lease<'a, T> {
    pool: &'a Pool<T>,
    index: usize,
    guard: MutexGuard<'a, T>,
}

impl<T> Pool<T> {
    /// A pool of `items`, all free.
    pub(crate) fn new(items: Vec<T>) -> Pool<T> {
        // Popped from the end: item 0 is lent first.
        let free = (0..items.len()).rev().collect();
        Pool {
            items: items.into_iter().map(Mutex::new).collect(),
            state: Mutex::new(State { free, issued: 0, served: 0 }),
            returned: Condvar::new(),
        }
    }

    /// How many items the pool has.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Item `index`, bypassing the queue. For callers that choose the item
    /// themselves (a batcher lending out instances, warmup running on each
    /// one); a request holding that item is waited for on its lock.
    pub(crate) fn item(&self, index: usize) -> Option<MutexGuard<'_, T>> {
        self.items.get(index).map(|m| m.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A free item, waiting behind earlier requests if none is free.
    pub(crate) fn take(&self) -> Lease<'_, T> {
        let mut state = self.state();
        // Every request takes a ticket; with no one ahead it is served at once.
        let ticket = state.issued;
        state.issued += 1;
        let index = loop {
            if state.served == ticket
                && let Some(index) = state.free.pop()
            {
                break index;
            }
            state = self.returned.wait(state).unwrap_or_else(PoisonError::into_inner);
        };
        state.served += 1;
        if !state.free.is_empty() && state.issued != state.served {
            // More than one came back: the next ticket can go too.
            self.returned.notify_all();
        }
        drop(state);
        let guard = self.items[index].lock().unwrap_or_else(PoisonError::into_inner);
        Lease { pool: self, index, guard }
    }

    /// How many requests are queued for an item.
    #[cfg(test)]
    fn waiting(&self) -> u64 {
        let state = self.state();
        state.issued - state.served
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> Lease<'_, T> {
    /// Which item this is.
    #[cfg(test)]
    fn index(&self) -> usize {
        self.index
    }
}

impl<T> std::ops::Deref for Lease<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for Lease<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for Lease<'_, T> {
    fn drop(&mut self) {
        let mut state = self.pool.state();
        state.free.push(self.index);
        let queued = state.issued != state.served;
        drop(state);
        if queued {
            // Every waiter checks whether its ticket is the one served next.
            self.pool.returned.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// Waits (without a deadline on the condition itself, but bounded) until
    /// `n` requests are queued on `pool`.
    fn until_waiting<T>(pool: &Pool<T>, n: u64) {
        for _ in 0..60_000 {
            if pool.waiting() == n {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("{n} requests never queued; {} are", pool.waiting());
    }

    #[test]
    fn a_free_item_is_lent_while_others_are_held() {
        let pool = Pool::new(vec!["a", "b", "c"]);
        let first = pool.take();
        let second = pool.take();
        let third = pool.take();
        assert_eq!([first.index(), second.index(), third.index()], [0, 1, 2]);
        assert_eq!(*third, "c");
        drop(second);
        assert_eq!(pool.take().index(), 1);
    }

    #[test]
    fn a_waiter_gets_whichever_item_comes_back_first() {
        let pool = Arc::new(Pool::new(vec![0u32, 1]));
        let (held0, held1) = (pool.take(), pool.take());
        let (tx, rx) = mpsc::channel();
        let waiter = Arc::clone(&pool);
        let thread = std::thread::spawn(move || tx.send(waiter.take().index()).unwrap());
        until_waiting(&pool, 1);
        drop(held1);
        assert_eq!(rx.recv_timeout(Duration::from_secs(60)).unwrap(), 1);
        thread.join().unwrap();
        drop(held0);
    }

    #[test]
    fn a_newcomer_does_not_overtake_a_waiter() {
        let pool = Arc::new(Pool::new(vec![()]));
        let held = pool.take();
        let (tx, rx) = mpsc::channel();
        let waiter = Arc::clone(&pool);
        let thread = std::thread::spawn(move || {
            let lease = waiter.take();
            tx.send("waiter").unwrap();
            drop(lease);
        });
        until_waiting(&pool, 1);
        drop(held);
        // The item is free the moment `held` is dropped; taking it now must
        // still wait for the request queued before.
        let again = pool.take();
        assert_eq!(rx.try_recv(), Ok("waiter"), "the newcomer was served before the waiting request");
        drop(again);
        thread.join().unwrap();
    }

    #[test]
    fn waiters_are_served_in_arrival_order() {
        let pool = Arc::new(Pool::new(vec![()]));
        let held = pool.take();
        let (tx, rx) = mpsc::channel();
        let mut threads = Vec::new();
        for name in 0..4 {
            let (pool2, tx) = (Arc::clone(&pool), tx.clone());
            threads.push(std::thread::spawn(move || {
                let lease = pool2.take();
                tx.send(name).unwrap();
                drop(lease);
            }));
            until_waiting(&pool, name + 1);
        }
        drop(held);
        let order: Vec<u64> = (0..4).map(|_| rx.recv_timeout(Duration::from_secs(60)).unwrap()).collect();
        assert_eq!(order, [0, 1, 2, 3]);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(pool.waiting(), 0);
    }
}
