//! What anyone may do to a fleet rollout — start it, pause, resume,
//! promote, abort — as compare-and-swaps on its record. The coordinator
//! sees the change and acts on it; no operation waits for a coordinator.

use std::collections::BTreeSet;

use crate::error::ClusterError;
use crate::keys::Keys;
use crate::records::{Desired, FleetDecision, FleetPhase, FleetPlan, ReplicaRecord, RolloutRecord, now_ms, now_us};
use crate::store::{Read, Store, Txn, encode};

/// Decisions kept in a record.
const KEPT: usize = 32;

/// Adds a decision to a record, keeping the latest few.
pub fn decide(record: &mut RolloutRecord, action: &str, by: &str, message: String) {
    if record.decisions.len() == KEPT {
        record.decisions.remove(0);
    }
    record.decisions.push(FleetDecision {
        at_ms: now_ms(),
        action: action.into(),
        by: by.into(),
        verdict: None,
        message,
        unknown: crate::records::Unknown::new(),
    });
}

/// Starts a fleet rollout of `model` to `version`: every live replica that
/// serves the model takes part. Refused while another is in progress, when
/// no replica serves the model, or when the fleet serves `version` already.
pub async fn start(
    store: &Store,
    model: &str,
    version: u64,
    plan: FleetPlan,
    by: &str,
) -> Result<RolloutRecord, ClusterError> {
    plan.check().map_err(ClusterError::Refused)?;
    let keys = &store.keys;
    let existing: Option<Read<RolloutRecord>> = store.get(&keys.record(model)).await?;
    if let Some(r) = existing.as_ref().filter(|r| r.value.phase.in_progress()) {
        return Err(ClusterError::Refused(format!(
            "a fleet rollout of model {model} version {} is in progress ({}); abort it first",
            r.value.version,
            r.value.phase.as_str()
        )));
    }
    let desired: Option<Read<Desired>> = store.get(&keys.desired(model)).await?;
    let from = desired.map(|d| d.value.version);
    if from == Some(version) {
        return Err(ClusterError::Refused(format!("the fleet serves model {model} version {version} already")));
    }
    let (replicas, _) = store.list::<ReplicaRecord>(&keys.replicas()).await?;
    let participants: Vec<String> =
        replicas.into_iter().filter(|r| r.value.models.contains_key(model)).map(|r| r.value.id).collect();
    if participants.is_empty() {
        return Err(ClusterError::Refused(format!("no live replica serves model {model}")));
    }
    if plan.allow_missing >= participants.len() {
        return Err(ClusterError::Refused(format!(
            "allow_missing ({}) must be below the number of participants ({}): a rollout that may lose every \
             participant could commit on none",
            plan.allow_missing,
            participants.len()
        )));
    }
    let mut record = RolloutRecord::new(model, version, from, plan, participants);
    let message = format!(
        "Fleet rollout of model {model} version {version} began: {} replicas prepare it.",
        record.participants.len()
    );
    decide(&mut record, "started", by, message);
    // What an earlier rollout left behind goes in the same transaction,
    // so that it is never read as this one's, and never deleted when
    // this start loses a race.
    let key = keys.record(model);
    let txn = Txn::new()
        .if_changed_at(&key, existing.map_or(0, |r| r.revision))
        .put_record(&key, &record, None)?
        .delete_prefix(&keys.acks(model))
        .delete_prefix(&keys.switches(model))
        .delete_prefix(&keys.all_sums(model));
    if store.commit(txn).await?.is_none() {
        return Err(ClusterError::Conflict(format!("another rollout of model {model} began meanwhile")));
    }
    tracing::info!(model, version, participants = record.participants.len(), by, "A fleet rollout began.");
    Ok(record)
}

/// What an operator asks of a rollout in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Stop judging; the committed subset keeps the candidate.
    Pause,
    /// Judge again, from a fresh window.
    Resume,
    /// Every replica promotes the candidate now.
    Promote,
    /// Every replica drops the candidate now.
    Abort,
}

/// Applies an operator's request to the rollout of `model`, retrying when
/// the record changed meanwhile. Returns the record as written.
pub async fn request(store: &Store, model: &str, what: Request, by: &str) -> Result<RolloutRecord, ClusterError> {
    for _ in 0..20 {
        let Some(read) = store.get::<RolloutRecord>(&store.keys.record(model)).await? else {
            return Err(ClusterError::Refused(format!("model {model} has no fleet rollout")));
        };
        let mut record = read.value;
        if !record.phase.in_progress() {
            return Err(ClusterError::Refused(format!(
                "the fleet rollout of model {model} has ended ({})",
                record.phase.as_str()
            )));
        }
        let mut also = Vec::new();
        match what {
            Request::Pause => {
                record.paused = Some(format!("paused by {by}"));
                decide(&mut record, "paused", by, format!("Fleet rollout of model {model} paused by {by}."));
            }
            Request::Resume => {
                record.paused = None;
                record.inconclusive = 0;
                record.judge_at_ms = Some(now_ms() + record.plan.interval_ms);
                decide(&mut record, "resumed", by, format!("Fleet rollout of model {model} resumed by {by}."));
            }
            Request::Promote => {
                if record.phase != FleetPhase::Committed {
                    return Err(ClusterError::Refused(format!(
                        "the fleet rollout of model {model} is still preparing; promote once a subset is committed"
                    )));
                }
                also.push(promote(&mut record, by, &store.keys)?);
            }
            Request::Abort => {
                end(&mut record, FleetPhase::Aborted, format!("aborted by {by}"), by);
            }
        }
        if store.swap(&store.keys.record(model), &record, read.revision, also).await? {
            return Ok(record);
        }
    }
    Err(ClusterError::Conflict(format!("the record of model {model} kept changing")))
}

/// Moves a record to Promoted: every participant still counted switches
/// to the candidate. Returns the committed-version write that goes into the
/// same transaction.
pub fn promote(record: &mut RolloutRecord, by: &str, keys: &Keys) -> Result<(String, Vec<u8>), ClusterError> {
    let missing: BTreeSet<&String> = record.missing.iter().collect();
    record.members = record.participants.iter().filter(|p| !missing.contains(p)).cloned().collect();
    record.phase = FleetPhase::Promoted;
    record.step = Some(record.plan.steps.len() - 1);
    record.commit_us = Some(now_us());
    record.switch_at_us = switch_at(record);
    record.judge_at_ms = None;
    record.paused = None;
    let message = format!(
        "Fleet rollout of model {} version {} committed on every replica ({}).",
        record.model,
        record.version,
        record.members.len()
    );
    decide(record, "promoted", by, message);
    let desired = Desired { version: record.version, rollout: Some(record.id), at_ms: now_ms() };
    Ok((keys.desired(&record.model), encode(&desired)?))
}

/// When replicas switch to a step committed now: the commit time plus
/// the plan's lead, or on delivery when the lead is 0.
pub fn switch_at(record: &RolloutRecord) -> Option<u64> {
    let lead = record.plan.switch_lead_ms;
    (lead > 0).then(|| record.commit_us.unwrap_or_else(now_us) + lead * 1000)
}

/// Ends a record without promoting.
pub fn end(record: &mut RolloutRecord, phase: FleetPhase, reason: String, by: &str) {
    record.phase = phase;
    record.paused = None;
    record.judge_at_ms = None;
    let message = format!(
        "Fleet rollout of model {} version {} {}: {reason}.",
        record.model,
        record.version,
        if phase == FleetPhase::RolledBack { "was rolled back" } else { "was aborted" }
    );
    record.reason = Some(reason);
    decide(record, phase.as_str(), by, message);
}
