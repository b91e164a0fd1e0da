//! Safe rollouts inside one server: a model's stable version and at most
//! one candidate, in one of three modes, with guards that promote or roll
//! back by themselves.
//!
//! What a request needs to pick its version (the candidate, the mode, the
//! weight) lives in the routing table, in the one snapshot the request
//! takes ([`Rollout`] in [`crate::registry::routing::ModelRoute`]); a change of
//! weight is one store. What the controller needs to decide (the plan, the
//! step reached, the decisions so far) lives beside it, in the registry
//! ([`control`]). What requests observe (latency, errors, the comparison of
//! outputs) goes into [`window::Observations`], shared by every table of
//! the rollout, which the controller reads one window at a time and judges
//! with [`guard::evaluate`].

pub mod assign;
pub mod compare;
pub mod control;
pub mod guard;
pub mod metric;
pub mod outcome;
pub mod plan;
pub mod promql;
pub mod shadow;
pub mod window;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use serde::{Deserialize, Serialize};

use crate::files::rollout_spec::Mode;
use crate::run::error::InferError;
use crate::run::executor::Pending;
use crate::run::version::Version;
use crate::tensors::tensor::Tensor;

/// The part a version plays for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The stable version.
    Stable,
    /// The candidate of a rollout.
    Candidate,
    /// A version kept for rollback, named by the request.
    Previous,
}

impl Role {
    /// The name used in responses and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Stable => "stable",
            Role::Candidate => "candidate",
            Role::Previous => "previous",
        }
    }
}

/// Weights are in basis points: 10 000 is all of the traffic.
pub const FULL: u32 = 10_000;

/// The rollout part of a model's route: what a request needs to pick its
/// version. Cheap to clone; a new weight is a new table with a clone of
/// this and another `weight`.
#[derive(Clone, Debug)]
pub struct Rollout {
    /// The rollout's identity, which its outcome ids are bound to: a
    /// fleet's rollout id, or a random number drawn when it started. A
    /// later rollout of the same candidate has another.
    pub id: u64,
    /// The version being rolled out.
    pub candidate: Arc<Version>,
    /// How it takes part in traffic.
    pub mode: Mode,
    /// Its share, in basis points: of the answered requests in canary and
    /// A/B modes, of the stable requests copied to it in shadow mode.
    pub weight: u32,
    /// What salts the sticky keys' buckets ([`assign::salt`]).
    pub salt: u64,
    /// The outcome ids its answers carry, and those already posted.
    pub outcomes: Arc<outcome::Outcomes>,
    /// Whether requests the candidate answers are also run on the stable
    /// version, off the response path, to compare outputs (canary and A/B
    /// modes).
    pub paired: bool,
    /// What requests observe, shared by every table of this rollout.
    pub observations: Arc<window::Observations>,
    /// Comparison copies running now, and how many may.
    pub copies: Arc<CopyGate>,
    /// In shadow mode, the lowered runner of the candidate's copies.
    pub shadow: Option<shadow::Shadow>,
    /// During the watch after promotion: the version that served before,
    /// kept as previous. The candidate is then the stable version and
    /// answers everything; paired copies go to this version, whose answers
    /// are the windows' baseline.
    pub baseline: Option<Arc<Version>>,
    /// A twin of the stable version, loaded for this rollout from the same
    /// files with weights of its own: paired copies run on it, not on the
    /// stable version, and only its runs time the stable side. It runs
    /// what the candidate runs and nothing else, so its weights are as
    /// cold in the cache as the candidate's at any share; the stable
    /// version, answering the rest, runs warm, and compared with it an
    /// identical candidate at a small share reads slower than it is.
    pub twin: Option<Arc<Version>>,
}

impl Rollout {
    /// The version a paired copy of a request the candidate answered runs
    /// on: the twin when the rollout has one, else `stable`.
    pub fn paired_with<'a>(&'a self, stable: &'a Arc<Version>) -> &'a Arc<Version> {
        self.twin.as_ref().unwrap_or(stable)
    }
}

impl Rollout {
    /// Drops the shadow copies still queued, once the candidate leaves the
    /// route or becomes stable: they would run on what is no longer a
    /// candidate.
    pub(crate) fn stop_shadow(&self) {
        if let Some(shadow) = &self.shadow {
            shadow.stop();
        }
    }
}

/// Bounds the comparison copies of one rollout that run at once.
#[derive(Debug)]
pub struct CopyGate {
    running: AtomicUsize,
    limit: usize,
}

impl CopyGate {
    /// A gate letting `limit` copies run at once.
    pub fn new(limit: usize) -> CopyGate {
        CopyGate { running: AtomicUsize::new(0), limit: limit.max(1) }
    }

    /// Copies running now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }
}

/// A comparison copy on its way: the other side's answer to await, and
/// the room it holds in the gate until dropped.
pub struct Copy {
    /// The other side's answer.
    pub pending: Pending,
    /// The role of the version running the copy.
    pub role: Role,
    /// Where to record what it came to.
    pub observations: Arc<window::Observations>,
    /// The rollout's twin, when it runs the copy: a copy it failed because
    /// its engine ended is no sample of the stable version.
    twin: Option<Weak<Version>>,
    _slot: Slot,
}

/// A copy's room in its gate, given back on drop.
pub(crate) struct Slot(Arc<CopyGate>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Copy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copy").field("role", &self.role).finish_non_exhaustive()
    }
}

/// The other side of a request that is compared: the version that runs
/// its copy, and in which role.
#[derive(Clone, Copy, Debug)]
pub struct Compare<'a> {
    /// The rollout.
    pub rollout: &'a Rollout,
    /// The version that runs the copy: the candidate in shadow mode, the
    /// stable version for a paired request the candidate answered.
    pub other: &'a Arc<Version>,
    /// Its role.
    pub role: Role,
}

impl Compare<'_> {
    /// Starts the copy of a request on the other side, off the response
    /// path, given the answer the request got (`None` when it failed: the
    /// copy still gives the other side a sample, so that a candidate that
    /// fails where stable answers is judged even when stable answers
    /// nothing else, at 100 % or during the watch after promotion). Only
    /// while fewer than the plan's `queue` copies run; otherwise the copy
    /// is dropped and counted.
    ///
    /// - A shadow copy goes to the rollout's lowered runner
    ///   ([`shadow`]), which records what it came to itself: `None`.
    /// - A paired copy runs on the stable version only when it has an
    ///   instance free and nobody waiting, and takes that instance in the
    ///   same step, so that it never holds up a request and never waits in
    ///   a queue (else it is dropped and counted). It never runs on the
    ///   calling thread. The caller awaits [`Copy::pending`] apart from the
    ///   answer and records what it came to with [`Copy::finish`].
    pub fn start(&self, inputs: Vec<Tensor>, answered: Option<&[Tensor]>) -> Option<Copy> {
        let gate = &self.rollout.copies;
        if gate.running.fetch_add(1, Ordering::Relaxed) >= gate.limit {
            gate.running.fetch_sub(1, Ordering::Relaxed);
            self.rollout.observations.record_dropped();
            return None;
        }
        let slot = Slot(Arc::clone(gate));
        // A twin whose engine ended runs nothing until it leaves the route.
        if self.other.is_twin() && !self.other.alive() {
            drop(slot);
            self.rollout.observations.record_dropped();
            return None;
        }
        if let (Role::Candidate, Some(shadow)) = (self.role, &self.rollout.shadow) {
            let job = shadow::Job { inputs, answered: answered.map(<[Tensor]>::to_vec), slot };
            if shadow.send(job).is_err() {
                self.rollout.observations.record_dropped();
            }
            return None;
        }
        match self.other.submit_spare(inputs) {
            Ok(pending) => Some(Copy {
                pending,
                role: self.role,
                observations: Arc::clone(&self.rollout.observations),
                twin: self.other.is_twin().then(|| Arc::downgrade(self.other)),
                _slot: slot,
            }),
            Err(_) => {
                drop(slot);
                self.rollout.observations.record_dropped();
                None
            }
        }
    }
}

impl Copy {
    /// Blocks until the copy is answered and records what it came to. For
    /// synchronous callers (tools, tests); an async task awaits
    /// [`Copy::pending`] instead.
    pub fn wait(self, answered: Option<&[Tensor]>) {
        let Copy { pending, role, observations, twin, _slot } = self;
        let (outcome, ran) = pending.wait_timed();
        record_run_copy(&observations, twin.as_ref(), role, answered, outcome, ran);
    }

    /// Records what the copy came to, once [`Copy::pending`] resolved, given
    /// the answer the request got (`answered`; `None` when it failed). Its
    /// engine time and failure count as its version's, in its role.
    pub fn finish(self, answered: Option<&[Tensor]>, outcome: Result<Vec<Tensor>, InferError>) {
        let ran = self.pending.engine_time();
        record_run_copy(&self.observations, self.twin.as_ref(), self.role, answered, outcome, ran);
    }
}

/// The kinds of failure by which an engine in a process of its own says
/// that process is ending: gone, hung past a call's deadline (and being
/// killed), or broke the protocol between them (and is killed).
pub const ENGINE_ENDING: [&str; 3] = ["worker_gone", "worker_timed_out", "worker_hop_broken"];

/// [`record_copy`] for a copy run on a version of the route, `twin` when
/// the rollout's twin ran it: the twin's end is the twin's, not the stable
/// version's, so a copy it failed once its engine ended, or because its
/// engine is ending (which it may not read as yet), counts as dropped.
fn record_run_copy(
    observations: &window::Observations,
    twin: Option<&Weak<Version>>,
    role: Role,
    answered: Option<&[Tensor]>,
    outcome: Result<Vec<Tensor>, InferError>,
    ran: Option<std::time::Duration>,
) {
    let ending = matches!(&outcome, Err(InferError::Backend(e)) if ENGINE_ENDING.contains(&e.kind));
    let twin_ended = twin.is_some_and(|twin| ending || twin.upgrade().is_none_or(|twin| !twin.alive()));
    if outcome.is_err() && twin_ended {
        observations.record_dropped();
        return;
    }
    record_copy(observations, role, answered, outcome, ran);
}

/// Records what a copy run by the version in `role` came to, given the
/// answer the request got (`None` when it failed): its engine time and
/// failure as that version's, and the comparison of the two answers when
/// both sides answered.
pub(crate) fn record_copy(
    observations: &window::Observations,
    role: Role,
    answered: Option<&[Tensor]>,
    outcome: Result<Vec<Tensor>, InferError>,
    ran: Option<std::time::Duration>,
) {
    // A copy counts as its version's request: a canary at 100 % still
    // gives the stable side of its windows samples. Its engine time is
    // measured as an answered request's is, on the thread that ran it.
    observations.record_copy_run(role, ran, outcome.is_err());
    match (role, answered, outcome) {
        (Role::Candidate, Some(answered), Ok(candidate)) => observations.record_comparison(answered, &candidate),
        (_, Some(answered), Ok(stable)) => observations.record_comparison(&stable, answered),
        _ => observations.record_comparison_error(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::backend::{BackendError, Model, Weight, WeightsError};
    use crate::run::version::VersionParts;
    use crate::tensors::signature::Signature;

    /// An engine that runs nothing and is alive throughout: the twin a
    /// copy ran on, in the moment after its worker was told to end.
    #[derive(Default)]
    struct Alive {
        signature: Signature,
    }

    impl Model for Alive {
        fn signature(&self) -> &Signature {
            &self.signature
        }

        fn visit_weights(&self, _: &mut dyn FnMut(&Weight<'_>) -> Result<(), String>) -> Result<(), WeightsError> {
            Ok(())
        }

        fn infer(&self, _: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            Err(BackendError::new("not_run", "this engine runs nothing"))
        }
    }

    fn twin() -> Arc<Version> {
        let parts = VersionParts {
            model: "m".to_owned(),
            number: 1,
            spec: Arc::new(crate::files::spec::ModelSpec::parse("").unwrap()),
            manifest: crate::files::manifest::Manifest::default(),
            warmup: Vec::new(),
            warmed: crate::run::warmed::Warmed::default(),
            bytes_held: 0,
            engine: Box::new(Alive::default()),
            twin: true,
            heap: None,
        };
        Arc::new(Version::new(parts, None))
    }

    /// A copy the twin failed because its worker hung (the call's deadline
    /// passed, and the worker is being killed), broke the hop or is gone
    /// counts as dropped, even while the twin still reads as alive: the
    /// twin's end is the twin's, never the stable version's error. Any
    /// other failure is the stable side's.
    #[test]
    fn a_copy_the_twin_failed_as_its_worker_ends_counts_as_dropped_even_before_it_reads_as_ended() {
        let twin = twin();
        let weak = Arc::downgrade(&twin);
        let answered = [Tensor::from_f32("y", vec![1], &[1.0])];
        let observations = window::Observations::default();
        for kind in ["worker_timed_out", "worker_gone", "worker_hop_broken"] {
            let failed = Err(InferError::Backend(BackendError::new(kind, "the twin's worker")));
            record_run_copy(&observations, Some(&weak), Role::Stable, Some(&answered), failed, None);
        }
        let totals = observations.totals();
        assert_eq!((totals.dropped, totals.stable.errors), (3, 0), "{totals:?}");
        let failed = Err(InferError::Backend(BackendError::new("inference_failed", "the engine's own")));
        record_run_copy(&observations, Some(&weak), Role::Stable, Some(&answered), failed, None);
        let totals = observations.totals();
        assert_eq!((totals.dropped, totals.stable.errors), (3, 1), "{totals:?}");
    }
}
