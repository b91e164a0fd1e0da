//! The coordinator of one fleet rollout: it reads the record, the
//! participants' acks and the replicas' registrations, decides the next
//! state and writes it with a compare-and-swap. Its whole state is the
//! record, so whoever holds the coordinator key can pick it up where a
//! dead coordinator left it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use baton_core::rollout::guard::{self, Outcome};
use baton_core::rollout::window::Sums;

use crate::error::ClusterError;
use crate::health::Health;
use crate::ops::{self, decide};
use crate::records::{
    Ack, FleetPhase, ReplicaRecord, RolloutRecord, StepSums, SwitchSummary, Switched, now_ms, now_us,
};
use crate::store::{Read, Store};

/// How often the coordinator looks again when nothing woke it.
const TICK: Duration = Duration::from_millis(100);
/// How long a look waits for changes that follow the one that woke it.
const BATCH: Duration = Duration::from_millis(5);
/// How long, after the final commit, it waits for every switch report.
const SWITCH_REPORTS: Duration = Duration::from_secs(10);

/// Takes the coordinator key of `model` under `lease`; whether it did.
pub async fn campaign(store: &Store, model: &str, me: &str, lease: i64) -> Result<bool, ClusterError> {
    store.create(&store.keys.coordinator(model), &me.to_owned(), Some(lease)).await
}

/// Gives the coordinator key back.
pub async fn resign(store: &Store, model: &str) {
    if let Err(error) = store.delete(&store.keys.coordinator(model)).await {
        tracing::debug!(model, %error, "Could not give the coordinator key back; its lease will.");
    }
}

/// Drives the rollout of `model` until it ends; the caller holds the
/// coordinator key. Returns the final record.
pub async fn coordinate(store: &Store, model: &str, me: &str, health: &Health) -> Result<RolloutRecord, ClusterError> {
    let mut events = store.watch(store.keys.root(), 0).await?;
    loop {
        let Some(read) = store.get::<RolloutRecord>(&store.keys.record(model)).await? else {
            return Err(ClusterError::Refused(format!("model {model} has no fleet rollout")));
        };
        if !read.value.phase.in_progress() {
            return finish(store, read, health).await;
        }
        let next = step(store, &read, me, health).await?;
        if next {
            continue;
        }
        // Woken by any change in the cluster, or after a tick. Changes that
        // follow within a few milliseconds (a fleet's acks arrive together)
        // are taken in the same look.
        tokio::select! {
            message = events.message() => {
                message?;
                let until = tokio::time::Instant::now() + BATCH;
                while let Ok(message) = tokio::time::timeout_at(until, events.message()).await {
                    message?;
                }
            }
            () = tokio::time::sleep(TICK) => {}
        }
    }
}

/// One look at a rollout in progress: writes the next state when there is
/// one (returns true), else returns false.
async fn step(store: &Store, read: &Read<RolloutRecord>, me: &str, health: &Health) -> Result<bool, ClusterError> {
    let record = &read.value;
    let model = record.model.as_str();
    let mut next = record.clone();
    let mut also = Vec::new();
    // Why the rollout ends here without promoting, counted once written.
    let mut ends: Option<&'static str> = None;
    match record.phase {
        FleetPhase::Preparing => {
            let (replicas, _) = store.list::<ReplicaRecord>(&store.keys.replicas()).await?;
            let live: BTreeSet<String> = replicas.into_iter().map(|r| r.value.id).collect();
            let (acks, _) = store.list::<Ack>(&store.keys.acks(model)).await?;
            let acks: BTreeMap<String, Ack> = acks
                .into_iter()
                .filter(|a| a.value.rollout == record.id)
                .map(|a| (a.name().to_owned(), a.value))
                .collect();
            // Participants that cannot take part, with why; and whether
            // any of them failed to prepare (rather than lost its lease).
            let mut trouble: Vec<(String, String)> = Vec::new();
            let mut failed = false;
            let mut waiting = Vec::new();
            for id in record.participants.iter().filter(|p| !record.missing.contains(p)) {
                match acks.get(id) {
                    Some(ack) if ack.ok => {}
                    Some(ack) => {
                        failed = true;
                        let stage = ack.stage.as_deref().unwrap_or("unknown stage");
                        let reason = ack.reason.as_deref().unwrap_or("no reason given");
                        trouble.push((id.clone(), format!("replica {id} could not prepare: {stage}: {reason}")));
                    }
                    None if !live.contains(id) => trouble.push((id.clone(), format!("replica {id} lost its lease"))),
                    None => waiting.push(id.clone()),
                }
            }
            if !trouble.is_empty() {
                if record.missing.len() + trouble.len() > record.plan.allow_missing {
                    let reason = trouble.iter().map(|(_, why)| why.as_str()).collect::<Vec<_>>().join("; ");
                    ends = Some(if failed { "prepare_failed" } else { "lease_lost" });
                    ops::end(&mut next, FleetPhase::Aborted, reason, me);
                } else {
                    for (id, why) in trouble {
                        decide(&mut next, "left_out", me, format!("{why}; the rollout goes on without it."));
                        next.missing.push(id);
                    }
                }
            } else if waiting.is_empty() {
                also.extend(commit(&mut next, 0, me, store).await?);
            } else if now_ms().saturating_sub(record.started_ms) > record.plan.prepare_timeout_ms {
                let reason = format!(
                    "prepare timed out after {} ms waiting for {}",
                    record.plan.prepare_timeout_ms,
                    waiting.join(", ")
                );
                ends = Some("prepare_timeout");
                ops::end(&mut next, FleetPhase::Aborted, reason, me);
            } else {
                return Ok(false);
            }
        }
        FleetPhase::Committed => {
            let due = record.judge_at_ms.is_some_and(|at| now_ms() >= at);
            if record.paused.is_some() || !due {
                return Ok(false);
            }
            also.extend(judge(store, &mut next, me).await?);
        }
        _ => return Ok(false),
    }
    if next.phase == FleetPhase::RolledBack {
        ends = Some("guards");
    } else if next.phase == FleetPhase::Aborted && ends.is_none() {
        ends = Some("no_members");
    }
    if store.swap(&store.keys.record(model), &next, read.revision, also).await? {
        if let Some(reason) = ends {
            health.aborted(reason);
        }
        tracing::info!(
            model,
            version = next.version,
            phase = next.phase.as_str(),
            step = ?next.step,
            "{}",
            next.decisions.last().map_or("", |d| d.message.as_str())
        );
    }
    Ok(true)
}

/// Commits step `index`: its subset switches to the candidate, or, at the
/// last step, every replica promotes it (and the committed version is
/// written in the same transaction).
async fn commit(
    next: &mut RolloutRecord,
    index: usize,
    me: &str,
    store: &Store,
) -> Result<Option<(String, Vec<u8>)>, ClusterError> {
    if index + 1 >= next.plan.steps.len() {
        return ops::promote(next, me, &store.keys).map(Some);
    }
    let counted: Vec<String> = next.participants.iter().filter(|p| !next.missing.contains(p)).cloned().collect();
    let members = if index == 0 && !next.plan.selector.is_empty() {
        let (replicas, _) = store.list::<ReplicaRecord>(&store.keys.replicas()).await?;
        let matching: BTreeSet<String> = replicas
            .into_iter()
            .filter(|r| next.plan.selector.iter().all(|(k, v)| r.value.labels.get(k) == Some(v)))
            .map(|r| r.value.id)
            .collect();
        counted.iter().filter(|p| matching.contains(*p)).cloned().collect()
    } else {
        let share = next.plan.steps[index] / 100.0;
        let count = ((share * counted.len() as f64).ceil() as usize).clamp(1, counted.len());
        let mut members = next.members.clone();
        members.extend(
            counted.iter().filter(|p| !next.members.contains(p)).take(count.saturating_sub(members.len())).cloned(),
        );
        members
    };
    if members.is_empty() {
        ops::end(next, FleetPhase::Aborted, "the selector matches no participant".into(), me);
        return Ok(None);
    }
    next.phase = FleetPhase::Committed;
    next.step = Some(index);
    next.members = members;
    next.commit_us = Some(now_us());
    next.switch_at_us = ops::switch_at(next);
    next.judge_at_ms = Some(now_ms() + next.plan.interval_ms);
    next.failures = 0;
    next.inconclusive = 0;
    let message = format!(
        "Fleet rollout of model {} version {} committed step {} on {} of {} replicas.",
        next.model,
        next.version,
        index + 1,
        next.members.len(),
        counted.len()
    );
    decide(next, "committed", me, message);
    Ok(None)
}

/// Judges the committed subset on what every participant observed during
/// the step, merged: the guards and their minimum samples hold fleet-wide.
async fn judge(store: &Store, next: &mut RolloutRecord, me: &str) -> Result<Option<(String, Vec<u8>)>, ClusterError> {
    let step = next.step.unwrap_or(0);
    let (reports, _) = store.list::<StepSums>(&store.keys.all_sums(&next.model)).await?;
    let mut merged = Sums::default();
    let mut replicas = 0;
    for report in reports.iter().filter(|r| r.value.rollout == next.id && r.value.step == step) {
        merged.merge(&report.value.sums);
        replicas += 1;
    }
    let window = merged.window();
    let mut verdict = guard::evaluate(&next.plan.guards, &window);
    verdict.reason = format!("{} (merged from {replicas} replicas)", verdict.reason);
    next.judge_at_ms = Some(now_ms() + next.plan.interval_ms);
    let written = match verdict.outcome {
        Outcome::Pass => {
            next.inconclusive = 0;
            commit(next, step + 1, me, store).await?
        }
        Outcome::Fail => {
            next.failures += 1;
            if next.failures >= next.plan.failure_limit {
                ops::end(next, FleetPhase::RolledBack, format!("the guards failed: {}", verdict.reason), me);
            } else {
                decide(next, "held", me, format!("A judgement failed ({}); the step holds.", verdict.reason));
            }
            None
        }
        Outcome::Inconclusive => {
            next.inconclusive += 1;
            if next.inconclusive >= next.plan.max_inconclusive {
                next.paused = Some(format!("{} judgements in a row were inconclusive", next.inconclusive));
                decide(next, "paused", me, format!("Paused: {}.", verdict.reason));
            } else {
                decide(next, "held", me, format!("Inconclusive: {}.", verdict.reason));
            }
            None
        }
    };
    if let Some(last) = next.decisions.last_mut() {
        last.verdict = Some(verdict);
    }
    Ok(written)
}

/// After the rollout ended: for a promotion, waits for every member's
/// switch report and files how far apart they switched.
async fn finish(store: &Store, read: Read<RolloutRecord>, health: &Health) -> Result<RolloutRecord, ClusterError> {
    let record = read.value;
    if record.phase != FleetPhase::Promoted || record.switch.is_some() {
        return Ok(record);
    }
    let deadline = tokio::time::Instant::now() + SWITCH_REPORTS;
    let mut stamps;
    loop {
        let (reports, _) = store.list::<Switched>(&store.keys.switches(&record.model)).await?;
        stamps = reports
            .into_iter()
            .filter(|r| r.value.rollout == record.id && r.value.phase == FleetPhase::Promoted)
            .map(|r| (r.value.seen_us, r.value.at_us))
            .collect::<Vec<_>>();
        if stamps.len() >= record.members.len() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    let Some(summary) = summarize(&stamps, record.commit_us.unwrap_or_default()) else { return Ok(record) };
    health.switched_fleet(&record.model, &summary);
    tracing::info!(
        model = %record.model,
        version = record.version,
        replicas = summary.replicas,
        skew_ms = summary.skew_ms,
        last_ms = summary.last_ms,
        "The fleet switched."
    );
    let mut filed = record.clone();
    filed.switch = Some(summary);
    store.swap(&store.keys.record(&record.model), &filed, read.revision, Vec::new()).await?;
    Ok(filed)
}

/// How far apart the switches (and the deliveries of the commit) are, and
/// how far after the commit write; `stamps` holds (seen, switched) pairs.
pub fn summarize(stamps: &[(u64, u64)], commit_us: u64) -> Option<SwitchSummary> {
    let spread = |values: Vec<u64>| -> Option<(u64, u64)> { Some((*values.iter().min()?, *values.iter().max()?)) };
    let (first, last) = spread(stamps.iter().map(|s| s.1).collect())?;
    let (first_seen, last_seen) = spread(stamps.iter().map(|s| s.0).collect())?;
    let ms = |us: i64| us as f64 / 1000.0;
    Some(SwitchSummary {
        replicas: stamps.len(),
        skew_ms: ms((last - first) as i64),
        first_ms: ms(first as i64 - commit_us as i64),
        last_ms: ms(last as i64 - commit_us as i64),
        delivery_skew_ms: ms(last_seen as i64 - first_seen as i64),
        last_seen_ms: ms(last_seen as i64 - commit_us as i64),
    })
}

#[cfg(test)]
mod tests {
    use super::summarize;

    #[test]
    fn the_skew_is_last_minus_first_and_delays_count_from_the_commit() {
        let stamps = [(1_001_000, 1_002_000), (1_000_100, 1_000_500), (1_003_000, 1_004_000)];
        let s = summarize(&stamps, 1_000_000).unwrap();
        assert_eq!((s.replicas, s.skew_ms, s.first_ms, s.last_ms), (3, 3.5, 0.5, 4.0));
        assert_eq!((s.delivery_skew_ms, s.last_seen_ms), (2.9, 3.0));
        assert!(summarize(&[], 0).is_none());
    }
}
