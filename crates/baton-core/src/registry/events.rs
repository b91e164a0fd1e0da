//! Model states, load stages and the events that report every transition.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::run::backend::{UpdateKind, UpdateReason};

/// The state of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    /// Nothing loaded, nothing happening.
    Idle,
    /// A candidate is being fetched, verified, loaded or validated.
    Loading,
    /// A candidate is warming up.
    Warming,
    /// The routing table is being switched.
    Swapping,
    /// A version serves and nothing is happening.
    Ready,
    /// The last operation failed; see the model's status for the stage and reason.
    Failed,
    /// Waiting for requests pinned to a replaced version to finish.
    Draining,
}

impl State {
    /// Upper-case name, as in responses and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Idle => "IDLE",
            State::Loading => "LOADING",
            State::Warming => "WARMING",
            State::Swapping => "SWAPPING",
            State::Ready => "READY",
            State::Failed => "FAILED",
            State::Draining => "DRAINING",
        }
    }
}

/// A stage of the load transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Read and parse the model's `model.toml`.
    Config,
    /// Bring the version's files to a local directory.
    Fetch,
    /// Check every file against the manifest.
    Verify,
    /// Under the resource swap policy: wait for the versions being replaced
    /// to finish their requests and be freed, before the candidate loads.
    Vacate,
    /// Create the engine's runnable model.
    Load,
    /// Check tensors and the signature.
    Validate,
    /// Run representative inputs.
    Warmup,
    /// Publish the new routing table with one store.
    Commit,
    /// Wait for requests pinned to the previous table.
    Drain,
    /// Free a version and measure what came back.
    Unload,
    /// During a rollout's start: load a twin of the stable version, which
    /// runs the paired comparison copies.
    Twin,
}

impl Stage {
    /// Lower-case name, as in metrics labels and error kinds.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Config => "config",
            Stage::Fetch => "fetch",
            Stage::Verify => "verify",
            Stage::Vacate => "vacate",
            Stage::Load => "load",
            Stage::Validate => "validate",
            Stage::Warmup => "warmup",
            Stage::Commit => "commit",
            Stage::Drain => "drain",
            Stage::Unload => "unload",
            Stage::Twin => "twin",
        }
    }

    /// The model state while this stage runs.
    pub fn state(self) -> State {
        match self {
            Stage::Config | Stage::Fetch | Stage::Verify | Stage::Load | Stage::Validate | Stage::Twin => {
                State::Loading
            }
            Stage::Warmup => State::Warming,
            Stage::Commit => State::Swapping,
            Stage::Vacate | Stage::Drain | Stage::Unload => State::Draining,
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long one stage took.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StageTiming {
    /// The stage.
    pub stage: Stage,
    /// Its wall-clock duration.
    #[serde(serialize_with = "ser_ms")]
    pub duration: Duration,
}

pub(crate) fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

fn ser_opt_ms<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => ser_ms(d, s),
        None => s.serialize_none(),
    }
}

/// What an operation on a model was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// A new version through the whole load transaction.
    Load,
    /// Back to the previous version, by pointer store.
    Rollback,
    /// The model taken out of service.
    Unload,
    /// A kept previous version dropped from the routing table.
    Retire,
    /// A version through the whole load transaction, then kept beside the
    /// stable version for rollback, without serving: how a new process
    /// of an upgrade takes over the old one's kept versions.
    Keep,
    /// A candidate through the whole load transaction, then into a rollout
    /// beside the stable version.
    Rollout,
    /// A rollout's candidate made stable, by pointer store.
    Promote,
    /// A rollout's candidate taken out of traffic, by pointer store.
    Abort,
}

impl Operation {
    /// Lower-case name, as in the status and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Load => "load",
            Operation::Rollback => "rollback",
            Operation::Unload => "unload",
            Operation::Retire => "retire",
            Operation::Keep => "keep",
            Operation::Rollout => "rollout",
            Operation::Promote => "promote",
            Operation::Abort => "abort",
        }
    }
}

/// How an operation that went through went.
#[derive(Clone, Debug, Serialize)]
pub struct LoadReport {
    /// Model name.
    pub model: String,
    /// What was done.
    pub operation: Operation,
    /// The version serving afterwards (`None` after an unload).
    pub version: Option<u64>,
    /// The version serving before.
    pub replaced: Option<u64>,
    /// Each stage and its duration, in order.
    pub stages: Vec<StageTiming>,
    /// From the request to the end of drain.
    #[serde(serialize_with = "ser_ms")]
    pub total: Duration,
    /// Memory the new version holds (measured RSS growth across its load).
    pub bytes_held: u64,
    /// Which kind of update the loaded version was (`weights`, `graph`,
    /// `runtime` or `processing`), when the operation loaded one.
    pub update: Option<UpdateKind>,
    /// Why it was that kind (`weights_only`, `new_graph`,
    /// `runtime_library`, `operator_choice` or `processing_only`).
    pub update_reason: Option<UpdateReason>,
    /// Requests still pinned to the old routing table when the drain gave up.
    pub stragglers: usize,
    /// Whether the drain timed out.
    pub drain_timed_out: bool,
    /// Under the resource swap policy: how long the model had no version
    /// serving, from the pause (once the candidate was verified) to the
    /// commit; requests waited meanwhile. In milliseconds; `null` when
    /// nothing paused.
    #[serde(rename = "paused_ms", serialize_with = "ser_opt_ms")]
    pub paused: Option<Duration>,
    /// When it finished (its drain ended), in seconds since the Unix epoch.
    #[serde(serialize_with = "ser_time")]
    pub finished_at: SystemTime,
}

impl LoadReport {
    /// The duration of a stage, if it ran.
    pub fn stage(&self, stage: Stage) -> Option<Duration> {
        self.stages.iter().find(|s| s.stage == stage).map(|s| s.duration)
    }
}

/// Something that happened to a model.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// Model name.
    pub model: String,
    /// The version concerned, when there is one.
    pub version: Option<u64>,
    /// When it happened.
    #[serde(serialize_with = "ser_time")]
    pub at: SystemTime,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

pub(crate) fn ser_time<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    s.serialize_f64(since.as_secs_f64())
}

/// The kinds of event.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// The model moved from one state to another. `stages` holds the stage
    /// durations of the running operation so far.
    Transition {
        /// Previous state.
        from: State,
        /// New state.
        to: State,
        /// Stages finished so far in this operation.
        stages: Vec<StageTiming>,
    },
    /// A stage failed; the active version is untouched.
    Failed {
        /// The stage.
        stage: Stage,
        /// Stable error kind.
        kind: String,
        /// What went wrong.
        message: String,
    },
    /// The drain timed out with requests still pinned to the old state.
    DrainTimedOut {
        /// Requests still holding the old routing table.
        stragglers: usize,
    },
    /// Under the resource swap policy, the model stopped serving so that
    /// its old version could be freed before the new one loads; requests
    /// wait.
    Paused {
        /// The version leaving memory.
        replacing: u64,
    },
    /// The pause ended: the new version serves, or the old one was loaded
    /// back after the new one failed (or, when that failed too, nothing
    /// serves).
    Resumed {
        /// How long requests had no version, in milliseconds.
        #[serde(rename = "paused_ms", serialize_with = "ser_ms")]
        paused: Duration,
        /// The version serving now, if any.
        serving: Option<u64>,
        /// Whether it is the old version, loaded back.
        restored: bool,
    },
    /// An operation went through, drain included.
    Finished {
        /// Its report.
        report: LoadReport,
    },
    /// A version was freed and the memory returned measured.
    Unloaded {
        /// Bytes the version held, as measured when it loaded.
        held: u64,
        /// Bytes the process gave back when it was freed.
        returned: u64,
        /// Growth of the memory no live version accounts for since the
        /// previous free: what this swap cycle left behind (see
        /// [`crate::registry::UnloadRecord::residual`]).
        residual: i64,
        /// RSS after the free minus the footprint of every live version.
        unaccounted: u64,
        /// For a version that ran in a worker process: the process, what it
        /// held just before it exited, and whether it is gone.
        #[serde(skip_serializing_if = "Option::is_none")]
        worker: Option<crate::registry::memory::WorkerFreed>,
        /// Whether it was a rollout's twin of the stable version, which
        /// goes on serving.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        twin: bool,
    },
    /// An operator's decision about what a model serves (a rollback, the
    /// load of an older version, an unload, a pin) was recorded, or ended.
    /// The front end that keeps such decisions says what they are; the core
    /// only carries the news.
    Decision {
        /// `recorded`, `removed` (by the operator), `superseded` (a newer
        /// version was published) or `dropped` (it could not be restored).
        change: String,
        /// `rollback`, `load`, `unload` or `pin`.
        decision: String,
        /// For a decision other than a pin: it holds until a version newer
        /// than this one is published.
        yields_to: Option<u64>,
        /// What happened, for people.
        message: String,
    },
    /// The object store a remote repository lives in answered differently
    /// from before: it failed (how), or it answers again. Such an event is
    /// about the repository, not a model: its `model` is empty.
    Store {
        /// Whether the store's last listing succeeded.
        ok: bool,
        /// `ok`, or the failure's stable kind (`store_denied`,
        /// `store_not_found`, `store_unreachable`, `store_throttled`, …).
        kind: String,
        /// What the store answered; empty when `ok`.
        message: String,
    },
    /// A version directory of the repository has no MANIFEST, so it is not
    /// loaded: it was copied in without `baton package`. Said once per
    /// directory, not at every poll.
    Unpackaged {
        /// The directory.
        dir: String,
        /// What to do about it, for people.
        message: String,
    },
    /// A version's engine ended by itself: the worker process it ran in was
    /// killed, aborted or ran out of memory. Its requests fail at once
    /// until the server has acted.
    Exited {
        /// How the process ended.
        reason: String,
        /// What the server did about it: `rolled_back` to the kept previous
        /// version, `restarting` the version, `retired` (a kept previous
        /// version), `aborted` (a rollout's candidate), `gave_up` (after
        /// the last restart failed), or `none` (it no longer served).
        action: String,
    },
    /// A rollout's controller or an operator decided: a start, a step, a
    /// hold, a pause, a promotion, a rollback. It carries the measured
    /// values, the thresholds and the sample counts it was decided on.
    Rollout {
        /// The decision, as the model's status records it.
        decision: Box<crate::rollout::control::Decision>,
    },
}

impl EventKind {
    /// A rollout decision: what was decided, by whom, on which values.
    pub fn rollout(decision: crate::rollout::control::Decision) -> EventKind {
        EventKind::Rollout { decision: Box::new(decision) }
    }
}

/// Receiving end of the event stream.
pub type EventReceiver = tokio::sync::broadcast::Receiver<Event>;
/// Sending end of the event stream.
pub type EventSender = tokio::sync::broadcast::Sender<Event>;
