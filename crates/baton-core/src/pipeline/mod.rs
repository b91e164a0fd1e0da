//! The load transaction (R6): fetch → verify → load → validate → warmup →
//! commit → drain, and the two shorter operations built from its last
//! stages, rollback and unload.
//!
//! Every stage before commit works on the candidate alone; the first failure
//! stops the transaction, leaves the routing table untouched and returns an
//! error naming the stage. Commit is one store. Drain runs on a thread of its
//! own so the loader can start the next model's load meanwhile; the model
//! stays busy (R4) until its drain ends.

pub mod validate;
pub mod warmup;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::LoadError;
use crate::events::{EventKind, Stage, StageTiming, State};
use crate::heap::HeapLease;
use crate::manifest;
use crate::registry::{Busy, Failure, Inner, LoadReport, Operation, Reply};
use crate::routing::{ModelRoute, Snapshot};
use crate::version::{Version, VersionParts};

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
        }
    }

    fn model(&self) -> &str {
        &self.busy.model
    }

    /// Runs one stage: enters its state, times it.
    fn stage<T>(&mut self, stage: Stage, work: impl FnOnce(&mut Run) -> Result<T, LoadError>) -> Result<T, LoadError> {
        self.current = Some(stage);
        self.inner.transition(self.model(), self.version, stage.state(), &self.stages);
        let began = Instant::now();
        let result = work(self);
        self.stages.push(StageTiming { stage, duration: began.elapsed() });
        result
    }

    /// Reports a failure: event, record, FAILED, then READY again if a
    /// version still serves.
    fn fail(self, error: LoadError, reply: Reply) {
        let model = self.model().to_owned();
        let stage = error.stage();
        tracing::warn!(
            model = %model,
            version = ?self.version,
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

    /// Waits for the replaced table on a drain thread, then finishes.
    fn drain_then_finish(self, old: Snapshot, timeout: Duration, bytes_held: u64, end: State, reply: Reply) {
        let spawned = std::thread::Builder::new().name("baton-drain".into()).spawn(move || {
            let mut run = self;
            // A model that was not in the replaced table has nothing to drain.
            let nothing_to_drain = old.model(run.model()).is_none();
            let (stragglers, timed_out) = run
                .stage(Stage::Drain, |_| Ok(if nothing_to_drain { (0, false) } else { drain(old, timeout) }))
                .unwrap_or((0, false));
            if timed_out {
                tracing::warn!(
                    model = run.model(),
                    stragglers,
                    "Drain timed out; the old version is freed when its last requests end."
                );
                run.inner.emit(run.model(), run.version, EventKind::DrainTimedOut { stragglers });
            }
            let report = LoadReport {
                model: run.model().to_owned(),
                operation: run.operation,
                version: run.version,
                replaced: run.replaced,
                stages: run.stages.clone(),
                total: run.started.elapsed(),
                bytes_held,
                stragglers,
                drain_timed_out: timed_out,
            };
            run.inner.record_success(&report);
            run.inner.transition(run.model(), run.version, end, &run.stages);
            run.inner.emit(run.model(), run.version, EventKind::Finished { report: report.clone() });
            tracing::info!(
                model = %report.model,
                operation = ?report.operation,
                version = ?report.version,
                replaced = ?report.replaced,
                total_ms = report.total.as_secs_f64() * 1000.0,
                "Model operation finished."
            );
            drop(run);
            let _ = reply.send(Ok(report));
        });
        if let Err(error) = spawned {
            tracing::error!(%error, "Could not start a drain thread.");
        }
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

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// The whole transaction for one model; runs on a build thread (see
/// [`crate::heap`]) at the loader's priority. `heap` goes into the version.
pub(crate) fn load(inner: Arc<Inner>, busy: Busy, version: Option<u64>, reply: Reply, heap: HeapLease) {
    let mut run = Run::new(inner, busy, Operation::Load);
    let outcome = catch_unwind(AssertUnwindSafe(|| prepare(&mut run, version, heap)));
    let prepared = match outcome {
        Ok(Ok(prepared)) => prepared,
        Ok(Err(error)) => return run.fail(error, reply),
        Err(payload) => {
            let stage = run.current.unwrap_or(Stage::Fetch);
            let error = LoadError::Panicked { stage, message: panic_message(payload.as_ref()) };
            return run.fail(error, reply);
        }
    };
    let (version, keep, timeout) = prepared;
    let bytes_held = version.bytes_held();
    let number = version.number();
    let old = run
        .stage(Stage::Commit, |run| {
            let model = run.model().to_owned();
            let mut replaced = None;
            let old = run.inner.publish(|models| {
                let previous = models.remove(&model);
                replaced = previous.as_ref().map(|r| r.stable.number());
                let mut kept: Vec<Arc<Version>> = previous.map(|r| r.versions().cloned().collect()).unwrap_or_default();
                kept.retain(|v| v.number() != number);
                kept.truncate(keep);
                models.insert(model.clone(), ModelRoute { stable: version, previous: kept });
            });
            run.replaced = replaced;
            Ok(old)
        })
        .unwrap_or_else(|never: LoadError| unreachable!("commit cannot fail: {never}"));
    run.drain_then_finish(old, timeout, bytes_held, State::Ready, reply);
}

type Prepared = (Arc<Version>, usize, Duration);

/// Every stage before commit. Nothing here touches the routing table.
fn prepare(run: &mut Run, version: Option<u64>, heap: HeapLease) -> Result<Prepared, LoadError> {
    let model = run.model().to_owned();
    let inner = Arc::clone(&run.inner);
    let (spec, number, dir) = run.stage(Stage::Fetch, |run| {
        let spec = inner.source.spec(&model)?;
        let number = match version {
            Some(v) => v,
            None => {
                *inner.source.versions(&model)?.last().ok_or_else(|| LoadError::NoVersion { model: model.clone() })?
            }
        };
        run.version = Some(number);
        let dir = inner.source.fetch(&model, number)?;
        Ok((Arc::new(spec), number, dir))
    })?;
    let options = spec.policy.verify_options();
    let verified = run.stage(Stage::Verify, |_| Ok(manifest::verify_with(&dir, &options)?))?;
    // The memory window: nothing is freed by the keeper while it is open.
    let window = inner.memory.measure();
    let rss_before = inner.memory.trimmed_rss().unwrap_or(0);
    let engine = run.stage(Stage::Load, |_| {
        let backend = inner.backends.get(&spec.backend).ok_or_else(|| {
            crate::backend::BackendError::new(
                "unknown_backend",
                format!("model.toml names backend '{}', which this server does not have", spec.backend),
            )
        })?;
        Ok(backend.load(&verified, &spec)?)
    })?;
    // The backend has what it read; the version's files close here.
    let manifest = verified.into_manifest();
    run.stage(Stage::Validate, |_| Ok(validate::validate(engine.as_ref(), &spec)?))?;
    let (samples, warmed) = run.stage(Stage::Warmup, |_| {
        let samples = warmup::samples(&dir, &spec, engine.as_ref())?;
        let warmed = warmup::run(engine.as_ref(), &samples, &spec)?;
        Ok((samples, warmed))
    })?;
    let bytes_held = inner.memory.trimmed_rss().unwrap_or(0).saturating_sub(rss_before);
    let keep = spec.policy.keep_previous;
    let timeout = Duration::from_millis(spec.policy.drain_timeout_ms);
    let version = Arc::new(Version::new(
        VersionParts { model, number, spec, manifest, warmup: samples, warmed, bytes_held, engine, heap: Some(heap) },
        Some(inner.releaser.clone()),
    ));
    // Tracked before the window closes, so that no free counts this
    // version's memory as unaccounted.
    inner.memory.track(&version);
    drop(window);
    Ok((version, keep, timeout))
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
    let old = run
        .stage(Stage::Commit, |run| {
            let mut replaced = None;
            let old = run.inner.publish(|models| {
                if let Some(route) = models.get_mut(&model)
                    && !route.previous.is_empty()
                {
                    let stable = route.previous.remove(0);
                    replaced = Some(std::mem::replace(&mut route.stable, stable).number());
                }
            });
            run.replaced = replaced;
            Ok(old)
        })
        .unwrap_or_else(|never: LoadError| unreachable!("commit cannot fail: {never}"));
    run.drain_then_finish(old, timeout, 0, State::Ready, reply);
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
    let old = run
        .stage(Stage::Commit, |run| {
            let old = run.inner.publish(|models| {
                if let Some(route) = models.get_mut(&model) {
                    route.previous.retain(|v| v.number() != version);
                }
            });
            run.replaced = Some(version);
            Ok(old)
        })
        .unwrap_or_else(|never: LoadError| unreachable!("commit cannot fail: {never}"));
    run.drain_then_finish(old, timeout, 0, State::Ready, reply);
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
    let mut run = Run::new(inner, busy, Operation::Unload);
    let old = run
        .stage(Stage::Commit, |run| {
            let mut replaced = None;
            let old = run.inner.publish(|models| replaced = models.remove(&model).map(|r| r.stable.number()));
            run.replaced = replaced;
            Ok(old)
        })
        .unwrap_or_else(|never: LoadError| unreachable!("commit cannot fail: {never}"));
    run.drain_then_finish(old, timeout, 0, State::Idle, reply);
    Ok(())
}
