//! Locks and channels between serving threads and the threads that load and
//! free versions.
//!
//! Loading threads run at the lowest priority (nice 19, `SCHED_IDLE`;
//! [`crate::threads::sys::lower_current_thread`]). One that is preempted while it
//! holds a lock keeps every thread that needs that lock waiting until it
//! gets a CPU back, which on a busy machine can take many milliseconds. So
//! a lowered thread takes no lock that serving threads take: it hands such
//! work to the registry's agent, a thread at serving priority
//! ([`crate::threads::agent`]).
//!
//! [`Lock`] is the core's one mutex. It ignores poisoning (a panic while
//! holding it leaves data that is still consistent for every use here), and
//! in debug builds it records each time it is taken by the wrong kind of
//! thread ([`misuses`]), which tests check after running loads.
//!
//! `Sender` and `Receiver` (crate-internal) are a channel whose receiving
//! thread parks instead of waiting inside the channel. A waiting receiver
//! of a standard channel registers under the channel's internal lock, and a
//! sender that wakes it holds that lock across the wake-up: a lowered
//! sender can be preempted right there by the very thread it woke, which
//! then needs the lock to wait again. With a parked receiver no sender ever
//! takes that lock; the sender wakes the receiver with `Thread::unpark`,
//! which takes none. One window is left: a sender that has claimed a slot
//! in the queue but not yet written it holds back the receiver's next
//! receive until it runs again, a few instructions' worth.

use std::marker::PhantomData;
use std::panic::Location;
use std::sync::{Mutex, MutexGuard, mpsc};
use std::thread::Thread;

/// Which threads may take a [`Lock`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Takers {
    /// Serving threads and others at serving priority; never lowered ones.
    #[default]
    Serving,
    /// Lowered threads only, among themselves.
    Lowered,
}

/// A mutex of baton's core: poison-tolerant, and checked in debug builds
/// for the kind of thread that takes it.
#[derive(Debug, Default)]
pub struct Lock<T> {
    mutex: Mutex<T>,
    /// Checked in debug builds only.
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    takers: Takers,
}

impl<T> Lock<T> {
    /// A lock that serving threads may take, and lowered threads must not.
    pub const fn new(value: T) -> Lock<T> {
        Lock { mutex: Mutex::new(value), takers: Takers::Serving }
    }

    /// A lock that only lowered threads take, among themselves (the memory
    /// measurement window shared by the loader and the keeper); a thread at
    /// serving priority taking it counts as a misuse.
    pub const fn among_lowered(value: T) -> Lock<T> {
        Lock { mutex: Mutex::new(value), takers: Takers::Lowered }
    }

    /// Takes the lock, whether or not a holder panicked. The guard is the
    /// standard one, so it works with `Condvar`.
    #[track_caller]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        #[cfg(debug_assertions)]
        if crate::threads::sys::current_thread_lowered() != (self.takers == Takers::Lowered) {
            record_misuse(Location::caller());
        }
        self.mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A lock taken by the wrong kind of thread, recorded in debug builds.
#[derive(Clone, Debug)]
pub struct Misuse {
    /// Where the lock was taken.
    pub location: &'static Location<'static>,
    /// The name of the thread that took it.
    pub thread: Option<String>,
    /// Whether that thread was lowered (taking a lock shared with serving)
    /// or not (taking one kept among lowered threads).
    pub lowered: bool,
}

/// Misuses recorded so far in this process (in debug builds; none in
/// release builds, which do not check). At most [`MISUSES_KEPT`] are kept.
pub fn misuses() -> Vec<Misuse> {
    MISUSES.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

/// How many misuses [`misuses`] keeps.
pub const MISUSES_KEPT: usize = 64;

static MISUSES: Mutex<Vec<Misuse>> = Mutex::new(Vec::new());

/// Records a misuse at `location` by the calling thread: a lowered thread
/// doing what only threads at serving priority may, or the reverse.
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub(crate) fn record_misuse(location: &'static Location<'static>) {
    let misuse = Misuse {
        location,
        thread: std::thread::current().name().map(str::to_owned),
        lowered: crate::threads::sys::current_thread_lowered(),
    };
    let mut kept = MISUSES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if kept.len() < MISUSES_KEPT {
        kept.push(misuse);
    }
}

/// In debug builds, records a misuse when the calling thread is lowered:
/// for work only threads at serving priority may do, such as starting a
/// thread that must not inherit a lowered priority.
#[track_caller]
pub(crate) fn expect_serving_priority() {
    #[cfg(debug_assertions)]
    if crate::threads::sys::current_thread_lowered() {
        record_misuse(Location::caller());
    }
}

/// The sending half of a channel to a thread that parks while it waits
/// ([`Receiver`]). Sending takes no lock the receiving thread takes.
pub(crate) struct Sender<T> {
    /// Always `Some` until dropped.
    tx: Option<mpsc::Sender<T>>,
    receiver: Thread,
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").field("receiver", &self.receiver.name()).finish_non_exhaustive()
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender { tx: self.tx.clone(), receiver: self.receiver.clone() }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        // Gone first, then the wake-up: the last sender's going is news the
        // parked receiver must see (its next receive returns `None`).
        drop(self.tx.take());
        self.receiver.unpark();
    }
}

impl<T> Sender<T> {
    /// Queues `value` and wakes the receiving thread; gives `value` back
    /// when the receiver is gone.
    pub(crate) fn send(&self, value: T) -> Result<(), T> {
        let Some(tx) = &self.tx else { return Err(value) };
        tx.send(value).map_err(|mpsc::SendError(value)| value)?;
        self.receiver.unpark();
        Ok(())
    }
}

/// The receiving half of such a channel; it stays on the thread it was made
/// for, which is the thread its senders wake.
pub(crate) struct Receiver<T> {
    rx: mpsc::Receiver<T>,
    _this_thread: PhantomData<*const ()>,
}

impl<T> Receiver<T> {
    /// The next value, parking until one comes; `None` once every sender is
    /// gone and the queue is empty.
    pub(crate) fn recv(&self) -> Option<T> {
        loop {
            match self.rx.try_recv() {
                Ok(value) => return Some(value),
                // A wake-up that comes before the park makes it return at once.
                Err(mpsc::TryRecvError::Empty) => std::thread::park(),
                Err(mpsc::TryRecvError::Disconnected) => return None,
            }
        }
    }
}

/// A channel whose receiver is the calling thread.
pub(crate) fn channel_here<T>() -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = mpsc::channel();
    (Sender { tx: Some(tx), receiver: std::thread::current() }, Receiver { rx, _this_thread: PhantomData })
}

/// Starts a thread named `name` that runs `body` with the receiving half of
/// a new channel; returns the sending half.
pub(crate) fn spawn_receiver<T: Send + 'static>(
    name: &str,
    body: impl FnOnce(Receiver<T>) + Send + 'static,
) -> std::io::Result<Sender<T>> {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || body(Receiver { rx, _this_thread: PhantomData }))?;
    Ok(Sender { tx: Some(tx), receiver: thread.thread().clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The misuses recorded on threads named `name`.
    fn misuses_on(name: &str) -> Vec<Misuse> {
        misuses().into_iter().filter(|m| m.thread.as_deref() == Some(name)).collect()
    }

    #[test]
    fn a_lowered_thread_taking_a_serving_lock_is_recorded_and_a_serving_thread_is_not() {
        let shared = std::sync::Arc::new(Lock::new(0));
        let kept = std::sync::Arc::new(Lock::among_lowered(()));
        *shared.lock() += 1;
        let (lowered_shared, lowered_kept) = (std::sync::Arc::clone(&shared), std::sync::Arc::clone(&kept));
        std::thread::Builder::new()
            .name("sync-test-lowered".into())
            .spawn(move || {
                let _ = crate::threads::sys::lower_current_thread(19, true);
                drop(lowered_kept.lock());
                *lowered_shared.lock() += 1;
            })
            .unwrap()
            .join()
            .unwrap();
        std::thread::Builder::new()
            .name("sync-test-serving".into())
            .spawn(move || {
                *shared.lock() += 1;
                drop(kept.lock());
            })
            .unwrap()
            .join()
            .unwrap();
        let on_lowered = misuses_on("sync-test-lowered");
        let on_serving = misuses_on("sync-test-serving");
        if cfg!(debug_assertions) {
            assert_eq!(on_lowered.len(), 1, "only the shared lock counts on the lowered thread: {on_lowered:?}");
            assert!(on_lowered[0].lowered && on_lowered[0].location.file().ends_with("sync.rs"));
            assert_eq!(on_serving.len(), 1, "only the lowered-only lock counts on the serving thread: {on_serving:?}");
            assert!(!on_serving[0].lowered);
        } else {
            assert!(on_lowered.is_empty() && on_serving.is_empty(), "release builds do not check");
        }
    }

    #[test]
    fn a_poisoned_lock_is_still_taken() {
        let lock = std::sync::Arc::new(Lock::new(7));
        let holder = std::sync::Arc::clone(&lock);
        let panicked = std::thread::spawn(move || {
            let _guard = holder.lock();
            panic!("poisoning the lock on purpose");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(*lock.lock(), 7);
    }

    #[test]
    fn a_parked_receiver_wakes_when_its_last_sender_goes() {
        let (hand_over, handed) = std::sync::mpsc::channel();
        let receiver = std::thread::spawn(move || {
            let (tx, rx) = channel_here::<()>();
            let task = std::fs::read_link("/proc/thread-self").expect("/proc on linux");
            hand_over.send((tx, task)).unwrap();
            rx.recv()
        });
        let (tx, task) = handed.recv().unwrap();
        let state = || {
            let stat = std::fs::read_to_string(std::path::Path::new("/proc").join(&task).join("stat")).unwrap();
            stat[stat.rfind(')').unwrap() + 2..].chars().next()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while state() != Some('S') {
            assert!(std::time::Instant::now() < deadline, "the receiver never went to sleep");
            std::thread::yield_now();
        }
        drop(tx);
        while !receiver.is_finished() {
            assert!(std::time::Instant::now() < deadline, "a parked receiver slept on after its last sender went");
            std::thread::yield_now();
        }
        assert_eq!(receiver.join().unwrap(), None);
    }

    #[test]
    fn a_parked_receiver_gets_every_value_in_order_and_ends_with_its_senders() {
        let (done, finished) = channel_here::<Vec<u32>>();
        let tx = spawn_receiver::<u32>("sync-test-receiver", move |rx| {
            let mut got = Vec::new();
            while let Some(value) = rx.recv() {
                got.push(value);
            }
            let _ = done.send(got);
        })
        .unwrap();
        let senders: Vec<_> = (0..4)
            .map(|t| {
                let tx = tx.clone();
                std::thread::spawn(move || (0..250).for_each(|i| tx.send(t * 1000 + i).unwrap()))
            })
            .collect();
        senders.into_iter().for_each(|s| s.join().unwrap());
        drop(tx);
        let got = finished.recv().expect("the receiver reported");
        assert_eq!(got.len(), 1000);
        for t in 0..4 {
            let mine: Vec<u32> = got.iter().copied().filter(|v| v / 1000 == t).collect();
            assert_eq!(mine, (0..250).map(|i| t * 1000 + i).collect::<Vec<_>>(), "sender {t}'s values out of order");
        }
    }
}
