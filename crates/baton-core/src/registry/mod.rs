//! The registry: owner of the routing table, the per-model state machine,
//! the loader thread and the event stream. Front ends (REST, gRPC, the
//! repository watcher) talk to baton through it.
//!
//! The top room of the core, with what only the registry uses: the
//! routing table ([`routing`]), the load transaction and the shorter
//! operations built from its stages ([`load`]), the memory budget
//! ([`budget`]) and accounting (`memory`), the gate of a resource swap
//! ([`pause`]) and the event stream ([`events`]).
//!
//! Its state is changed at serving priority only: by the operations its
//! callers start (taking a model's busy flag, a rollback's commit), and by
//! its agent ([`crate::threads::agent`]), which applies what the lowered loading and
//! freeing threads send it, in order. A load's handle resolves only once
//! the agent has applied the load's last state.

pub mod budget;
mod controller;
pub mod error;
pub mod events;
pub(crate) mod exits;
mod hold;
pub mod load;
pub(crate) mod memory;
pub mod pause;
pub mod routing;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio::sync::{broadcast, oneshot};

use crate::files::source::Source;
use crate::registry::error::LoadError;
use crate::registry::events::{Event, EventKind, EventReceiver, EventSender, Stage, StageTiming, State};
pub use crate::registry::events::{LoadReport, Operation};
use crate::registry::load::RolloutStart;
use crate::registry::memory::Memory;
pub use crate::registry::memory::{LiveVersion, UnloadRecord};
use crate::registry::pause::Pause;
use crate::registry::routing::{ModelRoute, Routing, Snapshot};
use crate::rollout::control::{Action, By, Ending, Phase, Progress, RolloutStatus};
use crate::rollout::metric::MetricSource;
use crate::rollout::outcome::{self, OutcomeKey, PostError, Posted};
use crate::rollout::window::Sums;
use crate::run::backend::Backend;
use crate::run::release::Releaser;
use crate::threads::agent::Agent;
use crate::threads::step_aside::StepAside;
use crate::threads::sync::{self, Lock};

/// Registry settings.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// Nice value of the loader and release threads (serving threads keep 0).
    pub loader_nice: i32,
    /// Whether the loader and release threads also run under `SCHED_IDLE`
    /// (the default). A serving thread that wakes on a core where the
    /// loader runs then gets the core at once, rather than after the
    /// loader's time slice; under sustained full load, loads wait for idle
    /// moments and take longer (docs/hot-swap.md, "Why `SCHED_IDLE` as well
    /// as nice 19").
    pub loader_idle: bool,
    /// Whether, and when, a thread that builds or frees a version steps off
    /// the CPU for threads waiting for one ([`StepAside`]). Off by default
    /// (docs/hot-swap.md, "Stepping aside").
    pub step_aside: StepAside,
    /// Events buffered per subscriber before a slow one starts missing some.
    pub event_capacity: usize,
    /// The most memory every model's live versions may hold together, in
    /// bytes; a load that would go beyond it is refused
    /// ([`crate::registry::budget`]). None by default.
    pub memory_budget: Option<u64>,
    /// Where the rollouts' metric guards are read (the operator's
    /// Prometheus). None by default: a rollout with metric guards is then
    /// refused.
    pub metric_source: Option<Arc<dyn MetricSource>>,
    /// The secret key rollouts' outcome ids are authenticated with
    /// ([`crate::rollout::outcome`]); random by default. A fleet's replicas
    /// share one, so that each takes the ids any of them issued.
    pub outcome_key: OutcomeKey,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            loader_nice: 19,
            loader_idle: true,
            step_aside: StepAside::OFF,
            event_capacity: 1024,
            memory_budget: None,
            metric_source: None,
            outcome_key: OutcomeKey::random().expect("random bytes for the outcome ids' key"),
        }
    }
}

/// The last failure of an operation on a model.
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    /// What was attempted.
    pub operation: Operation,
    /// The version it concerned, when known.
    pub version: Option<u64>,
    /// The stage that failed.
    pub stage: Option<Stage>,
    /// Stable kind, e.g. `verify_failed`.
    pub kind: &'static str,
    /// Finer reason, e.g. `digest_mismatch`.
    pub reason: &'static str,
    /// The full message.
    pub message: String,
    /// When it failed, in seconds since the Unix epoch.
    #[serde(serialize_with = "crate::registry::events::ser_time")]
    pub at: SystemTime,
}

/// A model's status.
#[derive(Clone, Debug, Serialize)]
pub struct ModelStatus {
    /// Model name.
    pub name: String,
    /// State machine position.
    pub state: State,
    /// The stable version, if one serves.
    pub serving: Option<u64>,
    /// Versions kept for rollback, newest first.
    pub previous: Vec<u64>,
    /// Every version still in memory, including ones being drained.
    pub live: Vec<LiveVersion>,
    /// Bytes that containers of packed weights shared by the live versions
    /// keep of versions that are gone (estimated): counted against the
    /// memory budgets, though no live version's `bytes_held` has them.
    pub retained: u64,
    /// Whether a load, rollback or unload is running.
    pub busy: bool,
    /// Whether the model is paused: under the resource swap policy, its old
    /// version is gone and requests wait for the new one.
    pub paused: bool,
    /// The version a running operation works on, once known.
    pub working_on: Option<u64>,
    /// The last operation that went through.
    pub last: Option<LoadReport>,
    /// The last failure.
    pub last_error: Option<Failure>,
    /// Versions whose last load failed, and how; a later successful load of
    /// a version clears its entry.
    pub failed_versions: BTreeMap<u64, Failure>,
    /// The rollout in progress, or else the last one that ended.
    pub rollout: Option<RolloutStatus>,
    /// What its versions' worker processes went through.
    pub workers: WorkerCounts,
}

/// Resolves when an operation has finished, drain included.
#[derive(Debug)]
pub struct LoadHandle {
    rx: oneshot::Receiver<Result<LoadReport, LoadError>>,
}

impl LoadHandle {
    /// Blocks until the operation finishes. Not for use inside an async task.
    pub fn wait(self) -> Result<LoadReport, LoadError> {
        self.rx.blocking_recv().unwrap_or(Err(LoadError::ShuttingDown))
    }

    /// Waits until the operation finishes.
    pub async fn finished(self) -> Result<LoadReport, LoadError> {
        self.rx.await.unwrap_or(Err(LoadError::ShuttingDown))
    }
}

pub(crate) type Reply = oneshot::Sender<Result<LoadReport, LoadError>>;
type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct ModelEntry {
    state: Option<State>,
    busy: bool,
    last: Option<LoadReport>,
    last_error: Option<Failure>,
    failed_versions: BTreeMap<u64, Failure>,
    working_on: Option<u64>,
    /// The last rollout that ended, as it ended.
    ended_rollout: Option<RolloutStatus>,
    /// Its versions' worker processes that ended by themselves, and the
    /// times one was loaded again in a new worker.
    workers: WorkerCounts,
}

/// What a model's worker processes went through since the server started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WorkerCounts {
    /// Workers that ended by themselves (killed, aborted, out of memory).
    pub exits: u64,
    /// Attempts to load an exited stable version again in a new worker.
    pub restarts: u64,
}

impl ModelEntry {
    /// Whether no operation has left anything here.
    fn is_blank(&self) -> bool {
        self.state.is_none()
            && self.last.is_none()
            && self.last_error.is_none()
            && self.failed_versions.is_empty()
            && self.workers == WorkerCounts::default()
    }
}

/// Shared by the registry handle, the loader, the agent and drain threads.
pub(crate) struct Inner {
    routing: ArcSwap<Routing>,
    publish: Lock<()>,
    models: Lock<BTreeMap<String, ModelEntry>>,
    /// Applies the changes lowered threads ask for.
    pub(crate) agent: Agent,
    pub(crate) events: EventSender,
    pub(crate) source: Arc<dyn Source>,
    pub(crate) backends: BTreeMap<String, Arc<dyn Backend>>,
    pub(crate) memory: Arc<Memory>,
    pub(crate) releaser: Releaser,
    /// The controller's state of each rollout in progress.
    pub(crate) rollouts: Lock<BTreeMap<String, Progress>>,
    /// Whether the controller holds its judgements, and those in flight
    /// (see [`Registry::hold_rollouts`]).
    pub(crate) hold: hold::Hold,
    /// The nice value, and whether `SCHED_IDLE`, of lowered threads.
    pub(crate) lowering: (i32, bool),
    pub(crate) step_aside: StepAside,
    /// The server's memory budget over every model's live versions.
    pub(crate) memory_budget: Option<u64>,
    /// Where metric guards are read.
    pub(crate) metric_source: Option<Arc<dyn MetricSource>>,
    /// What rollouts' outcome ids are authenticated with.
    pub(crate) outcome_key: OutcomeKey,
    /// Where versions report that their engine ended by itself.
    pub(crate) exits: std::sync::OnceLock<std::sync::mpsc::Sender<exits::Exit>>,
    /// Counts the operations that ended (busy flags released), so that a
    /// caller can wait for a model's to end ([`Registry::until_free`]).
    freed: tokio::sync::watch::Sender<u64>,
}

/// The model registry. Cheap to clone; all clones share one state.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
    jobs: sync::Sender<Job>,
}

impl Registry {
    /// A registry over `source`, loading with `backends`. Starts the loader
    /// and release threads at `config.loader_nice`, and the agent at the
    /// calling thread's priority: call it at serving priority.
    pub fn new(source: Arc<dyn Source>, backends: Vec<Arc<dyn Backend>>, config: RegistryConfig) -> Registry {
        crate::files::scratch::remove_stale(&std::env::temp_dir(), crate::files::copied::PREFIX);
        let agent = Agent::start();
        let (events, _) = broadcast::channel(config.event_capacity.max(1));
        let (memory, releaser) = Memory::start(events.clone(), agent.clone(), config.loader_nice, config.loader_idle);
        let (nice, idle) = (config.loader_nice, config.loader_idle);
        let loader_agent = agent.clone();
        let jobs = sync::spawn_receiver::<Job>("baton-loader", move |jobs| {
            crate::threads::agent::lower_current_thread(&loader_agent, nice, idle);
            drop(loader_agent);
            while let Some(job) = jobs.recv() {
                job();
            }
        })
        .expect("spawning the loader thread");
        let inner = Arc::new(Inner {
            routing: ArcSwap::from_pointee(Routing::new(0, BTreeMap::new())),
            publish: Lock::new(()),
            models: Lock::new(BTreeMap::new()),
            agent,
            events,
            source,
            backends: backends.into_iter().map(|b| (b.name().to_owned(), b)).collect(),
            memory,
            releaser,
            rollouts: Lock::new(BTreeMap::new()),
            hold: hold::Hold::default(),
            lowering: (nice, idle),
            step_aside: config.step_aside,
            memory_budget: config.memory_budget,
            metric_source: config.metric_source,
            outcome_key: config.outcome_key,
            exits: std::sync::OnceLock::new(),
            freed: tokio::sync::watch::channel(0).0,
        });
        controller::start_controller(&inner);
        exits::start(&inner, jobs.clone());
        Registry { inner, jobs }
    }

    /// Holds every rollout's judgements (`true`) or lets them go on: while
    /// held, a window that ends is not judged, so no rollout changes step;
    /// once released, the windows that ended meanwhile are judged at once,
    /// on numbers read then. For an upgrade: the new process takes the
    /// rollouts up where the state file left them, so this one must not
    /// move them meanwhile.
    ///
    /// Holding is a barrier: it returns once no judgement is in flight, and
    /// a judgement that began before it (its metric guards being read, say)
    /// is dropped rather than applied, so that nothing it decided lands
    /// after this returns. It blocks for as long as that judgement's
    /// reading lasts, at most the metric source's timeout (docs/rollout.md,
    /// "Holding rollouts"): call it where blocking is allowed, not on an
    /// async worker.
    pub fn hold_rollouts(&self, held: bool) {
        self.inner.hold.set(held);
    }

    /// Whether rollouts' judgements are held ([`Registry::hold_rollouts`]).
    pub fn rollouts_held(&self) -> bool {
        self.inner.hold.is_held()
    }

    /// The current routing table. Take it once per request and use it for
    /// every model call the request makes.
    pub fn snapshot(&self) -> Snapshot {
        self.inner.routing.load_full()
    }

    /// A routing table in which `model` is not paused: while a swap under
    /// the resource policy replaces its version, waits (holding no table)
    /// until the pause ends. The caller bounds the wait (a request's
    /// deadline, say); a model that is not paused gets the current table at
    /// once.
    pub async fn snapshot_serving(&self, model: &str) -> Snapshot {
        loop {
            let snapshot = self.snapshot();
            let Some(resumed) = snapshot.paused(model).map(|p| p.resumed()) else { return snapshot };
            drop(snapshot);
            resumed.await;
        }
    }

    /// Whether the registry knows `model`: it serves a version, or an
    /// operation on it has run. A name that is in neither (a request or a
    /// load for a model the source does not have) leaves no trace.
    pub fn knows(&self, model: &str) -> bool {
        self.inner.routing.load().holds(model) || self.inner.models.lock().contains_key(model)
    }

    /// Subscribes to state transitions and other events.
    pub fn subscribe(&self) -> EventReceiver {
        self.inner.events.subscribe()
    }

    /// Sends an event about `model` to every subscriber, for what a front
    /// end decides beside the registry's own operations (an operator's
    /// recorded decision, say).
    pub fn announce(&self, model: &str, version: Option<u64>, kind: EventKind) {
        self.inner.emit(model, version, kind);
    }

    /// Returns once no operation of `model` runs (a load, a rollout's
    /// start or end with its drain, a rollback…): then the next one is not
    /// refused with [`LoadError::InProgress`], unless another caller took
    /// the model first. The caller bounds the wait.
    pub async fn until_free(&self, model: &str) {
        // Subscribed before the flag is read: a release between the two
        // still wakes the wait.
        let mut freed = self.inner.freed.subscribe();
        while self.inner.models.lock().get(model).is_some_and(|e| e.busy) {
            if freed.changed().await.is_err() {
                return;
            }
        }
    }

    /// The source versions are loaded from.
    pub fn source(&self) -> &Arc<dyn Source> {
        &self.inner.source
    }

    /// Starts loading a version (the newest complete one when `None`)
    /// through the whole transaction. Refused at once with
    /// [`LoadError::InProgress`] while another operation on the model runs.
    pub fn load(&self, model: &str, version: Option<u64>) -> Result<LoadHandle, LoadError> {
        let busy = Busy::take(&self.inner, model)?;
        self.refuse_during_rollout(model)?;
        self.build(move |inner, tx, heap| load::load(inner, busy, version, tx, heap))
    }

    /// Queues `build` on the loader thread, on a heap of its own, and
    /// returns the handle its reply resolves.
    fn build(
        &self,
        build: impl FnOnce(Arc<Inner>, Reply, crate::threads::heap::HeapLease) + Send + 'static,
    ) -> Result<LoadHandle, LoadError> {
        let (tx, rx) = oneshot::channel();
        let inner = Arc::clone(&self.inner);
        let job: Job = Box::new(move || {
            let step_aside = inner.step_aside;
            crate::threads::heap::build_on_own_heap(step_aside, move |heap| build(inner, tx, heap))
        });
        self.jobs.send(job).map_err(|_| LoadError::ShuttingDown)?;
        Ok(LoadHandle { rx })
    }

    /// Loads `version` through the whole transaction and keeps it for
    /// rollback behind the versions already kept, without serving it: the
    /// stable version does not change. Refused for a model that serves no
    /// stable version.
    pub fn keep(&self, model: &str, version: u64) -> Result<LoadHandle, LoadError> {
        let busy = Busy::take(&self.inner, model)?;
        if self.inner.current().model(model).is_none() {
            return Err(LoadError::NotLoaded { model: model.to_owned() });
        }
        self.build(move |inner, tx, heap| load::keep(inner, busy, version, tx, heap))
    }

    /// Makes the newest previous version stable again: one pointer store, no
    /// reload. The version rolled back from is dropped from the routing table
    /// and freed once its requests finish. The handle resolves after drain.
    pub fn rollback(&self, model: &str) -> Result<LoadHandle, LoadError> {
        let busy = Busy::take(&self.inner, model)?;
        self.refuse_during_rollout(model)?;
        let (tx, rx) = oneshot::channel();
        load::rollback(Arc::clone(&self.inner), busy, tx)?;
        Ok(LoadHandle { rx })
    }

    /// Takes the model out of service; its versions are freed once the
    /// requests pinned to them finish.
    pub fn unload(&self, model: &str) -> Result<LoadHandle, LoadError> {
        let busy = Busy::take(&self.inner, model)?;
        self.refuse_during_rollout(model)?;
        let (tx, rx) = oneshot::channel();
        load::unload(Arc::clone(&self.inner), busy, tx)?;
        Ok(LoadHandle { rx })
    }

    /// Drops a kept previous version from the routing table; it is freed
    /// once the requests pinned to it finish. The stable version cannot be
    /// retired (load another version or unload the model instead).
    pub fn retire(&self, model: &str, version: u64) -> Result<LoadHandle, LoadError> {
        let busy = Busy::take(&self.inner, model)?;
        let (tx, rx) = oneshot::channel();
        load::retire(Arc::clone(&self.inner), busy, version, tx)?;
        Ok(LoadHandle { rx })
    }

    /// The status of one model, if the registry or the source knows it.
    pub fn status(&self, model: &str) -> Option<ModelStatus> {
        let snapshot = self.snapshot();
        let route = snapshot.model(model);
        let paused = snapshot.paused(model).is_some();
        // Read before the model's entry is locked: it takes that lock too.
        let rollout = self.rollout(model);
        let models = self.inner.models.lock();
        let entry = models.get(model);
        if route.is_none() && entry.is_none() && !paused {
            return None;
        }
        Some(ModelStatus {
            name: model.to_owned(),
            state: entry.and_then(|e| e.state).unwrap_or(if route.is_some() { State::Ready } else { State::Idle }),
            serving: route.map(|r| r.stable.number()),
            previous: route.map(|r| r.previous.iter().map(|v| v.number()).collect()).unwrap_or_default(),
            live: self.inner.memory.live(model),
            retained: self.inner.memory.retained(model),
            busy: entry.is_some_and(|e| e.busy),
            paused,
            working_on: entry.and_then(|e| e.working_on),
            last: entry.and_then(|e| e.last.clone()),
            last_error: entry.and_then(|e| e.last_error.clone()),
            failed_versions: entry.map(|e| e.failed_versions.clone()).unwrap_or_default(),
            rollout,
            workers: entry.map(|e| e.workers).unwrap_or_default(),
        })
    }

    /// Refused while a rollout of `model` is in progress: a load, rollback
    /// or unload would cut across it.
    fn refuse_during_rollout(&self, model: &str) -> Result<(), LoadError> {
        match self.inner.current().model(model).and_then(|r| r.rollout.as_ref()) {
            Some(r) => Err(LoadError::RolloutInProgress { model: model.to_owned(), candidate: r.candidate.number() }),
            None => Ok(()),
        }
    }

    /// Starts a rollout: the candidate goes through the whole load
    /// transaction, then takes the first step's share beside the stable
    /// version, by one store. Refused while another operation or rollout of
    /// the model runs, and for a model that serves no stable version.
    pub fn start_rollout(&self, model: &str, start: RolloutStart) -> Result<LoadHandle, LoadError> {
        let busy = Busy::take(&self.inner, model)?;
        self.refuse_during_rollout(model)?;
        match self.inner.current().model(model) {
            None => return Err(LoadError::NotLoaded { model: model.to_owned() }),
            Some(route) if !route.stable.alive() => {
                let reason = load::rollout::no_worker(route.stable.number());
                return Err(LoadError::RolloutRefused { model: model.to_owned(), reason });
            }
            Some(_) => {}
        }
        self.build(move |inner, tx, heap| load::rollout::start(inner, busy, start, tx, heap))
    }

    /// The rollout of `model` in progress, or the last one that ended.
    pub fn rollout(&self, model: &str) -> Option<RolloutStatus> {
        if let Some(progress) = self.inner.rollouts.lock().get(model) {
            return Some(progress.status(model));
        }
        self.inner.models.lock().get(model).and_then(|e| e.ended_rollout.clone())
    }

    /// Stops judging windows; the candidate keeps its share until resumed,
    /// promoted or aborted.
    pub fn pause_rollout(&self, model: &str, reason: &str) -> Result<RolloutStatus, LoadError> {
        self.steer(model, |progress| {
            (progress.phase == Phase::Running).then(|| {
                progress.phase = Phase::Paused;
                progress.paused = Some(reason.to_owned());
                Action::Paused
            })
        })
    }

    /// Judges windows again, starting a fresh window now.
    pub fn resume_rollout(&self, model: &str) -> Result<RolloutStatus, LoadError> {
        self.steer(model, |progress| {
            (progress.phase == Phase::Paused).then(|| {
                progress.phase = Phase::Running;
                progress.paused = None;
                progress.inconclusive = 0;
                progress.window_started = std::time::Instant::now();
                // What was observed while paused is not judged.
                progress.observations.take();
                Action::Resumed
            })
        })
    }

    /// Applies an operator's pause or resume; a no-op when it is in that
    /// phase already.
    fn steer(
        &self,
        model: &str,
        change: impl FnOnce(&mut Progress) -> Option<Action>,
    ) -> Result<RolloutStatus, LoadError> {
        let mut rollouts = self.inner.rollouts.lock();
        let progress = rollouts.get_mut(model).ok_or_else(|| LoadError::NoRollout { model: model.to_owned() })?;
        if let Some(action) = change(progress) {
            let decision = progress.decide(model, action, By::Operator, None);
            self.inner.emit(model, Some(decision.candidate), EventKind::rollout(decision));
        }
        Ok(progress.status(model))
    }

    /// Makes the candidate stable now, by one store.
    pub fn promote_rollout(&self, model: &str) -> Result<LoadHandle, LoadError> {
        self.end_rollout(model, Ending::Promote, By::Operator)
    }

    /// Takes the candidate out of traffic now, by one store; it is freed
    /// once the requests it is answering finish.
    pub fn abort_rollout(&self, model: &str) -> Result<LoadHandle, LoadError> {
        self.end_rollout(model, Ending::Abort, By::Operator)
    }

    /// Ends the rollout of `model` as `by` decided: promotes the candidate,
    /// or takes it out (rolled back or aborted), by one store. The store
    /// is done when this returns; the handle finishes once what left the
    /// route has drained.
    pub fn end_rollout(&self, model: &str, ending: Ending, by: By) -> Result<LoadHandle, LoadError> {
        let busy = Busy::take(&self.inner, model)?;
        let watching = self.inner.rollouts.lock().get(model).is_some_and(|p| p.phase == Phase::Watching);
        let (tx, rx) = oneshot::channel();
        let inner = Arc::clone(&self.inner);
        match (ending, watching) {
            // During the watch after promotion: promoting confirms it,
            // anything else goes back to the version it replaced.
            (Ending::Promote, true) => {
                let decision = inner.end_rollout(model, Action::Watched, Phase::Promoted, by)?;
                load::rollout::end_watch(inner, busy, tx, decision)?;
            }
            (Ending::RollBack | Ending::Abort, true) => {
                let action = if ending == Ending::RollBack { Action::RolledBack } else { Action::Aborted };
                let decision = inner.end_rollout(model, action, Phase::RolledBack, by)?;
                load::rollout::restore(inner, busy, tx, decision)?;
            }
            (Ending::Promote, false) => {
                let (decision, watch) = inner.promotion(model, by)?;
                load::rollout::promote(inner, busy, tx, watch, decision)?;
            }
            (Ending::RollBack | Ending::Abort, false) => {
                let (action, phase) = match ending {
                    Ending::RollBack => (Action::RolledBack, Phase::RolledBack),
                    _ => (Action::Aborted, Phase::Aborted),
                };
                let decision = inner.end_rollout(model, action, phase, by)?;
                load::rollout::remove(inner, busy, tx, decision)?;
            }
        }
        Ok(LoadHandle { rx })
    }

    /// Moves a rollout to step `step` of its plan and publishes the share,
    /// by one store: how a fleet's coordinator moves a steered rollout. A
    /// no-op when it is at that step already.
    pub fn step_rollout(&self, model: &str, step: usize, by: By) -> Result<RolloutStatus, LoadError> {
        let (moved, status) = {
            let mut rollouts = self.inner.rollouts.lock();
            let progress = rollouts.get_mut(model).ok_or_else(|| LoadError::NoRollout { model: model.to_owned() })?;
            if step >= progress.plan.steps.len() {
                let steps = progress.plan.steps.len();
                return Err(LoadError::RolloutRefused {
                    model: model.to_owned(),
                    reason: format!("step {step} is beyond the plan's {steps} steps"),
                });
            }
            if step < progress.step {
                // Users the candidate answered would move back to stable.
                return Err(LoadError::RolloutRefused {
                    model: model.to_owned(),
                    reason: format!("step {step} would lower the candidate's share from step {}", progress.step),
                });
            }
            let moved = (progress.step != step).then(|| {
                progress.step = step;
                if progress.stable_answers_nobody() {
                    progress.record_baseline();
                }
                (progress.weight(), progress.decide(model, Action::Advanced, by, None))
            });
            (moved, progress.status(model))
        };
        if let Some((weight, decision)) = moved {
            load::rollout::set_weight(&self.inner, model, weight);
            tracing::info!(model, candidate = decision.candidate, step, "{}", decision.message);
            self.inner.emit(model, Some(decision.candidate), EventKind::rollout(decision));
        }
        Ok(status)
    }

    /// What the rollout of `model` observed since the last take, as sums
    /// that merge across servers; the next window starts now. `None` when
    /// no rollout is in the route.
    pub fn take_rollout_sums(&self, model: &str) -> Option<Sums> {
        let current = self.inner.current();
        current.model(model)?.rollout.as_ref().map(|r| r.observations.take_sums())
    }

    /// Counts outcomes posted for answers of `model`'s rollout (see
    /// [`crate::rollout::outcome`]): the batch is checked whole first, and
    /// nothing of it counts when an item is malformed.
    pub fn post_outcomes(&self, model: &str, posted: &[(&str, f64)]) -> Result<Posted, PostError> {
        let current = self.inner.current();
        let route = current.model(model).ok_or_else(|| PostError::UnknownModel(model.to_owned()))?;
        outcome::post(route.rollout.as_ref(), posted)
    }

    /// Statuses of every model the registry has touched or serves.
    pub fn statuses(&self) -> Vec<ModelStatus> {
        let mut names: Vec<String> = self.inner.models.lock().keys().cloned().collect();
        names.extend(self.snapshot().models().keys().cloned());
        names.sort();
        names.dedup();
        names.iter().filter_map(|n| self.status(n)).collect()
    }

    /// Versions of a model still in memory, including ones being drained.
    pub fn live_versions(&self, model: &str) -> Vec<LiveVersion> {
        self.inner.memory.live(model)
    }

    /// What the most recent frees gave back, oldest first.
    pub fn unload_records(&self) -> Vec<UnloadRecord> {
        self.inner.memory.unloads()
    }
}

/// The right to run one operation on a model; released on drop, so a
/// panic or an early return cannot leave a model stuck busy. An operation's
/// run drops it on the agent once its last state is applied.
pub(crate) struct Busy {
    inner: Arc<Inner>,
    pub(crate) model: String,
}

impl Busy {
    /// Whether another operation holds `model` now.
    fn is_taken(inner: &Inner, model: &str) -> bool {
        inner.models.lock().get(model).is_some_and(|entry| entry.busy)
    }

    fn take(inner: &Arc<Inner>, model: &str) -> Result<Busy, LoadError> {
        let mut models = inner.models.lock();
        let entry = models.entry(model.to_owned()).or_default();
        if entry.busy {
            return Err(LoadError::InProgress { model: model.to_owned() });
        }
        entry.busy = true;
        Ok(Busy { inner: Arc::clone(inner), model: model.to_owned() })
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let (inner, model) = (Arc::clone(&self.inner), std::mem::take(&mut self.model));
        let release = move || {
            let mut models = inner.models.lock();
            if let Some(entry) = models.get_mut(&model) {
                entry.busy = false;
                // An operation refused before it touched the model (a load
                // of a model the source does not have) leaves no entry.
                if entry.is_blank() {
                    models.remove(&model);
                }
            }
            drop(models);
            inner.freed.send_modify(|n| *n = n.wrapping_add(1));
        };
        // Dropped on a lowered thread only when its run was cut short.
        if crate::threads::sys::current_thread_lowered() { self.inner.agent.send(release) } else { release() }
    }
}

impl Inner {
    /// The current table.
    pub(crate) fn current(&self) -> Snapshot {
        self.routing.load_full()
    }

    /// Builds the next table from the current one and publishes it with one
    /// store. Returns the table it replaced. Publishers are serialised so no
    /// update is lost; building is cheap (the map holds `Arc`s). At serving
    /// priority only: on the agent for a load, on the caller's thread for
    /// the other operations.
    pub(crate) fn publish(&self, change: impl FnOnce(&mut BTreeMap<String, ModelRoute>)) -> Snapshot {
        self.publish_with(|models, _| change(models))
    }

    /// [`Inner::publish`], changing the paused models' gates too.
    pub(crate) fn publish_with(
        &self,
        change: impl FnOnce(&mut BTreeMap<String, ModelRoute>, &mut BTreeMap<String, Arc<Pause>>),
    ) -> Snapshot {
        let _serial = self.publish.lock();
        let current = self.routing.load_full();
        let mut models = current.models().clone();
        let mut paused = current.all_paused().clone();
        change(&mut models, &mut paused);
        let next = Arc::new(Routing::with_paused(current.generation() + 1, models, paused));
        self.routing.swap(next)
    }

    /// Moves a model to a new state and tells subscribers. This and the
    /// other changes below run on the agent.
    pub(crate) fn transition(&self, model: &str, version: Option<u64>, to: State, stages: &[StageTiming]) {
        let from = {
            let mut models = self.models.lock();
            let entry = models.entry(model.to_owned()).or_default();
            let from = entry.state.unwrap_or(State::Idle);
            entry.state = Some(to);
            entry.working_on = match to {
                State::Ready | State::Failed | State::Idle => None,
                _ => version,
            };
            from
        };
        if from == to {
            return;
        }
        tracing::debug!(model, version, from = from.as_str(), to = to.as_str(), "Model changed state.");
        self.emit(model, version, EventKind::Transition { from, to, stages: stages.to_vec() });
    }

    pub(crate) fn emit(&self, model: &str, version: Option<u64>, kind: EventKind) {
        let _ = self.events.send(Event { model: model.to_owned(), version, at: SystemTime::now(), kind });
    }

    pub(crate) fn record_success(&self, report: &LoadReport) {
        let mut models = self.models.lock();
        let entry = models.entry(report.model.clone()).or_default();
        if let (Operation::Load, Some(version)) = (report.operation, report.version) {
            entry.failed_versions.remove(&version);
        }
        entry.last = Some(report.clone());
    }

    pub(crate) fn record_failure(&self, model: &str, failure: Failure) {
        let mut models = self.models.lock();
        let entry = models.entry(model.to_owned()).or_default();
        if let (Operation::Load, Some(version)) = (failure.operation, failure.version) {
            entry.failed_versions.insert(version, failure.clone());
        }
        entry.last_error = Some(failure);
    }
}
