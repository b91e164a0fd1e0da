//! The registry's agent: one thread at serving priority that applies what
//! the threads loading and freeing versions ask for.
//!
//! Registry state is read by serving threads (status, metrics, the event
//! stream), so a lowered thread must not hold the locks around it
//! ([`crate::threads::sync`]). Loading and freeing threads therefore send each such
//! change to the agent as a job — a state transition, the end of a busy
//! spell, a recorded outcome, an event, a log line, a commit and the start
//! of its drain, the memory book's updates — and the agent runs the jobs one
//! at a time, in the order they were sent. `Registry::new` starts it on the
//! calling thread, whose priority it keeps.

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::threads::sync;

type Job = Box<dyn FnOnce() + Send>;

/// The sending side of the agent; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Agent {
    jobs: sync::Sender<Job>,
}

impl Agent {
    /// Starts the agent thread, `baton-registry`, at the calling thread's
    /// priority. It ends when every `Agent` is gone.
    pub(crate) fn start() -> Agent {
        sync::expect_serving_priority();
        let jobs = sync::spawn_receiver::<Job>("baton-registry", |jobs| {
            while let Some(job) = jobs.recv() {
                if let Err(payload) = catch_unwind(AssertUnwindSafe(job)) {
                    let message = panic_message(payload.as_ref());
                    tracing::error!(%message, "A registry job panicked; the registry carries on.");
                }
            }
        })
        .expect("spawning the registry's agent thread");
        Agent { jobs }
    }

    /// Runs `job` on the agent, after every job sent before it. (Were the
    /// agent gone, it would run here; it lives as long as any sender.)
    pub(crate) fn send(&self, job: impl FnOnce() + Send + 'static) {
        if let Err(job) = self.jobs.send(Box::new(job)) {
            job();
        }
    }

    /// Runs `work` on the agent and waits for its result. Panics if `work`
    /// panicked.
    pub(crate) fn call<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        let (answer, result) = sync::channel_here();
        self.send(move || {
            let _ = answer.send(work());
        });
        result.recv().expect("a job run on the registry's agent panicked")
    }
}

thread_local! {
    /// The agent of the registry whose loading or freeing this thread does.
    static HERE: RefCell<Option<Agent>> = const { RefCell::new(None) };
}

/// Runs `work` at serving priority. On a thread that loads or frees
/// versions for a registry, that is on the registry's agent, after what the
/// thread sent it before; on any other thread, now.
///
/// For what code running on a loading thread, a backend's included, must not
/// do there: log (the log writer's lock is shared with serving threads), or
/// take any lock serving threads take.
pub fn at_serving_priority(work: impl FnOnce() + Send + 'static) {
    match HERE.try_with(|here| here.borrow().clone()).ok().flatten() {
        Some(agent) => agent.send(work),
        None => work(),
    }
}

/// Lowers the calling thread to do loading or freeing work for the registry
/// whose agent is `agent`: its priority ([`crate::threads::sys::lower_current_thread`]),
/// and the agent its logging and state changes go to. What could not be
/// lowered is reported through the agent.
pub(crate) fn lower_current_thread(agent: &Agent, nice: i32, idle: bool) {
    HERE.with_borrow_mut(|here| *here = Some(agent.clone()));
    if let Err(error) = crate::threads::sys::lower_current_thread(nice, idle) {
        let error = error.to_string();
        agent.send(move || {
            tracing::warn!(%error, nice, idle, "Could not fully lower a loading thread's priority; loading will compete with serving.");
        });
    }
}

/// What a thread that core code starts takes over from the thread that
/// started it, as it inherits its priority: whether it is lowered, and its
/// agent.
#[derive(Debug)]
pub(crate) struct Inherited {
    lowered: bool,
    agent: Option<Agent>,
}

impl Inherited {
    /// The calling thread's.
    pub(crate) fn here() -> Inherited {
        Inherited {
            lowered: crate::threads::sys::current_thread_lowered(),
            agent: HERE.try_with(|here| here.borrow().clone()).ok().flatten(),
        }
    }

    /// Takes it over on the calling thread, a new one.
    pub(crate) fn adopt(self) {
        if self.lowered {
            crate::threads::sys::mark_current_thread_lowered();
        }
        HERE.with_borrow_mut(|here| *here = self.agent);
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_in_order_on_the_agent_thread_and_a_panic_does_not_stop_it() {
        let agent = Agent::start();
        agent.send(|| panic!("a job that panics on purpose"));
        let (first, second) = (agent.call(|| 1), agent.call(|| std::thread::current().name().map(str::to_owned)));
        assert_eq!(first, 1);
        assert_eq!(second.as_deref(), Some("baton-registry"));
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        for i in 0..100 {
            let order = std::sync::Arc::clone(&order);
            agent.send(move || order.lock().unwrap().push(i));
        }
        let seen = agent.call(move || order.lock().unwrap().clone());
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn work_for_serving_priority_goes_to_the_agent_from_a_lowered_thread_and_runs_in_place_elsewhere() {
        let agent = Agent::start();
        let where_ran = |agent: Option<Agent>| {
            std::thread::spawn(move || {
                if let Some(agent) = &agent {
                    lower_current_thread(agent, 19, true);
                }
                let (tx, rx) = sync::channel_here();
                at_serving_priority(move || {
                    let _ = tx.send(std::thread::current().name().map(str::to_owned));
                });
                rx.recv().flatten()
            })
            .join()
            .unwrap()
        };
        assert_eq!(where_ran(Some(agent)).as_deref(), Some("baton-registry"));
        assert_eq!(where_ran(None), None, "an unnamed test thread ran it itself");
    }

    #[test]
    fn a_thread_started_from_a_lowered_one_inherits_its_mark_and_agent() {
        let agent = Agent::start();
        let (lowered, agent_known) = std::thread::spawn(move || {
            lower_current_thread(&agent, 19, true);
            let inherited = Inherited::here();
            std::thread::spawn(move || {
                inherited.adopt();
                (crate::threads::sys::current_thread_lowered(), HERE.with_borrow(Option::is_some))
            })
            .join()
            .unwrap()
        })
        .join()
        .unwrap();
        assert!(lowered && agent_known);
        assert!(!Inherited::here().lowered, "the test thread is not lowered");
    }
}
