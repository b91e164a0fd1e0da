//! The server-wide budget of request bytes in flight.
//!
//! Every byte a request makes the server hold — its body as it arrives, its
//! decoded tensors, the outputs it will get — is reserved here before it is
//! allocated, and given back when it is freed. A request that does not fit
//! waits briefly for others to finish ([`WAIT`], or less if its deadline is
//! nearer), then is refused as overloaded: the process never holds more
//! request bytes than the budget, however many requests arrive at once.
//! What the budget does not count (the engine's own working memory, the
//! encoded response) is documented in docs/serving.md.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::error::{Class, ServeError};

/// How long a request waits for room before it is refused: long enough for
/// requests in flight to finish (a small model answers in well under a
/// millisecond, a large one in tens), short enough that a client of an
/// overloaded server hears so at once.
pub const WAIT: Duration = Duration::from_millis(100);

/// The budget: how many bytes requests may hold at once, and how many they
/// hold now.
#[derive(Debug)]
pub struct Budget {
    capacity: u64,
    used: AtomicU64,
    freed: Notify,
}

/// Bytes reserved from a [`Budget`], given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    /// A budget of `capacity` bytes, none used.
    pub fn new(capacity: u64) -> Arc<Budget> {
        Arc::new(Budget { capacity, used: AtomicU64::new(0), freed: Notify::new() })
    }

    /// The bytes requests may hold at once.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The bytes requests hold now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// A reservation of nothing, to grow.
    pub fn empty(self: &Arc<Self>) -> Reservation {
        Reservation { budget: Arc::clone(self), bytes: 0 }
    }

    fn try_take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.capacity)
            })
            .is_ok()
    }

    /// Takes `bytes` for a request that will then hold `total`, waiting
    /// until `until` for others to give room back.
    async fn take(&self, bytes: u64, total: u64, until: Instant) -> Result<(), ServeError> {
        if total > self.capacity {
            return Err(ServeError::new(
                Class::TooLarge,
                "too_large",
                format!(
                    "the request needs {total} bytes in memory, more than the server's whole request memory budget of {} bytes",
                    self.capacity
                ),
            ));
        }
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a release in between wakes it.
            freed.as_mut().enable();
            if self.try_take(bytes) {
                return Ok(());
            }
            if tokio::time::timeout_at(until.into(), freed).await.is_err() {
                return Err(ServeError::overloaded(format!(
                    "the server holds {} of its {} bytes of request memory and this request needs {bytes} more; retry later or elsewhere",
                    self.used(),
                    self.capacity
                )));
            }
        }
    }

    fn give_back(&self, bytes: u64) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            self.freed.notify_waiters();
        }
    }
}

/// How long a request may wait for room: [`WAIT`], or until its deadline
/// if that comes first.
pub fn wait_until(deadline: Option<Instant>) -> Instant {
    let bound = Instant::now() + WAIT;
    deadline.map_or(bound, |d| d.min(bound))
}

impl Reservation {
    /// The bytes held.
    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Reserves `bytes` more, waiting until `until` for room; refused as
    /// overloaded if none comes (as too large if the budget could never
    /// hold them).
    pub async fn grow(&mut self, bytes: u64, until: Instant) -> Result<(), ServeError> {
        if self.try_grow(bytes) {
            return Ok(());
        }
        self.budget.take(bytes, self.bytes.saturating_add(bytes), until).await?;
        self.bytes += bytes;
        Ok(())
    }

    /// Reserves `bytes` more if they fit now, without waiting.
    pub fn try_grow(&mut self, bytes: u64) -> bool {
        let fits = bytes == 0 || self.budget.try_take(bytes);
        if fits {
            self.bytes += bytes;
        }
        fits
    }

    /// The budget this reservation is part of.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Gives `bytes` back (at most what is held), for memory freed early.
    pub fn release(&mut self, bytes: u64) {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        self.budget.give_back(bytes);
    }

    /// Moves everything `other` holds into this reservation.
    pub fn absorb(&mut self, mut other: Reservation) {
        self.bytes += std::mem::take(&mut other.bytes);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
    }

    #[test]
    fn reservations_add_up_to_the_capacity_and_come_back_when_dropped() {
        runtime().block_on(async {
            let budget = Budget::new(100);
            let mut a = budget.empty();
            a.grow(60, Instant::now()).await.unwrap();
            let mut b = budget.empty();
            let refused = b.grow(50, Instant::now()).await.unwrap_err();
            assert_eq!((refused.class, refused.kind), (Class::Overloaded, "overloaded"));
            assert_eq!(b.bytes(), 0, "a refused reservation holds nothing");
            b.grow(40, Instant::now()).await.unwrap();
            assert_eq!(budget.used(), 100);
            a.release(10);
            assert_eq!((a.bytes(), budget.used()), (50, 90));
            b.absorb(a);
            assert_eq!((b.bytes(), budget.used()), (90, 90));
            drop(b);
            assert_eq!(budget.used(), 0);
            let too_large = budget.empty().grow(101, Instant::now() + WAIT).await.unwrap_err();
            assert_eq!((too_large.class, too_large.kind), (Class::TooLarge, "too_large"));
        });
    }

    #[test]
    fn a_waiting_reservation_gets_the_room_given_back() {
        runtime().block_on(async {
            let budget = Budget::new(100);
            let mut held = budget.empty();
            held.grow(80, Instant::now()).await.unwrap();
            let waiter = {
                let budget = Arc::clone(&budget);
                tokio::spawn(async move {
                    let mut r = budget.empty();
                    r.grow(50, Instant::now() + Duration::from_secs(60)).await.map(|()| r.bytes())
                })
            };
            tokio::task::yield_now().await;
            held.release(80);
            assert_eq!(waiter.await.unwrap().unwrap(), 50);
        });
    }
}
