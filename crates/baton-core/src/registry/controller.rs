//! The rollout controller: a thread at serving priority that judges every
//! rollout window when it ends, reads the metric guards for it, and applies
//! what each decision changes (a weight, a promotion and its watch, a
//! rollback), each by one store; and the bookkeeping of rollouts that end.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::{Busy, Inner};
use crate::registry::error::LoadError;
use crate::registry::events::EventKind;
use crate::registry::load;
use crate::rollout::control::{Action, By, Decision, Effect, Phase};
use crate::rollout::metric;
use crate::rollout::window::{MetricReading, Observations};

/// How often the controller looks for windows to judge.
const TICK: std::time::Duration = std::time::Duration::from_millis(50);

/// Starts the thread that judges rollout windows, at the caller's (serving)
/// priority. It holds the registry weakly and ends with it.
pub(super) fn start_controller(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    let spawned = std::thread::Builder::new().name("baton-rollout".into()).spawn(move || {
        while let Some(inner) = weak.upgrade() {
            inner.judge_due_windows();
            drop(inner);
            std::thread::sleep(TICK);
        }
    });
    if let Err(error) = spawned {
        tracing::error!(%error, "Could not start the rollout controller; rollouts will not advance by themselves.");
    }
}

impl Inner {
    /// Judges every rollout window that has run its interval, and applies
    /// what each decision changes. A model another operation holds is
    /// judged on a later tick.
    ///
    /// The metric guards are read first, holding nothing of the model: a
    /// slow Prometheus (up to its timeout) delays this judgement, never an
    /// operator's command. Only then is the model claimed, the rollout
    /// checked to be the one read for and still due, and the window taken,
    /// judged and applied. The whole judgement is in flight for the hold
    /// ([`super::hold`]): one the hold overtook is dropped, and its window
    /// stays open to be judged once released.
    pub(super) fn judge_due_windows(self: &Arc<Self>) {
        if self.hold.is_held() {
            return;
        }
        let now = std::time::Instant::now();
        let due: Vec<(String, u64)> =
            self.rollouts.lock().iter().filter(|(_, p)| p.due(now)).map(|(m, p)| (m.clone(), p.id)).collect();
        for (model, id) in due {
            // A model another operation holds is judged on a later tick;
            // its Prometheus is not asked for nothing meanwhile.
            if Busy::is_taken(self, &model) {
                continue;
            }
            let Some(judging) = self.hold.begin() else { return };
            let metrics = self.read_metrics(&model);
            let Some(_applying) = judging.apply() else {
                tracing::info!(model = %model, "Rollouts were held while a window was read; it is judged once released.");
                return;
            };
            let Ok(busy) = Busy::take(self, &model) else { continue };
            // Ended, replaced, paused or steered while its numbers were read.
            let now = std::time::Instant::now();
            if !self.rollouts.lock().get(&model).is_some_and(|p| p.id == id && p.due(now)) {
                continue;
            }
            let current = self.current();
            let Some(rollout) = current.model(&model).and_then(|r| r.rollout.as_ref()).filter(|r| r.id == id) else {
                continue;
            };
            let mut window = rollout.observations.take();
            drop(current);
            window.metrics = metrics;
            let judged = self.rollouts.lock().get_mut(&model).map(|p| p.judge(&model, window));
            let Some((decision, effect)) = judged else { continue };
            tracing::info!(
                model = %model,
                candidate = decision.candidate,
                action = decision.action.as_str(),
                weight_percent = decision.weight_percent,
                "{}",
                decision.message
            );
            // Every decision is announced once what it changes is in the
            // table: a new weight here, a promotion or a rollback by the
            // store that applies it.
            let (tx, _ignored) = oneshot::channel();
            let applied = match effect {
                Effect::None | Effect::Weight(_) => {
                    if let Effect::Weight(weight) = effect {
                        load::rollout::set_weight(self, &model, weight);
                    }
                    self.emit(&model, Some(decision.candidate), EventKind::rollout(decision));
                    Ok(())
                }
                Effect::Promote => {
                    self.file_ended(&model);
                    load::rollout::promote(Arc::clone(self), busy, tx, None, decision)
                }
                Effect::Watch => {
                    let observations = self.start_watch(&model);
                    load::rollout::promote(Arc::clone(self), busy, tx, Some(observations), decision)
                }
                Effect::RollBack => {
                    self.file_ended(&model);
                    load::rollout::remove(Arc::clone(self), busy, tx, decision)
                }
                Effect::Restore => {
                    self.file_ended(&model);
                    load::rollout::restore(Arc::clone(self), busy, tx, decision)
                }
                Effect::EndWatch => {
                    self.file_ended(&model);
                    load::rollout::end_watch(Arc::clone(self), busy, tx, decision)
                }
            };
            if let Err(error) = applied {
                tracing::error!(model = %model, %error, "A rollout decision could not be applied.");
            }
        }
    }

    /// The metric guards of `model`'s rollout, read for the window that just
    /// ended: both sides, or during the watch the promoted version alone.
    pub(super) fn read_metrics(&self, model: &str) -> Vec<MetricReading> {
        let asked = self.rollouts.lock().get(model).filter(|p| !p.plan.guards.metrics.is_empty()).map(|p| {
            let watching = p.phase == Phase::Watching;
            (p.plan.guards.clone(), (!watching).then_some(p.stable), p.candidate, p.plan.interval_ms)
        });
        let Some((guards, stable, candidate, window_ms)) = asked else { return Vec::new() };
        let sides = metric::Sides { model, stable, candidate, window_ms };
        metric::read(self.metric_source.as_deref(), &guards, sides)
    }

    /// Ends the rollout of `model` by an operator's `action`, in `phase`:
    /// records the decision and files the rollout's final status. Returns
    /// the decision, for the store that applies it to announce.
    pub(super) fn end_rollout(&self, model: &str, action: Action, phase: Phase, by: By) -> Result<Decision, LoadError> {
        let decision = {
            let mut rollouts = self.rollouts.lock();
            let progress = rollouts.get_mut(model).ok_or_else(|| LoadError::NoRollout { model: model.to_owned() })?;
            progress.phase = phase;
            progress.paused = None;
            progress.decide(model, action, by, None)
        };
        tracing::info!(model, candidate = decision.candidate, action = action.as_str(), "{}", decision.message);
        self.file_ended(model);
        Ok(decision)
    }

    /// Records an operator's (or a fleet's) promotion of `model`'s
    /// candidate; starts the watch after it when the rollout is watchable.
    /// Returns the decision, for the store that applies it to announce, and
    /// the watch's observations.
    pub(super) fn promotion(&self, model: &str, by: By) -> Result<(Decision, Option<Arc<Observations>>), LoadError> {
        let (decision, watched) = {
            let mut rollouts = self.rollouts.lock();
            let progress = rollouts.get_mut(model).ok_or_else(|| LoadError::NoRollout { model: model.to_owned() })?;
            progress.paused = None;
            let (action, effect) = progress.promotion();
            (progress.decide(model, action, by, None), effect == Effect::Watch)
        };
        tracing::info!(model, candidate = decision.candidate, "{}", decision.message);
        if watched {
            return Ok((decision, Some(self.start_watch(model))));
        }
        self.file_ended(model);
        Ok((decision, None))
    }

    /// Starts the watch after `model`'s promotion, on fresh observations.
    pub(super) fn start_watch(&self, model: &str) -> Arc<Observations> {
        let observations = Arc::new(Observations::default());
        if let Some(progress) = self.rollouts.lock().get_mut(model) {
            progress.start_watch(Arc::clone(&observations));
        }
        observations
    }

    /// Moves an ended rollout's status from the controller to the model's
    /// record.
    pub(super) fn file_ended(&self, model: &str) {
        // Filed before it leaves the controller, so that a reader always
        // finds it in one place or the other.
        let Some(status) = self.rollouts.lock().get(model).map(|p| p.status(model)) else { return };
        self.models.lock().entry(model.to_owned()).or_default().ended_rollout = Some(status);
        self.rollouts.lock().remove(model);
    }
}
