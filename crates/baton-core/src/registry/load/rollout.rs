//! The operations of a rollout that change the routing table: its start (a
//! candidate through the whole load transaction, then into the route beside
//! the stable version at the first step's weight), a new weight, the
//! promotion of the candidate and its removal. Each is one store.

use std::sync::Arc;
use std::time::Duration;

use super::{Change, Finish, Run, caught, prepare};
use crate::files::rollout_spec::Mode;
use crate::files::rollout_spec::RolloutPolicy;
use crate::registry::error::LoadError;
use crate::registry::events::{EventKind, State};
use crate::registry::{Busy, Inner, Operation, Reply};
use crate::rollout::control::{Action, By, Decision, Phase, Progress};
use crate::rollout::plan::{Overrides, Plan};
use crate::rollout::shadow::Shadow;
use crate::rollout::window::Observations;
use crate::rollout::{CopyGate, Rollout};
use crate::threads::heap::HeapLease;

/// How a rollout starts.
#[derive(Clone, Debug, Default)]
pub struct RolloutStart {
    /// The candidate; the newest complete version when `None`.
    pub version: Option<u64>,
    /// What the operator overrode of the model's `[rollout]` section.
    pub overrides: Overrides,
    /// A whole plan, as a restart restores it; overrides are then ignored.
    pub plan: Option<Plan>,
    /// The step to start at (0-based): a restart resumes where it was.
    pub step: usize,
    /// Start paused, for this reason.
    pub paused: Option<String>,
    /// Whether a restart restores it (rather than an operator or the
    /// repository watcher starting it).
    pub restored: bool,
    /// Steered by a fleet's coordinator: windows are not judged here; the
    /// coordinator moves the step and ends the rollout
    /// ([`crate::registry::Registry::step_rollout`] and
    /// [`crate::registry::Registry::end_rollout`]).
    pub steered: bool,
    /// The rollout's identity, which its outcome ids are bound to: a
    /// fleet's rollout id, so that every replica takes the ids any of them
    /// issued; a random one when `None`.
    pub id: Option<u64>,
}

fn refused(model: &str, reason: String) -> LoadError {
    LoadError::RolloutRefused { model: model.to_owned(), reason }
}

/// The plan a rollout runs under `section` (the candidate's `[rollout]`),
/// or why it cannot run.
fn plan_of(inner: &Inner, model: &str, start: &RolloutStart, section: &RolloutPolicy) -> Result<Plan, LoadError> {
    let plan = match start.plan.clone() {
        // A plan restored or sent whole is checked as a new one is.
        Some(plan) => plan.check(start.steered).map(|()| plan).map_err(|e| refused(model, e.to_string()))?,
        None => Plan::new(section, &start.overrides).map_err(|e| refused(model, e.to_string()))?,
    };
    // Metric guards need somewhere to read them, and a fleet's coordinator
    // has none: refused rather than inconclusive window after window.
    let unread = if plan.guards.metrics.is_empty() {
        None
    } else if start.steered {
        Some("metric guards are not judged in a fleet's rollouts yet; drop guards.metrics")
    } else if inner.metric_source.is_none() {
        Some("metric guards need a Prometheus to ask: start baton with --prometheus-url, or drop guards.metrics")
    } else {
        None
    };
    unread.map_or(Ok(plan), |reason| Err(refused(model, reason.to_owned())))
}

/// Every refusal a start can make that needs no loaded candidate, made
/// before anything loads: a `model.toml` that does not parse or a plan
/// that cannot run, no complete version, a candidate that already serves
/// as stable, no stable version, another rollout. Returns the candidate's
/// version, so that the one judged is the one loaded.
fn refusals_before_loading(run: &mut Run, start: &RolloutStart) -> Result<u64, LoadError> {
    let model = run.model().to_owned();
    let inner = Arc::clone(&run.inner);
    let spec = inner.source.spec(&model).map_err(LoadError::from_spec)?;
    plan_of(&inner, &model, start, &spec.rollout)?;
    let version = match start.version {
        Some(v) => v,
        None => *inner.source.versions(&model)?.last().ok_or_else(|| LoadError::NoVersion { model: model.clone() })?,
    };
    let current = inner.current();
    let route = current.model(&model).ok_or_else(|| LoadError::NotLoaded { model: model.clone() })?;
    if let Some(rollout) = &route.rollout {
        return Err(LoadError::RolloutInProgress { model, candidate: rollout.candidate.number() });
    }
    let stable = route.stable.number();
    if stable == version {
        return Err(refused(&model, already_stable(stable)));
    }
    if !route.stable.alive() {
        return Err(refused(&model, no_worker(stable)));
    }
    Ok(version)
}

/// Why a rollout of the stable version is refused.
fn already_stable(stable: u64) -> String {
    format!("version {stable} already serves as stable; there is nothing to roll out")
}

/// On a build thread: checks what can be checked before loading, loads the
/// candidate through the whole transaction, then has the agent put it into
/// the route.
pub(crate) fn start(inner: Arc<Inner>, busy: Busy, start: RolloutStart, reply: Reply, heap: HeapLease) {
    let mut run = Run::new(inner, busy, Operation::Rollout);
    let version = match caught(&mut run, |run| refusals_before_loading(run, &start)) {
        Ok(version) => version,
        Err(error) => return run.fail(error, reply),
    };
    let (candidate, _, timeout) = match caught(&mut run, |run| prepare(run, Some(version), &mut Some(heap), false)) {
        Ok(prepared) => prepared,
        Err(error) => return run.fail(error, reply),
    };
    let model = run.model().to_owned();
    // Checked again on the candidate's own `model.toml`, which may have
    // changed since.
    let plan = match plan_of(&run.inner, &model, &start, &candidate.spec().rollout) {
        Ok(plan) => plan,
        Err(error) => return run.fail(error, reply),
    };
    let (twin, twin_status) = super::twin::load(&mut run, &plan, candidate.spec().rollout.twin_max_mb);
    // The twin took a while: a candidate whose engine ended meanwhile is
    // not put in the route.
    if let Err(error) = super::ensure_alive(&candidate) {
        return run.fail(error, reply);
    }
    let observations = Arc::new(match twin {
        Some(_) => Observations::timing_stable_by_copies(),
        None => Observations::default(),
    });
    let salt = crate::rollout::assign::salt(&model, candidate.number());
    let id = start.id.unwrap_or_else(crate::rollout::outcome::random_u64);
    let rollout = Rollout {
        id,
        candidate: Arc::clone(&candidate),
        mode: plan.mode,
        weight: plan.steps[start.step.min(plan.steps.len() - 1)],
        paired: plan.paired,
        salt,
        outcomes: Arc::new(run.inner.outcome_key.outcomes(&model, id)),
        observations: Arc::clone(&observations),
        copies: Arc::new(CopyGate::new(plan.queue)),
        shadow: None,
        baseline: None,
        twin,
    };
    let finish = Finish::loaded(timeout, &candidate, reply);
    let agent = run.inner.agent.clone();
    let mut rollout = rollout;
    agent.send(move || {
        let current = run.inner.current();
        let stable = current.model(&model).map(|r| r.stable.number());
        let stable_ended = current.model(&model).is_some_and(|r| !r.stable.alive());
        let blocked = match (stable, current.model(&model).and_then(|r| r.rollout.as_ref())) {
            (None, _) => Some(LoadError::NotLoaded { model: model.clone() }),
            (_, Some(r)) => {
                Some(LoadError::RolloutInProgress { model: model.clone(), candidate: r.candidate.number() })
            }
            (Some(s), None) if s == candidate.number() => Some(refused(&model, already_stable(s))),
            (Some(s), None) if stable_ended => Some(refused(&model, no_worker(s))),
            _ => super::ensure_alive(&candidate).err(),
        };
        drop(current);
        if let Some(error) = blocked {
            return run.report_failure(error, finish.reply);
        }
        if rollout.mode == Mode::Shadow {
            let (nice, idle) = run.inner.lowering;
            let observations = Arc::clone(&rollout.observations);
            match Shadow::start(Arc::clone(&candidate), observations, run.inner.agent.clone(), nice, idle) {
                Ok(shadow) => rollout.shadow = Some(shadow),
                Err(error) => {
                    let reason = format!("could not start the thread that runs shadow copies: {error}");
                    return run.report_failure(refused(&model, reason), finish.reply);
                }
            }
        }
        let stable = stable.unwrap_or_default();
        let policy = &candidate.spec().policy;
        // A promotion is watched when the plan asks and the version it
        // replaces can stay loaded to go back to; a fleet's coordinator
        // decides for a steered rollout itself.
        let watchable = plan.watch().is_some()
            && !start.steered
            && policy.keep_previous >= 1
            && policy.swap == crate::files::spec::SwapPolicy::Availability;
        let mut progress = Progress::new(id, (stable, candidate.number()), plan, start.step, observations);
        progress.steered = start.steered;
        progress.watchable = watchable;
        progress.twin = twin_status;
        let by = match (start.steered, start.restored) {
            (true, _) => By::Fleet,
            (false, true) => By::Restart,
            (false, false) => By::Operator,
        };
        let decision = progress.decide(&model, Action::Started, by, None);
        if let Some(reason) = start.paused {
            progress.phase = Phase::Paused;
            progress.paused = Some(reason);
        }
        let paused = (progress.phase == Phase::Paused).then(|| progress.decide(&model, Action::Paused, by, None));
        run.inner.rollouts.lock().insert(model.clone(), progress);
        let route_model = model.clone();
        let change: Change = Box::new(move |models| {
            if let Some(route) = models.get_mut(&route_model) {
                route.rollout = Some(rollout);
            }
            None
        });
        run.inner.emit(&model, Some(decision.candidate), EventKind::rollout(decision));
        if let Some(paused) = paused {
            run.inner.emit(&model, Some(paused.candidate), EventKind::rollout(paused));
        }
        run.commit_then_drain(change, finish);
    });
}

/// Why a rollout is refused while stable version `stable` has lost its
/// engine (its worker process ended, and the server is loading it again).
pub(crate) fn no_worker(stable: u64) -> String {
    format!(
        "stable version {stable} has no worker (its worker process ended; the server loads it again): a rollout \
         would compare the candidate with a version that answers nothing; wait until it serves, or load a version"
    )
}

/// Publishes the candidate's new weight: one store, nothing to drain.
pub(crate) fn set_weight(inner: &Inner, model: &str, weight: u32) {
    inner.publish(|models| {
        if let Some(rollout) = models.get_mut(model).and_then(|r| r.rollout.as_mut()) {
            rollout.weight = weight;
        }
    });
}

/// Makes the candidate stable by one store; the old stable version is kept
/// as previous, as a load keeps it. Versions beyond `keep_previous` leave
/// and are drained. With `watch` (the observations of the watch after
/// promotion), the rollout stays in the route: the new stable version
/// answers everything and paired copies go to the old one, judged on
/// those observations until the watch ends.
pub(crate) fn promote(
    inner: Arc<Inner>,
    busy: Busy,
    reply: Reply,
    watch: Option<Arc<Observations>>,
    decision: Decision,
) -> Result<(), LoadError> {
    let model = busy.model.clone();
    let (candidate, keep, timeout) = {
        let current = inner.current();
        let rollout = current
            .model(&model)
            .and_then(|r| r.rollout.as_ref())
            .filter(|r| r.baseline.is_none())
            .ok_or_else(|| LoadError::NoRollout { model: model.clone() })?;
        let spec = rollout.candidate.spec();
        (rollout.candidate.number(), spec.policy.keep_previous, Duration::from_millis(spec.policy.drain_timeout_ms))
    };
    let mut run = Run::new(inner, busy, Operation::Promote);
    run.version = Some(candidate);
    let change: Change = Box::new(move |models| {
        let route = models.get_mut(&model)?;
        let rollout = route.rollout.take()?;
        rollout.stop_shadow();
        let old = std::mem::replace(&mut route.stable, Arc::clone(&rollout.candidate));
        let replaced = old.number();
        route.previous.retain(|v| v.number() != candidate);
        route.previous.insert(0, Arc::clone(&old));
        route.previous.truncate(keep);
        if let Some(observations) = watch {
            route.rollout = Some(Rollout {
                weight: crate::rollout::FULL,
                paired: true,
                observations,
                shadow: None,
                baseline: Some(old),
                twin: None,
                ..rollout
            });
        }
        Some(replaced)
    });
    run.announce = Some(decision);
    run.commit_then_drain(change, Finish::switched(timeout, State::Ready, reply));
    Ok(())
}

/// Ends the watch after a promotion by going back to the version the
/// promoted one replaced, by one store: it serves as stable again, and the
/// promoted version leaves and is drained.
pub(crate) fn restore(inner: Arc<Inner>, busy: Busy, reply: Reply, decision: Decision) -> Result<(), LoadError> {
    let model = busy.model.clone();
    let (baseline, timeout) = {
        let current = inner.current();
        let rollout = current.model(&model).and_then(|r| r.rollout.as_ref());
        let baseline =
            rollout.and_then(|r| r.baseline.as_ref()).ok_or_else(|| LoadError::NoRollout { model: model.clone() })?;
        (baseline.number(), Duration::from_millis(baseline.spec().policy.drain_timeout_ms))
    };
    let mut run = Run::new(inner, busy, Operation::Rollback);
    run.version = Some(baseline);
    let change: Change = Box::new(move |models| {
        let route = models.get_mut(&model)?;
        let rollout = route.rollout.take()?;
        let back = rollout.baseline?;
        route.previous.retain(|v| !Arc::ptr_eq(v, &back));
        let promoted = std::mem::replace(&mut route.stable, back);
        Some(promoted.number())
    });
    run.announce = Some(decision);
    run.commit_then_drain(change, Finish::switched(timeout, State::Ready, reply));
    Ok(())
}

/// Ends a watch after promotion that did not fail, by one store: the
/// comparison copies stop; the version it was judged against stays only as
/// previous.
pub(crate) fn end_watch(inner: Arc<Inner>, busy: Busy, reply: Reply, decision: Decision) -> Result<(), LoadError> {
    let model = busy.model.clone();
    let (stable, timeout) = {
        let current = inner.current();
        let route = current.model(&model).ok_or_else(|| LoadError::NoRollout { model: model.clone() })?;
        (route.stable.number(), Duration::from_millis(route.stable.spec().policy.drain_timeout_ms))
    };
    let mut run = Run::new(inner, busy, Operation::Promote);
    run.version = Some(stable);
    let change: Change = Box::new(move |models| {
        models.get_mut(&model)?.rollout.take();
        None
    });
    run.announce = Some(decision);
    run.commit_then_drain(change, Finish::switched(timeout, State::Ready, reply));
    Ok(())
}

/// Takes the candidate out of traffic by one store: its weight is 0 from
/// that table on; requests it is answering finish, then it is freed.
pub(crate) fn remove(inner: Arc<Inner>, busy: Busy, reply: Reply, decision: Decision) -> Result<(), LoadError> {
    let model = busy.model.clone();
    let (stable, timeout) = {
        let current = inner.current();
        let route = current.model(&model).ok_or_else(|| LoadError::NoRollout { model: model.clone() })?;
        let rollout = route.rollout.as_ref().ok_or_else(|| LoadError::NoRollout { model: model.clone() })?;
        (route.stable.number(), Duration::from_millis(rollout.candidate.spec().policy.drain_timeout_ms))
    };
    let mut run = Run::new(inner, busy, Operation::Abort);
    run.version = Some(stable);
    let change: Change = Box::new(move |models| {
        let rollout = models.get_mut(&model)?.rollout.take()?;
        rollout.stop_shadow();
        Some(rollout.candidate.number())
    });
    run.announce = Some(decision);
    run.commit_then_drain(change, Finish::switched(timeout, State::Ready, reply));
    Ok(())
}
