//! Each version's memory in an allocator arena of its own.
//!
//! glibc's `malloc` gives every thread an arena and keeps it for that
//! thread's lifetime; a chunk goes back to the arena it came from, whichever
//! thread frees it. When one long-lived loader thread built every version,
//! all of them shared one arena: the small allocations of a version being
//! loaded (ONNX Runtime's graph, kernels, strings) filled the holes the
//! previous free left between the allocations of the version still serving,
//! and the arena fragmented. Measured with 100 swaps of a 215 MiB encoder,
//! RSS grew 3–4 MiB over the first ~30 swaps and then stayed flat, nearly all
//! of it in that one arena: 1.5–2 % of a version, against a 1 % target.
//!
//! So each version is built on a fresh thread, which gets an arena holding no
//! other live version's memory, and that thread stays parked, doing nothing,
//! until the version is freed. While it lives, glibc cannot hand its arena to
//! the next build thread. Once the version is freed the arena is empty,
//! `malloc_trim` returns its pages, the thread ends and a later build takes
//! the clean arena over. glibc caps arenas at eight per core; beyond that
//! threads share arenas, and the separation becomes best effort.
//!
//! The cost is one idle thread per live version, holding the few touched
//! pages of its stack.

use std::sync::mpsc;

/// Keeps a version's build thread, and with it the thread's arena, alive.
/// Dropping it, after the version's engine is freed, lets the thread end.
#[derive(Debug)]
pub struct HeapLease {
    _alive: mpsc::Sender<()>,
}

/// The work of building a version, given the lease to store in it.
type Build = Box<dyn FnOnce(HeapLease) + Send>;

/// Runs `build` on a new thread named `baton-build` and returns when `build`
/// has returned. The thread then waits until the [`HeapLease`] handed to
/// `build` is dropped. It inherits the caller's CPU priority. When no thread
/// can be started, `build` runs on the calling thread, sharing its arena,
/// and a warning says so.
pub fn build_on_own_heap(build: impl FnOnce(HeapLease) + Send + 'static) {
    let (work_tx, work_rx) = mpsc::channel::<Build>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let spawned = std::thread::Builder::new().name("baton-build".into()).spawn(move || {
        let Ok(build) = work_rx.recv() else { return };
        let (alive, parked) = mpsc::channel::<()>();
        build(HeapLease { _alive: alive });
        let _ = done_tx.send(());
        // Returns once the lease is gone: no message is ever sent.
        let _ = parked.recv();
    });
    let build: Build = Box::new(build);
    match spawned {
        Ok(_) => match work_tx.send(build) {
            // An error means the thread panicked inside `build`; the
            // pipeline has already answered or dropped its reply.
            Ok(()) => drop(done_rx.recv()),
            Err(mpsc::SendError(build)) => run_here(build),
        },
        Err(error) => {
            tracing::warn!(
                %error,
                "Could not start a build thread; the version is built on the loader thread and shares its memory arena."
            );
            run_here(build);
        }
    }
}

fn run_here(build: Build) {
    let (alive, _parked) = mpsc::channel::<()>();
    build(HeapLease { _alive: alive });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// `/proc/self/task/<tid>` of the calling thread.
    fn own_task() -> std::path::PathBuf {
        let link = std::fs::read_link("/proc/thread-self").expect("/proc on linux");
        std::path::Path::new("/proc").join(link)
    }

    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let start = std::time::Instant::now();
        while !cond() {
            assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_build_thread_lives_exactly_as_long_as_the_lease() {
        let kept: Arc<Mutex<Option<HeapLease>>> = Arc::default();
        let slot = Arc::clone(&kept);
        let builder = Arc::new(Mutex::new(None));
        let seen = Arc::clone(&builder);
        build_on_own_heap(move |lease| {
            let name = std::thread::current().name().map(str::to_owned);
            *seen.lock().unwrap() = Some((name, own_task()));
            *slot.lock().unwrap() = Some(lease);
        });
        // Returned after the build ran, on a thread of its own.
        let (name, task) = builder.lock().unwrap().take().expect("the build ran before the call returned");
        assert_eq!(name.as_deref(), Some("baton-build"));
        assert!(task.exists(), "the build thread ended while its lease was held");
        drop(kept.lock().unwrap().take());
        wait_for("the build thread to end after its lease was dropped", || !task.exists());
    }
}
