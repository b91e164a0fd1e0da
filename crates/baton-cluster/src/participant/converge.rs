//! The task that brings one model on one replica to what the fleet's
//! records say, one step at a time (see [`super::model`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Participant;
use super::model::{Action, Model, RELOAD_FIRST, RELOAD_LAST, RETRY_FIRST, RETRY_LAST, decide, wait};
use crate::backoff::Backoff;
use crate::node::{BUSY, Node, Refusal};
use crate::records::{Ack, FleetPhase, RolloutRecord, Switched, now_us};

/// The first and the longest wait before a prepare refused because the
/// node was busy asks again, when the node cannot say when it is free.
const BUSY_RETRY_FIRST: Duration = Duration::from_millis(100);
const BUSY_RETRY_LAST: Duration = Duration::from_secs(2);

/// Which switch a step makes.
#[derive(Clone, Copy)]
enum Switch {
    Share,
    Promote,
}

impl<N: Node> Participant<N> {
    /// Converges `model` for as long as the participant runs.
    pub(super) async fn converge(self: Arc<Self>, model: Arc<Model>) {
        let mut changes = model.subscribe();
        let mut retry = Backoff::new(RETRY_FIRST, RETRY_LAST);
        // Whole loads of a committed version the node refused: the version,
        // and when it may be tried again.
        let mut reload = Backoff::new(RELOAD_FIRST, RELOAD_LAST);
        let mut refused: Option<(u64, Instant)> = None;
        loop {
            changes.borrow_and_update();
            let now = Instant::now();
            // Whether this step is a whole load of the committed version.
            let mut whole = false;
            let serving = self.node.serving(&model.name);
            let (action, committed) = {
                let view = model.view.lock();
                (decide(&self.config.id, &view, &serving, now), view.committed())
            };
            let result = match action {
                Action::Settled => {
                    self.set_problem(&model, None, true);
                    retry.reset();
                    wait(&mut changes, None).await;
                    continue;
                }
                Action::Prepare { rollout, version, retry: again } => {
                    if serving.stable == committed {
                        // It serves the committed version: ready meanwhile.
                        self.set_problem(&model, None, true);
                    }
                    self.prepare(&model, rollout, version, again).await.map_err(|r| ("prepare".to_owned(), r))
                }
                Action::Hold { why } => {
                    if model.view.lock().problem.is_none() {
                        self.set_problem(&model, Some(why), false);
                    }
                    retry.reset();
                    wait(&mut changes, None).await;
                    continue;
                }
                Action::Share { at, .. } | Action::Promote { at, .. } if at > now => {
                    // The named instant: a newer record wakes it earlier.
                    wait(&mut changes, Some(at)).await;
                    continue;
                }
                Action::Share { record, .. } => {
                    self.switch(&model, &record, Switch::Share).await.map_err(|r| ("switch".to_owned(), r))
                }
                Action::Promote { record, .. } => {
                    self.switch(&model, &record, Switch::Promote).await.map_err(|r| ("switch".to_owned(), r))
                }
                Action::Drop { rolled_back } => self
                    .node
                    .drop_candidate(&model.name, rolled_back)
                    .await
                    .map_err(|r| ("drop the candidate".to_owned(), r)),
                Action::Converge { version } if refused.is_some_and(|(v, at)| v == version && now < at) => {
                    // Refused before: not tried again before its time,
                    // whatever else changes in the records meanwhile.
                    wait(&mut changes, refused.map(|(_, at)| at)).await;
                    continue;
                }
                Action::Converge { version } => {
                    whole = true;
                    if refused.is_some_and(|(v, _)| v != version) {
                        // Another version: tried at once, and afresh.
                        reload.reset();
                    }
                    // A retry leaves the last failure's reason up meanwhile.
                    if model.view.lock().unloadable != Some(version) {
                        let why = format!("loading version {version}, which the fleet committed");
                        self.set_problem(&model, Some(why), false);
                    }
                    tracing::info!(model = %model.name, version, replica = %self.config.id, "Converging on the version the fleet committed.");
                    let result = self.node.converge(&model.name, version).await;
                    match &result {
                        Ok(()) => {
                            tracing::info!(model = %model.name, version, "Converged.");
                            reload.reset();
                            refused = None;
                        }
                        // Said in the registration (its note), and the next
                        // rollout is prepared without loading it first.
                        Err(refusal) => {
                            model.view.lock().unloadable = Some(version);
                            // A version it could not fetch, or whose model.toml
                            // did not parse, is tried as any step: nothing loaded.
                            let costly = !matches!(refusal.stage.as_str(), "config" | "fetch" | BUSY);
                            refused = costly.then(|| (version, Instant::now() + reload.next_wait()));
                        }
                    }
                    result.map_err(|r| (format!("load version {version}, which the fleet committed"), r))
                }
            };
            match result {
                Ok(()) => {
                    retry.reset();
                    // What it serves may have changed: the fleet hears of it now.
                    self.registration_due.notify_one();
                }
                Err((what, refusal)) => {
                    let after = match refused {
                        Some((_, at)) if whole && at > Instant::now() => at - Instant::now(),
                        _ => retry.next_wait(),
                    };
                    tracing::error!(
                        model = %model.name,
                        replica = %self.config.id,
                        %refusal,
                        retry_ms = after.as_millis() as u64,
                        "Could not {what} as the fleet's records say; not ready, and trying again."
                    );
                    self.set_problem(&model, Some(format!("could not {what}: {refusal}; trying again")), false);
                    wait(&mut changes, Some(Instant::now() + after)).await;
                }
            }
        }
    }

    /// Records why the model is not served as the fleet says (or that it
    /// is), in its view, in health and in readiness.
    fn set_problem(&self, model: &Model, problem: Option<String>, settled: bool) {
        {
            let mut view = model.view.lock();
            view.problem.clone_from(&problem);
            view.settled |= settled;
        }
        self.health.problem(&model.name, problem);
        self.report_ready();
    }

    /// Prepares the candidate and acks under the session's lease. A
    /// failure is acked with its stage and reason, and not retried, unless
    /// `retry` (a subset member whose candidate is gone loads it again).
    async fn prepare(&self, model: &Model, rollout: u64, version: u64, retry: bool) -> Result<(), Refusal> {
        let name = &model.name;
        let started = Instant::now();
        tracing::info!(model = %name, version, "Preparing a fleet rollout's candidate.");
        let result = self.prepare_when_free(model, rollout, version).await;
        let prepare_ms = started.elapsed().as_millis() as u64;
        self.health.prepared(name, started.elapsed().as_secs_f64());
        let mut ack = Ack { rollout, ok: result.is_ok(), stage: None, reason: None, prepare_ms };
        match &result {
            Ok(()) => tracing::info!(model = %name, version, prepare_ms, "Prepared."),
            Err(r) => {
                tracing::warn!(model = %name, version, refusal = %r, "Could not prepare.");
                (ack.stage, ack.reason) = (Some(r.stage.clone()), Some(r.reason.clone()));
            }
        }
        model.update(|v| v.prepared = Some((rollout, ack)));
        self.write_ack(model).await;
        if retry { result } else { Ok(()) }
    }

    /// Asks the node to prepare; while it refuses because another
    /// operation of the model is under way (the drain after the last
    /// switch, say), waits for that to end and asks again, until the
    /// rollout's prepare timeout as this replica measures it, or until the
    /// rollout is no longer in progress.
    async fn prepare_when_free(&self, model: &Model, rollout: u64, version: u64) -> Result<(), Refusal> {
        let name = &model.name;
        let mut changes = model.subscribe();
        // A node that cannot say when it is free is asked again on a timer.
        let mut again = Backoff::new(BUSY_RETRY_FIRST, BUSY_RETRY_LAST);
        let result = loop {
            changes.borrow_and_update();
            let Some(deadline) = model.view.lock().prepare_deadline(rollout) else {
                let reason = "the rollout ended before the node could prepare".to_owned();
                break Err(Refusal { stage: BUSY.to_owned(), reason });
            };
            let refusal = match self.node.prepare_for(name, version, rollout).await {
                Err(refusal) if refusal.stage == BUSY => refusal,
                other => break other,
            };
            if Instant::now() >= deadline {
                let reason = format!("{}; it did not end within the rollout's prepare timeout", refusal.reason);
                break Err(Refusal { stage: refusal.stage, reason });
            }
            if !self.health.state().waiting.contains_key(name) {
                tracing::info!(model = %name, version, reason = %refusal.reason, "A fleet prepare waits for another operation of the model to end.");
            }
            self.health.waiting(name, Some(format!("prepare of version {version} waits: {}", refusal.reason)));
            let retry_at = (Instant::now() + again.next_wait()).min(deadline);
            tokio::select! {
                () = self.node.until_free(name) => {}
                () = tokio::time::sleep_until(retry_at.into()) => {}
                // The record changed: the rollout may have ended.
                _ = changes.changed() => {}
            }
        };
        self.health.waiting(name, None);
        result
    }

    /// Writes the prepare's ack under the session's lease, unless it was
    /// written under that lease already or the rollout moved on. With no
    /// session, the next one writes it.
    pub(super) async fn write_ack(&self, model: &Model) {
        // A new process of an upgrade acks once it acts for the replica:
        // what the old one acked stands meanwhile.
        if !self.health.acting() {
            return;
        }
        let Some(session) = self.session.borrow().clone() else { return };
        let ack = {
            let view = model.view.lock();
            let preparing = view.record.as_ref().map(|(r, _)| (r.id, r.phase));
            match &view.prepared {
                Some((id, ack))
                    if preparing == Some((*id, FleetPhase::Preparing)) && view.acked != Some((*id, session.lease)) =>
                {
                    ack.clone()
                }
                _ => return,
            }
        };
        let key = session.store.keys.ack(&model.name, &self.config.id);
        match session.store.put(&key, &ack, Some(session.lease)).await {
            Ok(_) => model.view.lock().acked = Some((ack.rollout, session.lease)),
            Err(error) => tracing::warn!(model = %model.name, %error, "Could not ack the prepare; trying again."),
        }
    }

    /// Switches as the record's step says, then reports when, if this
    /// process acts for the replica (a new process of an upgrade switches
    /// with the old one, which reports).
    async fn switch(&self, model: &Model, record: &RolloutRecord, how: Switch) -> Result<(), Refusal> {
        let seen_us = now_us();
        match how {
            Switch::Share => self.node.share_all(&model.name).await?,
            Switch::Promote => self.node.promote(&model.name).await?,
        }
        let at_us = now_us();
        let delay_us = at_us as i64 - record.commit_us.unwrap_or(at_us) as i64;
        self.health.switched(&model.name, delay_us as f64 / 1e6);
        let phase = match how {
            Switch::Share => FleetPhase::Committed,
            Switch::Promote => FleetPhase::Promoted,
        };
        let seen_us = model.view.lock().seen_wall_us().unwrap_or(seen_us);
        let report = Switched { rollout: record.id, phase, step: record.step, at_us, seen_us, delay_us };
        if !self.health.acting() {
            return Ok(());
        }
        let Some(session) = self.session.borrow().clone() else { return Ok(()) };
        let key = session.store.keys.switched(&model.name, &self.config.id);
        if let Err(error) = session.store.put(&key, &report, None).await {
            tracing::warn!(model = %model.name, %error, "Could not report the switch.");
        }
        Ok(())
    }
}
