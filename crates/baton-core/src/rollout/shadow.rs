//! Shadow copies run below serving: a thread of each shadow rollout, at the
//! loader's priority (nice 19 and, by default, `SCHED_IDLE`), runs the
//! candidate on the copies of the requests chosen for shadowing, one at a
//! time, timed as a session thread times its runs. Serving threads get a core
//! before it does; under sustained full load the copies wait, the queue
//! fills and further copies are dropped and counted rather than taking
//! CPU from answers.
//!
//! A lowered thread takes no lock serving threads take, so what a copy
//! came to (its engine time, its outputs' comparison) is recorded by the
//! registry's agent, and the runner hands its reference to the candidate
//! to the agent too when it ends, so that the version is never freed on
//! it.
//!
//! The runner stops with its rollout: once the candidate leaves the route
//! or becomes stable, the copies still queued are dropped unrun, so that
//! no idle-priority thread keeps running what is now the stable version's
//! sessions.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::window::Observations;
use super::{Role, Slot, record_copy};
use crate::run::version::Version;
use crate::tensors::tensor::Tensor;
use crate::threads::agent::Agent;
use crate::threads::sync::Sender;

/// One copy for the runner: the request's inputs, the answer stable gave
/// (`None` when it failed), and its room in the rollout's gate.
pub(crate) struct Job {
    pub(crate) inputs: Vec<Tensor>,
    pub(crate) answered: Option<Vec<Tensor>>,
    pub(crate) slot: Slot,
}

/// The queue of a shadow rollout's runner. The runner ends once every
/// table holding the rollout is gone.
#[derive(Clone)]
pub struct Shadow {
    tx: Sender<Job>,
    stopped: Arc<AtomicBool>,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadow").finish_non_exhaustive()
    }
}

impl Shadow {
    /// Starts the runner of `candidate`'s copies, lowered to `nice` (and
    /// `SCHED_IDLE` with `idle`). Call it at serving priority.
    pub(crate) fn start(
        candidate: Arc<Version>,
        observations: Arc<Observations>,
        agent: Agent,
        nice: i32,
        idle: bool,
    ) -> std::io::Result<Shadow> {
        let stopped = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&stopped);
        let tx = crate::threads::sync::spawn_receiver::<Job>("baton-shadow", move |jobs| {
            crate::threads::agent::lower_current_thread(&agent, nice, idle);
            while let Some(job) = jobs.recv() {
                if seen.load(Ordering::Acquire) {
                    // The rollout ended: dropped unrun.
                    continue;
                }
                let (outcome, ran) = candidate.run_here(&job.inputs);
                let observations = Arc::clone(&observations);
                let Job { answered, slot, .. } = job;
                drop(slot);
                agent.send(move || record_copy(&observations, Role::Candidate, answered.as_deref(), outcome, ran));
            }
            // The version is let go of at serving priority.
            agent.send(move || drop(candidate));
        })?;
        Ok(Shadow { tx, stopped })
    }

    /// Stops running copies: the rollout's candidate left the route or
    /// became stable. Copies queued now are dropped unrun.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// Queues a copy; gives it back when the runner is gone.
    pub(crate) fn send(&self, job: Job) -> Result<(), Job> {
        self.tx.send(job)
    }
}
