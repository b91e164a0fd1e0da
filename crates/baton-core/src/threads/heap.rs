//! Each version's memory in an allocator arena of its own.
//!
//! glibc gives every thread an arena for the thread's lifetime, and a block
//! goes back to the arena it came from. When one long-lived loader thread
//! built every version, the small allocations of a version being loaded
//! filled the holes the previous free left between those of the version
//! still serving, and that one arena fragmented. So each version is built on
//! a fresh thread, whose arena holds no other live version, and the thread
//! stays parked until the version is freed: while it lives, glibc cannot
//! hand its arena to the next build. The engine is freed on that same thread
//! ([`HeapLease::free_there`]), which then ends, and a later build takes the
//! emptied arena over. glibc caps arenas at eight per core; beyond that,
//! threads share arenas and the separation is best effort. The cost is one
//! idle thread per live version. Measurements: docs/hot-swap.md, "One
//! allocator arena per version", and docs/benchmarks-notebook.md §4.

use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::threads::agent::Inherited;
use crate::threads::step_aside::StepAside;

/// Something to be dropped on a version's build thread.
type Doomed = Box<dyn Send>;

/// Keeps a version's build thread, and with it the thread's arena, alive.
/// Dropping it ends the thread and waits until it has ended.
#[derive(Debug)]
pub struct HeapLease {
    alive: Option<mpsc::Sender<Doomed>>,
    thread: Option<JoinHandle<()>>,
}

impl HeapLease {
    /// Drops `doomed` (the version's engine) on the build thread, then ends
    /// the thread and waits until it has ended.
    ///
    /// Freeing on the thread that allocated matters too: glibc caches freed
    /// small blocks per *freeing* thread, and they go back to their arena
    /// only when that thread ends, which this one does before memory is
    /// trimmed and measured (docs/hot-swap.md, "One allocator arena per
    /// version").
    pub fn free_there(mut self, doomed: Doomed) {
        // Without a build thread (or if it is gone), `doomed` is dropped here.
        if let Some(alive) = self.alive.take() {
            let _ = alive.send(doomed);
        }
        self.join();
    }

    fn join(&mut self) {
        if let Some(thread) = self.thread.take() {
            // Dropped on the build thread itself (a load that failed):
            // the thread ends by itself once the build returns.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for HeapLease {
    fn drop(&mut self) {
        // The thread waits for this sender to go; then it can be joined.
        drop(self.alive.take());
        self.join();
    }
}

/// The work of building a version, given the lease to store in it.
type Build = Box<dyn FnOnce(HeapLease) + Send>;

/// Runs `build` on a new thread named `baton-build` and returns when `build`
/// has returned. The thread then waits until the [`HeapLease`] handed to
/// `build` is dropped. It inherits the caller's CPU priority, and with it
/// the caller's lowered mark and agent ([`crate::threads::agent`]), and steps aside
/// as `step_aside` says while it builds and while it frees, never while it
/// waits. When no thread can be started, `build` runs on the calling
/// thread, sharing its arena, and a warning says so.
pub fn build_on_own_heap(step_aside: StepAside, build: impl FnOnce(HeapLease) + Send + 'static) {
    let (work_tx, work_rx) = mpsc::channel::<(Build, HeapLease, mpsc::Receiver<Doomed>)>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let inherited = Inherited::here();
    let spawned = std::thread::Builder::new().name("baton-build".into()).spawn(move || {
        inherited.adopt();
        let Ok((build, lease, parked)) = work_rx.recv() else { return };
        let armed = step_aside.arm();
        build(lease);
        drop(armed);
        let _ = done_tx.send(());
        // Drops what the lease sends (the version's engine) until the lease is gone.
        for doomed in parked {
            let _armed = step_aside.arm();
            drop(doomed);
        }
    });
    let build: Build = Box::new(build);
    match spawned {
        Ok(thread) => {
            let (alive, parked) = mpsc::channel::<Doomed>();
            let lease = HeapLease { alive: Some(alive), thread: Some(thread) };
            match work_tx.send((build, lease, parked)) {
                // An error means the thread panicked inside `build`; the
                // load has already answered or dropped its reply.
                Ok(()) => drop(done_rx.recv()),
                Err(mpsc::SendError((build, lease, _))) => {
                    drop(lease);
                    run_here(build);
                }
            }
        }
        Err(error) => {
            crate::threads::agent::at_serving_priority(move || {
                tracing::warn!(
                    %error,
                    "Could not start a build thread; the version is built on the loader thread and shares its memory arena."
                );
            });
            let _armed = step_aside.arm();
            run_here(build);
        }
    }
}

fn run_here(build: Build) {
    build(HeapLease { alive: None, thread: None });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// `/proc/self/task/<tid>` of the calling thread.
    fn own_task() -> std::path::PathBuf {
        let link = std::fs::read_link("/proc/thread-self").expect("/proc on linux");
        std::path::Path::new("/proc").join(link)
    }

    #[test]
    fn the_build_thread_lives_exactly_as_long_as_the_lease() {
        let kept: Arc<Mutex<Option<HeapLease>>> = Arc::default();
        let slot = Arc::clone(&kept);
        let builder = Arc::new(Mutex::new(None));
        let seen = Arc::clone(&builder);
        build_on_own_heap(StepAside::OFF, move |lease| {
            let name = std::thread::current().name().map(str::to_owned);
            *seen.lock().unwrap() = Some((name, own_task()));
            *slot.lock().unwrap() = Some(lease);
        });
        // Returned after the build ran, on a thread of its own.
        let (name, task) = builder.lock().unwrap().take().expect("the build ran before the call returned");
        assert_eq!(name.as_deref(), Some("baton-build"));
        assert!(task.exists(), "the build thread ended while its lease was held");
        drop(kept.lock().unwrap().take());
        // The thread has been joined; the kernel removes its /proc entry
        // a moment after waking the joiner.
        let start = std::time::Instant::now();
        while task.exists() {
            assert!(start.elapsed() < std::time::Duration::from_secs(10), "the build thread outlived its lease");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Records whether the thread that drops it is armed to step aside.
    struct ArmedWitness(Arc<Mutex<Option<bool>>>);

    impl Drop for ArmedWitness {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(crate::threads::step_aside::armed_here());
        }
    }

    #[test]
    fn the_build_thread_steps_aside_while_it_builds_and_frees_and_not_while_it_waits() {
        let kept: Arc<Mutex<Option<HeapLease>>> = Arc::default();
        let slot = Arc::clone(&kept);
        let armed_in_build = Arc::new(Mutex::new(None));
        let seen = Arc::clone(&armed_in_build);
        build_on_own_heap(StepAside::STANDARD, move |lease| {
            *seen.lock().unwrap() = Some(crate::threads::step_aside::armed_here());
            *slot.lock().unwrap() = Some(lease);
        });
        assert_eq!(*armed_in_build.lock().unwrap(), Some(true), "not armed while building");
        let lease = kept.lock().unwrap().take().unwrap();
        let armed_in_free = Arc::new(Mutex::new(None));
        lease.free_there(Box::new(ArmedWitness(Arc::clone(&armed_in_free))));
        assert_eq!(*armed_in_free.lock().unwrap(), Some(true), "not armed while freeing");

        // Off arms nothing.
        let seen = Arc::new(Mutex::new(None));
        let inside = Arc::clone(&seen);
        build_on_own_heap(StepAside::OFF, move |_lease| {
            *inside.lock().unwrap() = Some(crate::threads::step_aside::armed_here())
        });
        assert_eq!(*seen.lock().unwrap(), Some(false));
    }

    /// Records the task it was dropped on.
    struct Witness(Arc<Mutex<Option<std::path::PathBuf>>>);

    impl Drop for Witness {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(own_task());
        }
    }

    #[test]
    fn free_there_drops_on_the_build_thread_and_waits_for_it() {
        let kept: Arc<Mutex<Option<(HeapLease, std::path::PathBuf)>>> = Arc::default();
        let slot = Arc::clone(&kept);
        build_on_own_heap(StepAside::OFF, move |lease| *slot.lock().unwrap() = Some((lease, own_task())));
        let (lease, builder) = kept.lock().unwrap().take().expect("the build ran");
        let dropped_on = Arc::new(Mutex::new(None));
        lease.free_there(Box::new(Witness(Arc::clone(&dropped_on))));
        // Dropped, and on the thread that built, before free_there returned.
        assert_eq!(dropped_on.lock().unwrap().as_deref(), Some(builder.as_path()));
    }
}
