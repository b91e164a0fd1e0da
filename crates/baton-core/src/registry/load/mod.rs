//! The load transaction: fetch → verify → load → validate → warmup →
//! commit → drain, and the three shorter operations built from its last
//! stages, rollback, retire and unload.
//!
//! Every stage before commit works on the candidate alone, on a lowered
//! build thread; the first failure stops the transaction, leaves the routing
//! table untouched and returns an error naming the stage. Commit is one
//! store. Drain runs on a thread of its own so the loader can start the next
//! model's load meanwhile; the model stays busy until its drain ends.
//!
//! A run changes registry state only through the agent ([`crate::threads::agent`]):
//! each transition, the report and the reply are jobs it applies in order.
//! A load's commit is a job too, so that the routing table is published at
//! serving priority and the drain thread, which the commit starts, does not
//! inherit the build thread's idle priority.

pub mod golden;
pub(crate) mod rollout;
mod twin;
pub use rollout::RolloutStart;
mod vacate;
pub mod validate;
pub mod warmup;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::files::manifest;
use crate::files::source::{FetchError, Presence};
use crate::files::spec::{ModelSpec, SwapPolicy};
use crate::files::verified::Verified;
use crate::registry::budget::{Basis, Check};
use crate::registry::error::LoadError;
use crate::registry::events::{EventKind, Stage, StageTiming, State};
use crate::registry::routing::{ModelRoute, Snapshot};
use crate::registry::{Busy, Failure, Inner, LoadReport, Operation, Reply};
use crate::run::backend::UpdateReason;
use crate::run::version::{Version, VersionParts};
use crate::threads::agent::panic_message;
use crate::threads::heap::HeapLease;

/// Tracks one operation: its stages, their durations, the model's state.
struct Run {
    inner: Arc<Inner>,
    busy: Busy,
    operation: Operation,
    version: Option<u64>,
    replaced: Option<u64>,
    started: Instant,
    stages: Vec<StageTiming>,
    current: Option<Stage>,
    /// Under the resource swap policy, once the old version left the route.
    vacated: Option<vacate::Vacated>,
    /// How long the model was paused, once the pause ended.
    paused: Option<Duration>,
    /// The rollout decision this run applies, announced once its table is
    /// published: whoever hears it finds the routes it names.
    announce: Option<crate::rollout::control::Decision>,
}

/// What a commit does to the routes; returns the version it replaced.
type Change = Box<dyn FnOnce(&mut BTreeMap<String, ModelRoute>) -> Option<u64> + Send>;

/// How a run ends after its commit.
struct Finish {
    timeout: Duration,
    bytes_held: u64,
    /// Why the loaded version is the kind of update it is, when the run
    /// loaded one.
    update: Option<UpdateReason>,
    end: State,
    reply: Reply,
}

impl Finish {
    /// The end of a run that loaded `version`.
    fn loaded(timeout: Duration, version: &Version, reply: Reply) -> Finish {
        let (bytes_held, update) = (version.bytes_held(), Some(version.weights().why()));
        Finish { timeout, bytes_held, update, end: State::Ready, reply }
    }

    /// The end of a run that only moved pointers (or unloaded), ending in `end`.
    fn switched(timeout: Duration, end: State, reply: Reply) -> Finish {
        Finish { timeout, bytes_held: 0, update: None, end, reply }
    }
}

impl Run {
    fn new(inner: Arc<Inner>, busy: Busy, operation: Operation) -> Run {
        Run {
            inner,
            busy,
            operation,
            version: None,
            replaced: None,
            started: Instant::now(),
            stages: Vec::new(),
            current: None,
            vacated: None,
            paused: None,
            announce: None,
        }
    }

    fn model(&self) -> &str {
        &self.busy.model
    }

    /// Has the agent move the model to `to`, after this run's earlier changes.
    fn tell_transition(&self, to: State) {
        let (inner, model, version, stages) =
            (Arc::clone(&self.inner), self.model().to_owned(), self.version, self.stages.clone());
        self.inner.agent.send(move || inner.transition(&model, version, to, &stages));
    }

    /// Runs one stage: enters its state, times it.
    fn stage<T>(&mut self, stage: Stage, work: impl FnOnce(&mut Run) -> Result<T, LoadError>) -> Result<T, LoadError> {
        self.current = Some(stage);
        self.tell_transition(stage.state());
        let began = Instant::now();
        let result = work(self);
        self.stages.push(StageTiming { stage, duration: began.elapsed() });
        result
    }

    /// Reports a failure on the agent: event, record, FAILED, then READY
    /// again if a version still serves; then frees the model and answers.
    fn fail(self, error: LoadError, reply: Reply) {
        let agent = self.inner.agent.clone();
        agent.send(move || self.report_failure(error, reply));
    }

    fn report_failure(self, error: LoadError, reply: Reply) {
        let model = self.model().to_owned();
        let stage = error.stage();
        tracing::warn!(
            model = %model,
            version = self.version,
            stage = stage.map(Stage::as_str),
            kind = error.kind(),
            reason = error.reason(),
            %error,
            "A model operation failed; the serving version is untouched."
        );
        if let Some(stage) = stage {
            self.inner.emit(
                &model,
                self.version,
                EventKind::Failed { stage, kind: error.reason().to_owned(), message: error.to_string() },
            );
        }
        self.inner.record_failure(
            &model,
            Failure {
                operation: self.operation,
                version: self.version,
                stage,
                kind: error.kind(),
                reason: error.reason(),
                message: error.to_string(),
                at: std::time::SystemTime::now(),
            },
        );
        self.inner.transition(&model, self.version, State::Failed, &self.stages);
        if self.inner.current().model(&model).is_some() {
            self.inner.transition(&model, self.version, State::Ready, &self.stages);
        }
        // The model is free again before the caller hears of the failure.
        drop(self);
        let _ = reply.send(Err(error));
    }

    /// Publishes the table `change` makes, then drains the replaced one on a
    /// thread of its own and reports. At serving priority only (the drain
    /// thread inherits the caller's): on the agent for a load, on the
    /// caller's thread for the other operations.
    fn commit_then_drain(mut self, change: Change, finish: Finish) {
        let vacated = self.vacated.take();
        let old = self
            .stage(Stage::Commit, |run| {
                let mut replaced = None;
                let model = run.model().to_owned();
                let old = run.inner.publish_with(|models, paused| {
                    replaced = change(models);
                    paused.remove(&model);
                });
                run.replaced = replaced;
                Ok(old)
            })
            .unwrap_or_else(|never: LoadError| unreachable!("commit cannot fail: {never}"));
        if let Some(decision) = self.announce.take() {
            self.inner.emit(self.model(), Some(decision.candidate), EventKind::rollout(decision));
        }
        if let Some(vacated) = vacated {
            self.replaced = Some(vacated.number);
            self.paused = Some(vacated.resume(&self.inner, self.model(), self.version, false));
        }
        crate::threads::sync::expect_serving_priority();
        let spawned = std::thread::Builder::new().name("baton-drain".into()).spawn(move || self.drain(old, finish));
        if let Err(error) = spawned {
            tracing::error!(%error, "Could not start a drain thread.");
        }
    }

    /// On the drain thread: waits for the replaced table, then has the agent
    /// report.
    fn drain(mut self, old: Snapshot, finish: Finish) {
        // A model that was not in the replaced table has nothing to drain.
        let nothing_to_drain = old.model(self.model()).is_none();
        let timeout = finish.timeout;
        let (stragglers, timed_out) = self
            .stage(Stage::Drain, |_| Ok(if nothing_to_drain { (0, false) } else { drain(old, timeout) }))
            .unwrap_or((0, false));
        let report = LoadReport {
            model: self.model().to_owned(),
            operation: self.operation,
            version: self.version,
            replaced: self.replaced,
            stages: self.stages.clone(),
            total: self.started.elapsed(),
            bytes_held: finish.bytes_held,
            update: finish.update.map(UpdateReason::kind),
            update_reason: finish.update,
            stragglers,
            drain_timed_out: timed_out,
            paused: self.paused,
            finished_at: std::time::SystemTime::now(),
        };
        let agent = self.inner.agent.clone();
        agent.send(move || self.report_success(report, finish));
    }

    /// On the agent: records and announces the finished run, moves the
    /// model to its final state, frees it and answers.
    fn report_success(self, report: LoadReport, finish: Finish) {
        if report.drain_timed_out {
            tracing::warn!(
                model = self.model(),
                stragglers = report.stragglers,
                "Drain timed out; the old version is freed when its last requests end."
            );
            let stragglers = report.stragglers;
            self.inner.emit(self.model(), self.version, EventKind::DrainTimedOut { stragglers });
        }
        self.inner.record_success(&report);
        self.inner.transition(self.model(), self.version, finish.end, &self.stages);
        self.inner.emit(self.model(), self.version, EventKind::Finished { report: report.clone() });
        tracing::info!(
            model = %report.model,
            operation = report.operation.as_str(),
            version = report.version,
            replaced = report.replaced,
            total_ms = crate::human::fields::ms(report.total),
            "Model operation finished."
        );
        drop(self);
        let _ = finish.reply.send(Ok(report));
    }
}

/// Waits until no request holds `old` any more, or the timeout passes.
/// Returns the requests still holding it and whether it timed out.
fn drain(old: Snapshot, timeout: Duration) -> (usize, bool) {
    let released = old.take_released();
    let weak = Arc::downgrade(&old);
    drop(old);
    match released.map(|rx| rx.recv_timeout(timeout)) {
        Some(Err(std::sync::mpsc::RecvTimeoutError::Timeout)) => (weak.strong_count(), true),
        _ => (0, false),
    }
}

/// The whole transaction for one model; runs on a build thread (see
/// [`crate::threads::heap`]) at the loader's priority, up to the commit, which it
/// hands to the agent. `heap` goes into the version.
pub(crate) fn load(inner: Arc<Inner>, busy: Busy, version: Option<u64>, reply: Reply, heap: HeapLease) {
    if let Some(error) = unknown_model(&inner, &busy.model) {
        // Refused before any state, event or record: the model is freed
        // (and its blank entry dropped) on the agent, then the caller told.
        let agent = inner.agent.clone();
        agent.send(move || {
            drop(busy);
            let _ = reply.send(Err(error));
        });
        return;
    }
    let mut run = Run::new(inner, busy, Operation::Load);
    let mut heap = Some(heap);
    // The heap lease goes into the version, and stays here if the load fails.
    let prepared = caught(&mut run, |run| prepare(run, version, &mut heap, true).and_then(alive));
    let prepared = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            // A resource swap that paused brings the old version back first.
            vacate::restore_and_resume(&mut run, &mut heap);
            return run.fail(error, reply);
        }
    };
    let (version, keep, timeout) = prepared;
    let finish = Finish::loaded(timeout, &version, reply);
    let number = version.number();
    let model = run.model().to_owned();
    let checked = Arc::clone(&version);
    let change: Change = Box::new(move |models| {
        let previous = models.remove(&model);
        let replaced = previous.as_ref().map(|r| r.stable.number());
        let mut kept: Vec<Arc<Version>> = previous.map(|r| r.versions().cloned().collect()).unwrap_or_default();
        kept.retain(|v| v.number() != number);
        kept.truncate(keep);
        models.insert(model, ModelRoute::new(version, kept));
        replaced
    });
    // Published on the agent, at serving priority; see the module's documentation.
    let agent = run.inner.agent.clone();
    agent.send(move || {
        // An engine that ended since: refused, unless a resource swap has
        // freed the old version already (then it is published, and its end
        // acted on as any other's once this operation is over).
        let ended = run.vacated.is_none().then(|| ensure_alive(&checked)).and_then(Result::err);
        drop(checked);
        match ended {
            Some(error) => run.report_failure(error, finish.reply),
            None => run.commit_then_drain(change, finish),
        }
    });
}

/// Refuses a version whose engine ended by itself since it loaded (its
/// worker process exited): publishing it would serve nothing.
pub(crate) fn ensure_alive(version: &Version) -> Result<(), LoadError> {
    if version.alive() {
        return Ok(());
    }
    let why = match version.process() {
        Some(process) => format!("its worker process {} ended", process.pid),
        None => "its engine ended".to_owned(),
    };
    Err(LoadError::EngineEnded { why })
}

/// [`ensure_alive`] for a prepared version.
fn alive(prepared: Prepared) -> Result<Prepared, LoadError> {
    ensure_alive(&prepared.0).map(|()| prepared)
}

/// Keep: `number` through the whole transaction, then behind the kept
/// versions of the model's route by one store; the stable version stays.
/// A version the route already has, or one beyond `keep_previous`, is
/// dropped instead.
pub(crate) fn keep(inner: Arc<Inner>, busy: Busy, number: u64, reply: Reply, heap: HeapLease) {
    let mut run = Run::new(inner, busy, Operation::Keep);
    let mut heap = Some(heap);
    let prepared = caught(&mut run, |run| prepare(run, Some(number), &mut heap, false).and_then(alive));
    let (version, keep, timeout) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return run.fail(error, reply),
    };
    let finish = Finish::loaded(timeout, &version, reply);
    let model = run.model().to_owned();
    let checked = Arc::clone(&version);
    let change: Change = Box::new(move |models| {
        let route = models.get_mut(&model)?;
        if route.versions().all(|v| v.number() != number) && route.previous.len() < keep {
            route.previous.push(version);
        }
        None
    });
    let agent = run.inner.agent.clone();
    agent.send(move || {
        let ended = ensure_alive(&checked).err();
        drop(checked);
        match ended {
            Some(error) => run.report_failure(error, finish.reply),
            None => run.commit_then_drain(change, finish),
        }
    });
}

/// The error for a model the table does not serve and the source says is
/// not there; `None` when either knows it (or the source cannot tell).
fn unknown_model(inner: &Inner, model: &str) -> Option<LoadError> {
    if inner.current().model(model).is_some() || inner.source.presence(model, None) != Presence::Missing {
        return None;
    }
    match inner.source.spec(model) {
        Err(e @ FetchError::ModelNotFound { .. }) => Some(e.into()),
        _ => None,
    }
}

type Prepared = (Arc<Version>, usize, Duration);

/// Runs `work` (a stage or several), a panic in a stage turned into that
/// stage's error.
fn caught<T>(run: &mut Run, work: impl FnOnce(&mut Run) -> Result<T, LoadError>) -> Result<T, LoadError> {
    catch_unwind(AssertUnwindSafe(|| work(run))).unwrap_or_else(|payload| {
        let stage = run.current.unwrap_or(Stage::Fetch);
        Err(LoadError::Panicked { stage, message: panic_message(payload.as_ref()) })
    })
}

/// The files of a version to build, verified.
struct Files {
    number: u64,
    spec: Arc<ModelSpec>,
    dir: PathBuf,
    verified: Verified,
}

/// The budgets a load of `model` under `spec` is checked against, with
/// what live versions hold now, less `leaving` (the versions a resource
/// swap frees before its candidate loads).
fn budgets(inner: &Arc<Inner>, model: &str, spec: &ModelSpec, leaving: Vec<Weak<Version>>) -> Check {
    let (server, own) = (inner.memory_budget, spec.policy.memory_budget);
    if server.is_none() && own.is_none() {
        return Check { server: None, model: None };
    }
    let in_use = inner.memory.in_use(model, leaving);
    Check { server: server.map(|b| (b, in_use.all)), model: own.map(|b| (b, in_use.model)) }
}

/// Every stage before commit. Nothing here touches the routing table,
/// except a resource swap's pause ([`vacate`]), which only a plain load
/// (`may_pause`) makes.
fn prepare(
    run: &mut Run,
    version: Option<u64>,
    heap: &mut Option<HeapLease>,
    may_pause: bool,
) -> Result<Prepared, LoadError> {
    let model = run.model().to_owned();
    let inner = Arc::clone(&run.inner);
    let spec = run.stage(Stage::Config, |_| inner.source.spec(&model).map_err(LoadError::from_spec))?;
    let (number, dir) = run.stage(Stage::Fetch, |run| {
        let number = match version {
            Some(v) => v,
            None => {
                *inner.source.versions(&model)?.last().ok_or_else(|| LoadError::NoVersion { model: model.clone() })?
            }
        };
        run.version = Some(number);
        let fetched = inner.source.fetch(&model, number)?;
        Ok((number, fetched))
    })?;
    let spec = Arc::new(spec);
    let verified = run.stage(Stage::Verify, |_| verify(&inner, &spec, &dir))?;
    let dir = dir.dir;
    let resource = spec.policy.swap == SwapPolicy::Resource;
    let leaving = if resource && may_pause { vacate::leaving(&inner, &model) } else { Vec::new() };
    // Refused on the estimate before anything pauses or loads.
    let (estimate, basis) = inner.memory.estimate(&model, verified.manifest().total_bytes());
    let (numbers, weak): (Vec<u64>, Vec<Weak<Version>>) = leaving.into_iter().unzip();
    budgets(&inner, &model, &spec, weak).admit(&model, number, estimate, basis)?;
    if !numbers.is_empty() {
        vacate::vacate(run, numbers)?;
    }
    let version = build(run, Files { number, spec, dir, verified }, heap, false)?;
    let keep = if resource { 0 } else { version.spec().policy.keep_previous };
    let timeout = Duration::from_millis(version.spec().policy.drain_timeout_ms);
    Ok((version, keep, timeout))
}

/// The stages that make a version of verified files: load, validate
/// (unless `restoring` a version that passed it before), warmup, each
/// measured against the memory budgets (unless `restoring`).
fn build(
    run: &mut Run,
    files: Files,
    heap: &mut Option<HeapLease>,
    restoring: bool,
) -> Result<Arc<Version>, LoadError> {
    let Files { number, spec, dir, verified } = files;
    let model = run.model().to_owned();
    let inner = Arc::clone(&run.inner);
    // Checked against what it measurably holds so far.
    let within_budget = |(held, basis): (u64, Basis)| -> Result<(), LoadError> {
        if restoring {
            return Ok(());
        }
        Ok(budgets(&inner, &model, &spec, Vec::new()).admit(&model, number, held, basis)?)
    };
    let growth = Growth::start(&inner);
    let engine = run.stage(Stage::Load, |_| {
        let engine = engine(&inner, &spec, &verified, false)?;
        within_budget(growth.holds(engine.as_ref()))?;
        Ok(engine)
    })?;
    // The backend has what it read; the version's files close here.
    let manifest = verified.into_manifest();
    if !restoring {
        run.stage(Stage::Validate, |_| {
            validate::validate(engine.as_ref(), &spec)?;
            Ok(golden::check(&dir, engine.as_ref()).map_err(validate::ValidateError::from)?)
        })?;
    }
    let (samples, warmed) = run.stage(Stage::Warmup, |_| {
        let samples = warmup::samples(&dir, &spec, engine.as_ref())?;
        let warmed = warmup::run(engine.as_ref(), &samples, &spec)?;
        Ok((samples, warmed))
    })?;
    within_budget(growth.holds(engine.as_ref()))?;
    let bytes_held = growth.grown();
    let parts = VersionParts {
        model,
        number,
        spec,
        manifest,
        warmup: samples,
        warmed,
        bytes_held,
        engine,
        twin: false,
        heap: heap.take(),
    };
    Ok(growth.track(parts))
}

/// The memory a version being built adds, measured as RSS growth inside
/// the memory window, during which the keeper frees nothing.
struct Growth<'a> {
    inner: &'a Inner,
    before: u64,
    _window: std::sync::MutexGuard<'a, ()>,
}

impl<'a> Growth<'a> {
    /// Opens the window and reads RSS.
    fn start(inner: &'a Inner) -> Growth<'a> {
        let window = inner.memory.measure();
        Growth { inner, before: inner.memory.trimmed_rss().unwrap_or(0), _window: window }
    }

    /// What RSS grew by since the start.
    fn grown(&self) -> u64 {
        self.inner.memory.trimmed_rss().unwrap_or(0).saturating_sub(self.before)
    }

    /// What the version being built holds, as the budgets count it: the
    /// growth, plus the resident memory of the worker process `engine`
    /// runs in, when it runs in one; and the basis that names.
    fn holds(&self, engine: &dyn crate::run::backend::Model) -> (u64, Basis) {
        match engine.process().and_then(|p| p.rss) {
            Some(rss) => (self.grown().saturating_add(rss), Basis::InWorker),
            None => (self.grown(), Basis::Measured),
        }
    }

    /// Makes the version and tracks it, before the window closes, so that
    /// no free counts its memory as unaccounted.
    fn track(self, parts: VersionParts) -> Arc<Version> {
        let version = Arc::new(Version::new(parts, Some(self.inner.releaser.clone())));
        self.inner.memory.track(&version);
        crate::registry::exits::watch(self.inner, &version);
        version
    }
}

/// The verify stage: every file checked against the version's MANIFEST,
/// and those the backend maps as they are copied into a directory of
/// baton's on the way ([`crate::files::copied`]).
fn verify(inner: &Inner, spec: &ModelSpec, fetched: &crate::files::source::Fetched) -> Result<Verified, LoadError> {
    let options = spec.policy.verify_options();
    let Some(backend) = inner.backends.get(&spec.backend) else {
        // Refused at load, which names the backend.
        return Ok(manifest::verify_fetched(fetched, &options)?);
    };
    let wanted = |path: &str, size: u64| backend.maps_as_is(path, size);
    let temp = std::env::temp_dir();
    let plan = crate::files::copied::CopyPlan { parent: &temp, wanted: &wanted };
    Ok(manifest::verify_copying(fetched, &options, &plan)?)
}

/// Has the backend `spec` names make a runnable model of verified files;
/// one that shares no weights with other versions when `alone` (a twin).
fn engine(
    inner: &Inner,
    spec: &ModelSpec,
    verified: &Verified,
    alone: bool,
) -> Result<Box<dyn crate::run::backend::Model>, LoadError> {
    let backend = inner.backends.get(&spec.backend).ok_or_else(|| {
        crate::run::backend::BackendError::new(
            "unknown_backend",
            format!("model.toml names backend '{}', which this server does not have", spec.backend),
        )
    })?;
    let loaded = if alone { backend.load_alone(verified, spec) } else { backend.load(verified, spec) };
    // The backend has opened or mapped what it uses of the verify stage's copies.
    verified.remove_copies();
    loaded.map_err(|e| match e.tensor {
        // The weights disagree with the graph: a validation failure.
        Some(tensor) => {
            LoadError::Validate(validate::ValidateError::Tensor { kind: e.kind, tensor, problem: e.message })
        }
        None => LoadError::Load(e),
    })
}

/// Rollback: the newest previous version becomes stable by one store.
pub(crate) fn rollback(inner: Arc<Inner>, busy: Busy, reply: Reply) -> Result<(), LoadError> {
    let model = busy.model.clone();
    let current = inner.current();
    let route = current.model(&model).ok_or_else(|| LoadError::NotLoaded { model: model.clone() })?;
    let target = route.previous.first().ok_or_else(|| LoadError::NoPrevious { model: model.clone() })?;
    let timeout = Duration::from_millis(target.spec().policy.drain_timeout_ms);
    let mut run = Run::new(inner, busy, Operation::Rollback);
    run.version = Some(target.number());
    drop(current);
    let change: Change = Box::new(move |models| {
        let route = models.get_mut(&model).filter(|route| !route.previous.is_empty())?;
        let stable = route.previous.remove(0);
        Some(std::mem::replace(&mut route.stable, stable).number())
    });
    run.commit_then_drain(change, Finish::switched(timeout, State::Ready, reply));
    Ok(())
}

/// Retire: a kept previous version leaves the routing table by one store.
pub(crate) fn retire(inner: Arc<Inner>, busy: Busy, version: u64, reply: Reply) -> Result<(), LoadError> {
    let model = busy.model.clone();
    let timeout = {
        let current = inner.current();
        let route = current.model(&model).ok_or_else(|| LoadError::NotLoaded { model: model.clone() })?;
        let target = route
            .previous
            .iter()
            .find(|v| v.number() == version)
            .ok_or_else(|| LoadError::NotRetirable { model: model.clone(), version })?;
        Duration::from_millis(target.spec().policy.drain_timeout_ms)
    };
    let mut run = Run::new(inner, busy, Operation::Retire);
    run.version = Some(version);
    let change: Change = Box::new(move |models| {
        if let Some(route) = models.get_mut(&model) {
            route.previous.retain(|v| v.number() != version);
        }
        Some(version)
    });
    run.commit_then_drain(change, Finish::switched(timeout, State::Ready, reply));
    Ok(())
}

/// Unload: the model leaves the routing table by one store.
pub(crate) fn unload(inner: Arc<Inner>, busy: Busy, reply: Reply) -> Result<(), LoadError> {
    let model = busy.model.clone();
    let timeout = {
        let current = inner.current();
        let route = current.model(&model).ok_or_else(|| LoadError::NotLoaded { model: model.clone() })?;
        Duration::from_millis(route.stable.spec().policy.drain_timeout_ms)
    };
    let run = Run::new(inner, busy, Operation::Unload);
    let change: Change = Box::new(move |models| models.remove(&model).map(|r| r.stable.number()));
    run.commit_then_drain(change, Finish::switched(timeout, State::Idle, reply));
    Ok(())
}
