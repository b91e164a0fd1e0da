//! glibc's `malloc_trim`, run for loading and releasing threads on a thread
//! that keeps serving priority.
//!
//! Memory accounting trims the C heap before it reads RSS
//! ([`crate::threads::sys::trimmed_rss`]), four times per swap. `malloc_trim` takes
//! every allocator arena's lock in turn, serving threads' own among them;
//! run on a lowered thread, it could be preempted holding one, and a serving
//! thread that needed that arena waited until the trim got a CPU back. So
//! the trims run on a thread of their own, started with the memory book by
//! the thread that builds the registry, at that thread's priority, and the
//! caller waits for the answer. What this removed, measured:
//! docs/benchmarks-notebook.md §2, "Trims at serving priority".

use crate::threads::sync;

type Job = Box<dyn FnOnce() + Send>;

/// A thread that runs heap trims when asked, at the priority of the thread
/// that started it; it ends when the `Trimmer` is dropped.
pub(crate) struct Trimmer {
    /// `None` when the thread could not be started: work then runs on the caller.
    jobs: Option<sync::Sender<Job>>,
}

impl Trimmer {
    /// Starts the thread. It keeps the calling thread's scheduling policy
    /// and nice value, so call this from a thread at serving priority.
    pub(crate) fn start() -> Trimmer {
        let spawned = sync::spawn_receiver::<Job>("baton-trim", |queue| {
            while let Some(job) = queue.recv() {
                job();
            }
        });
        match spawned {
            Ok(jobs) => Trimmer { jobs: Some(jobs) },
            Err(error) => {
                tracing::warn!(%error, "Could not start the heap trimmer; loading threads trim the heap themselves.");
                Trimmer { jobs: None }
            }
        }
    }

    /// [`crate::threads::sys::trimmed_rss`] on the trimmer thread: the memory this
    /// process really holds now.
    pub(crate) fn trimmed_rss(&self) -> Option<u64> {
        self.run(crate::threads::sys::trimmed_rss)
    }

    /// Runs `work` on the trimmer thread and waits for its result; on the
    /// calling thread if the trimmer is gone.
    fn run<T: Send + 'static>(&self, work: fn() -> T) -> T {
        if let Some(jobs) = &self.jobs {
            let (answer, result) = sync::channel_here();
            let job: Job = Box::new(move || {
                let _ = answer.send(work());
            });
            if jobs.send(job).is_ok()
                && let Some(value) = result.recv()
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
    #[cfg(target_os = "linux")]
    fn priority() -> (i32, i32) {
        let policy = crate::threads::sys::current_thread_policy().expect("policy readable");
        (policy, crate::threads::sys::current_thread_nice().expect("nice readable"))
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn trims_run_at_the_starting_threads_priority_not_the_callers() {
        let trimmer = Trimmer::start();
        let starter = priority();
        let (caller, on_trimmer) = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let _ = crate::threads::sys::lower_current_thread(19, true);
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
