//! A rollout's twin of its stable version: the same verified files loaded
//! a second time, with weights of their own, to run the paired comparison
//! copies (see [`crate::rollout::Rollout::twin`] for why).
//!
//! The twin is built during the rollout's start, after the candidate, on
//! a build thread of its own so that its memory sits in an allocator arena
//! of its own and goes back whole when the rollout ends. It goes through
//! fetch, verify, load and warmup (on the samples the stable version
//! passed), against the memory budgets; validation it passed as the stable
//! version. A twin that cannot be had never fails the rollout: the stable
//! version then runs the copies, as without one, and status says why.

use std::sync::Arc;

use super::{Growth, Run, budgets, caught, engine};
use crate::files::rollout_spec::Mode;
use crate::registry::Inner;
use crate::registry::budget::Basis;
use crate::registry::error::LoadError;
use crate::registry::events::Stage;
use crate::rollout::control::TwinStatus;
use crate::rollout::plan::Plan;
use crate::run::version::{Version, VersionParts};
use crate::threads::heap::HeapLease;

const MIB: u64 = 1 << 20;

/// Loads a twin of the model's stable version for a rollout by `plan`,
/// when its paired copies need one and the stable version is at most
/// `max_mb` MiB; returns it, or why there is none.
pub(super) fn load(run: &mut Run, plan: &Plan, max_mb: u64) -> (Option<Arc<Version>>, TwinStatus) {
    let stable = run.inner.current().model(run.model()).map(|route| Arc::clone(&route.stable));
    let unneeded = match (&stable, plan.mode, plan.paired) {
        (None, _, _) => Some("no stable version serves".to_owned()),
        (_, Mode::Shadow, _) => Some("a shadow's copies run on the candidate, not on the stable version".to_owned()),
        (_, _, false) => Some("the plan pairs no copies with the stable version".to_owned()),
        _ if max_mb == 0 => Some("twin_max_mb = 0".to_owned()),
        (Some(stable), _, _) if stable.holds() > max_mb.saturating_mul(MIB) => Some(format!(
            "the stable version holds {} MiB, more than twin_max_mb = {max_mb}",
            stable.holds().div_ceil(MIB)
        )),
        _ => None,
    };
    let (Some(stable), None) = (stable, unneeded.as_ref()) else {
        return (None, TwinStatus { loaded: false, bytes_held: None, reason: unneeded });
    };
    let inner = Arc::clone(&run.inner);
    match caught(run, |run| run.stage(Stage::Twin, |_| on_own_heap(&inner, &stable))) {
        Ok(twin) => {
            let status = TwinStatus { loaded: true, bytes_held: Some(twin.bytes_held()), reason: None };
            (Some(twin), status)
        }
        Err(error) => {
            let (model, version, reason) = (stable.model().to_owned(), stable.number(), error.to_string());
            crate::threads::agent::at_serving_priority(move || {
                tracing::warn!(
                    %model,
                    version,
                    %reason,
                    "Could not load a twin of the stable version; the stable version runs the paired copies."
                );
            });
            (None, TwinStatus { loaded: false, bytes_held: None, reason: Some(format!("loading it failed: {error}")) })
        }
    }
}

/// Builds the twin on a build thread of its own, waiting for it.
fn on_own_heap(inner: &Arc<Inner>, stable: &Arc<Version>) -> Result<Arc<Version>, LoadError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (inner, stable) = (Arc::clone(inner), Arc::clone(stable));
    let step_aside = inner.step_aside;
    crate::threads::heap::build_on_own_heap(step_aside, move |heap| {
        let _ = tx.send(build(&inner, &stable, heap));
    });
    rx.recv().map_err(|_| LoadError::Panicked {
        stage: Stage::Twin,
        message: "the twin's build thread ended without an answer".to_owned(),
    })?
}

/// Fetches, verifies, loads and warms a second instance of `stable`.
fn build(inner: &Arc<Inner>, stable: &Version, heap: HeapLease) -> Result<Arc<Version>, LoadError> {
    let (model, number) = (stable.model(), stable.number());
    let spec = Arc::new(stable.spec().clone());
    let fetched = inner.source.fetch(model, number)?;
    let verified = super::verify(inner, &spec, &fetched)?;
    if verified.manifest() != stable.manifest() {
        let reason = format!("the manifest of version {number} changed since it loaded");
        return Err(LoadError::RolloutRefused { model: model.to_owned(), reason });
    }
    // Refused on what the stable version holds before anything loads.
    let fits = |(held, basis): (u64, Basis)| budgets(inner, model, &spec, Vec::new()).admit(model, number, held, basis);
    fits((stable.holds(), Basis::Footprint))?;
    let growth = Growth::start(inner);
    // Weights of its own: sharing the stable version's would share its warmth.
    let engine = engine(inner, &spec, &verified, true)?;
    fits(growth.holds(engine.as_ref()))?;
    let manifest = verified.into_manifest();
    let samples = stable.warmup().to_vec();
    let warmed = super::warmup::run(engine.as_ref(), &samples, &spec)?;
    fits(growth.holds(engine.as_ref()))?;
    let bytes_held = growth.grown();
    let parts = VersionParts {
        model: model.to_owned(),
        number,
        spec,
        manifest,
        warmup: samples,
        warmed,
        bytes_held,
        engine,
        twin: true,
        heap: Some(heap),
    };
    Ok(growth.track(parts))
}
