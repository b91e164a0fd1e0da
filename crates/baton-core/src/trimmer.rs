//! glibc's `malloc_trim`, run for loading and releasing threads on a thread
//! that keeps serving priority.
//!
//! Memory accounting trims the C heap before it reads RSS
//! ([`crate::sys::trimmed_rss`]): before and after each load, and before
//! and after each free, four times per swap. `malloc_trim` takes every
//! allocator arena's lock in turn, serving threads' own among them, while
//! it walks that arena's free chunks and returns their pages. Called on a
//! loading or releasing thread it ran under `SCHED_IDLE`, and a serving
//! thread that needed an arena the trim held waited until the trim got a
//! CPU back — which, while other threads want every CPU, a `SCHED_IDLE`
//! thread does not get. In 40-swap drills of the MLP under full load, with
//! every request recorded and a real-time probe on each CPU
//! (docs/benchmarks-notebook.md §2, "Trims at serving priority"), every
//! request of 5 ms or more in steady time ran while a CPU was stopped, but
//! 7 of 19 in swap windows (up to 41 ms) overlapped no stop; they started
//! about 0.1 s after a load's trigger (its first trim, after verification)
//! or ended within 90 ms of its commit (its last trim, then the free of the
//! version it replaced two loads before).
//!
//! So the trims run on a thread of their own, started with the memory book
//! by the thread that builds the registry, at that thread's priority, and
//! the caller waits for the answer. Held by a thread at serving priority,
//! an arena lock is held for as long as the trim works on that arena. In
//! three drills alternated with three of the old code, requests over 8 ms
//! that no stop explained went from 1, 7 and 1 to 0, 1 and 0.

use std::sync::mpsc;

type Job = Box<dyn FnOnce() + Send>;

/// A thread that runs heap trims when asked, at the priority of the thread
/// that started it; it ends when the `Trimmer` is dropped.
pub(crate) struct Trimmer {
    /// `None` when the thread could not be started: work then runs on the caller.
    jobs: Option<mpsc::Sender<Job>>,
}

impl Trimmer {
    /// Starts the thread. It keeps the calling thread's scheduling policy
    /// and nice value, so call this from a thread at serving priority.
    pub(crate) fn start() -> Trimmer {
        let (jobs, queue) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new().name("baton-trim".into()).spawn(move || {
            for job in queue {
                job();
            }
        });
        match spawned {
            Ok(_) => Trimmer { jobs: Some(jobs) },
            Err(error) => {
                tracing::warn!(%error, "Could not start the heap trimmer; loading threads trim the heap themselves.");
                Trimmer { jobs: None }
            }
        }
    }

    /// [`crate::sys::trimmed_rss`] on the trimmer thread: the memory this
    /// process really holds now.
    pub(crate) fn trimmed_rss(&self) -> Option<u64> {
        self.run(crate::sys::trimmed_rss)
    }

    /// Runs `work` on the trimmer thread and waits for its result; on the
    /// calling thread if the trimmer is gone.
    fn run<T: Send + 'static>(&self, work: fn() -> T) -> T {
        if let Some(jobs) = &self.jobs {
            let (answer, result) = mpsc::sync_channel(1);
            let job: Job = Box::new(move || {
                let _ = answer.send(work());
            });
            if jobs.send(job).is_ok()
                && let Ok(value) = result.recv()
            {
                return value;
            }
        }
        work()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's scheduling policy and nice value.
    fn priority() -> (i32, i32) {
        let policy = crate::sys::current_thread_policy().expect("policy readable");
        (policy, crate::sys::current_thread_nice().expect("nice readable"))
    }

    #[test]
    fn trims_run_at_the_starting_threads_priority_not_the_callers() {
        let trimmer = Trimmer::start();
        let starter = priority();
        let (caller, on_trimmer) = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    crate::sys::lower_current_thread(19, true);
                    (priority(), trimmer.run(priority))
                })
                .join()
                .expect("the lowered thread ran")
        });
        assert_eq!(caller, (libc::SCHED_IDLE, 19), "the calling thread was lowered");
        assert_eq!(on_trimmer, starter, "the work ran at the priority of the thread that started the trimmer");
    }

    #[test]
    fn trimmed_rss_answers_through_the_thread_and_without_one() {
        let trimmer = Trimmer::start();
        assert!(trimmer.trimmed_rss().is_some_and(|rss| rss > 0));
        let without = Trimmer { jobs: None };
        assert!(without.trimmed_rss().is_some_and(|rss| rss > 0));
    }
}
