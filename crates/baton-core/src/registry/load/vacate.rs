//! A load under the resource swap policy: once the candidate is fetched and
//! verified, the model's route gives way to a gate ([`Pause`]) in one store,
//! the old version's requests finish, and the keeper frees it; only then
//! does the candidate load, so that memory holds about one version at its
//! peak. Requests that arrive meanwhile wait at the gate. The commit puts
//! the new version in the route and opens the gate in one store. When the
//! candidate fails, the old version is loaded back from its files (verified
//! again: the bytes loaded must be the bytes hashed) and the gate opens on
//! it; the error still names the stage that failed.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{Files, Run, build, caught};
use crate::files::spec::ModelSpec;
use crate::registry::Inner;
use crate::registry::error::LoadError;
use crate::registry::events::{EventKind, Stage};
use crate::registry::pause::Pause;
use crate::registry::routing::ModelRoute;
use crate::run::version::Version;
use crate::threads::heap::HeapLease;

/// A model whose route gave way to its gate: the gate, and the version to
/// load back if the candidate fails.
pub(super) struct Vacated {
    gate: Arc<Pause>,
    /// The version that served before the pause.
    pub(super) number: u64,
    spec: Arc<ModelSpec>,
}

impl Vacated {
    /// On the agent, right after the store that ended the pause: opens the
    /// gate and announces it. Returns how long the pause lasted.
    pub(super) fn resume(self, inner: &Inner, model: &str, serving: Option<u64>, restored: bool) -> Duration {
        self.gate.open();
        let paused = self.gate.since().elapsed();
        tracing::info!(
            model,
            serving,
            restored,
            paused_ms = crate::human::fields::ms(paused),
            "The model's pause ended; waiting requests go on."
        );
        inner.emit(model, serving, EventKind::Resumed { paused, serving, restored });
        paused
    }
}

/// The versions in `model`'s route, which a resource swap frees before its
/// candidate loads, held weakly.
pub(super) fn leaving(inner: &Inner, model: &str) -> Vec<(u64, Weak<Version>)> {
    let current = inner.current();
    let route = current.model(model);
    route.map(|r| r.versions().map(|v| (v.number(), Arc::downgrade(v))).collect()).unwrap_or_default()
}

/// Stage `vacate`: the model's gate replaces its route, in one store made
/// on the agent; then waits, up to the old version's drain timeout, for the
/// requests holding the versions `numbers` (see [`leaving`]) to end and for the keeper to
/// free them. Past the timeout the load goes on, with those versions still
/// in memory until their last requests end.
pub(super) fn vacate(run: &mut Run, numbers: Vec<u64>) -> Result<(), LoadError> {
    let model = run.model().to_owned();
    let inner = Arc::clone(&run.inner);
    let stable = {
        let current = inner.current();
        current.model(&model).map(|r| (r.stable.number(), Arc::new(r.stable.spec().clone())))
    };
    let Some((number, spec)) = stable else { return Ok(()) };
    let candidate = run.version;
    run.stage(Stage::Vacate, |run| {
        let gate = Arc::new(Pause::new(number));
        inner.memory.forget_freed(&model);
        let (on_agent, name, closed) = (Arc::clone(&inner), model.clone(), Arc::clone(&gate));
        inner.agent.call(move || {
            let old = on_agent.publish_with(|models, paused| {
                models.remove(&name);
                paused.insert(name.clone(), closed);
            });
            // The old table goes when its last request lets go of it.
            drop(old);
            tracing::info!(model = %name, replacing = number, "Paused the model: its version is freed before the new one loads, and requests wait.");
            on_agent.emit(&name, candidate, EventKind::Paused { replacing: number });
        });
        let timeout = Duration::from_millis(spec.policy.drain_timeout_ms);
        run.vacated = Some(Vacated { gate, number, spec });
        let left = inner.memory.wait_freed(&model, &numbers, Instant::now() + timeout);
        if !left.is_empty() {
            let model = model.clone();
            inner.agent.send(move || {
                tracing::warn!(
                    model = %model,
                    versions = %crate::human::fields::list(&left),
                    "Versions being replaced were not freed within the drain timeout; the new version loads beside them."
                );
            });
        }
        Ok(())
    })
}

/// After a failed candidate: loads back the version the pause replaced
/// (outside the failed load's stage timings), then, on the agent, puts it
/// in the route and opens the gate in one store. If it cannot be loaded
/// back, the gate opens on no route and the model is not served.
pub(super) fn restore_and_resume(run: &mut Run, heap: &mut Option<HeapLease>) {
    let Some(vacated) = run.vacated.take() else { return };
    let (stages, current, candidate) = (std::mem::take(&mut run.stages), run.current, run.version);
    run.version = Some(vacated.number);
    let restored = caught(run, |run| restore(run, &vacated, heap));
    (run.stages, run.current, run.version) = (stages, current, candidate);
    let (inner, model) = (Arc::clone(&run.inner), run.model().to_owned());
    run.inner.agent.send(move || {
        let serving = restored.as_ref().ok().map(|v| v.number());
        inner.publish_with(|models, paused| {
            if let Ok(version) = &restored {
                models.insert(model.clone(), ModelRoute::new(Arc::clone(version), Vec::new()));
            }
            paused.remove(&model);
        });
        match &restored {
            Ok(_) => tracing::info!(model = %model, version = serving, "Loaded the old version back after the new one failed."),
            Err(error) => tracing::error!(
                model = %model,
                version = vacated.number,
                %error,
                "The old version could not be loaded back after the new one failed; the model is not served."
            ),
        }
        vacated.resume(&inner, &model, serving, serving.is_some());
    });
}

/// Loads the vacated version again from its files: fetched and verified
/// anew, then built without validation, which it passed before.
fn restore(run: &mut Run, vacated: &Vacated, heap: &mut Option<HeapLease>) -> Result<Arc<Version>, LoadError> {
    let (inner, model) = (Arc::clone(&run.inner), run.model().to_owned());
    let fetched = inner.source.fetch(&model, vacated.number)?;
    let verified = super::verify(&inner, &vacated.spec, &fetched)?;
    let dir = fetched.dir;
    build(run, Files { number: vacated.number, spec: Arc::clone(&vacated.spec), dir, verified }, heap, true)
}
