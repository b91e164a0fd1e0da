//! The coordinator of one fleet rollout. It keeps a view of the rollout
//! from one watch ([`view`]), decides the next state and writes it with a
//! compare-and-swap fenced by its coordinator key: a write succeeds only
//! while the record is unchanged and the key is still the one this
//! coordinator created. Its whole state is the record, so whoever holds
//! the key next picks it up where a dead coordinator left it.
//!
//! Every deadline (the prepare timeout, the next judgement) is measured on
//! the coordinator's own monotonic clock from when it saw the phase begin;
//! no wall-clock time written by another process moves one. A coordinator
//! that takes over from another process starts these clocks afresh; one
//! that takes its own process's key over (its session was lost and found
//! again with the lease alive) goes on with them ([`Clocks`]).
//!
//! A plan may carry guards a newer baton added, which this one cannot
//! judge: a committed step of such a plan is paused, naming them, rather
//! than judged on the guards this baton knows.

mod view;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::rollout::guard::{self, Outcome};
use baton_core::rollout::window::Sums;
use baton_core::threads::sync::Lock;

use crate::error::ClusterError;
use crate::health::Health;
use crate::ops::{self, decide};
use crate::records::{FleetPhase, RolloutRecord, SwitchSummary, now_ms, now_us};
use crate::store::{Read, Store, Txn};
use view::View;

/// How long a look waits for changes that follow the one that woke it.
const BATCH: Duration = Duration::from_millis(5);
/// How long, after the final commit, it waits for every switch report.
const SWITCH_REPORTS: Duration = Duration::from_secs(10);
/// Names listed in a reason, at most; the rest are counted.
const NAMED: usize = 5;

/// Holding a coordinator key: the revisions it was created and last
/// written at (the fence every write checks) and the lease it lives under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tenure {
    /// The key's creation revision.
    pub created: i64,
    /// The revision this process took the key at: its epoch as the
    /// coordinator.
    pub revision: i64,
    /// The lease it lives under.
    pub lease: i64,
}

impl Tenure {
    /// `txn`, only while the coordinator key of `model` is this tenure's.
    fn fence(&self, store: &Store, model: &str, txn: Txn) -> Txn {
        let key = store.keys.coordinator(model);
        txn.if_created_at(&key, self.created).if_changed_at(&key, self.revision)
    }
}

/// Takes the coordinator key of `model` under `lease`: the tenure, or
/// `None` when someone holds it.
pub async fn campaign(store: &Store, model: &str, me: &str, lease: i64) -> Result<Option<Tenure>, ClusterError> {
    let created = store.create(&store.keys.coordinator(model), &me.to_owned(), Some(lease)).await?;
    Ok(created.map(|created| Tenure { created, revision: created, lease }))
}

/// Takes over the coordinator key of `model` that this replica holds under
/// `lease`, created at `created`, from an earlier process of the same
/// replica (an upgrade, or this process before a reconnect): rewrites it,
/// which gives it a new revision, the new tenure's epoch. Every write
/// fenced by an earlier epoch is refused from then on. `None` when the key
/// is gone or another's.
pub async fn take_over(
    store: &Store,
    model: &str,
    me: &str,
    lease: i64,
    created: i64,
) -> Result<Option<Tenure>, ClusterError> {
    let key = store.keys.coordinator(model);
    let txn = Txn::new().if_created_at(&key, created).put_record(&key, &me.to_owned(), Some(lease))?;
    Ok(store.commit(txn).await?.map(|revision| Tenure { created, revision, lease }))
}

/// Gives the coordinator key back, if it is still the one of `tenure`.
pub async fn resign(store: &Store, model: &str, tenure: Tenure) {
    let key = store.keys.coordinator(model);
    if let Err(error) = store.commit(tenure.fence(store, model, Txn::new()).delete(&key)).await {
        tracing::debug!(model, %error, "Could not give the coordinator key back; its lease will.");
    }
}

/// The coordinator's clocks, on its own monotonic time.
#[derive(Debug, Default)]
struct Clock {
    /// The record's rollout, phase, step and pause, as last seen.
    key: Option<(u64, FleetPhase, Option<usize>, bool)>,
    /// When this coordinator saw that key first.
    since: Option<Instant>,
    /// When it last judged the step.
    judged: Option<Instant>,
}

impl Clock {
    fn observe(&mut self, record: &RolloutRecord) {
        let key = (record.id, record.phase, record.step, record.paused.is_some());
        if self.key != Some(key) {
            self.key = Some(key);
            self.since = Some(Instant::now());
            self.judged = None;
        }
    }

    fn since(&self) -> Instant {
        self.since.unwrap_or_else(Instant::now)
    }
}

/// The clocks of one process's coordinators, per model, kept with the
/// creation revision of the coordinator key they were measured under. A
/// key taken over by the process that held it keeps its creation revision
/// (nobody else held it meanwhile), so the new tenure goes on with the
/// clocks; a key created anew starts them afresh.
#[derive(Debug, Default)]
pub struct Clocks(Lock<BTreeMap<String, Kept>>);

/// One model's clocks, with the creation revision of the key they were
/// measured under.
type Kept = (i64, Arc<Lock<Clock>>);

impl Clocks {
    /// The clocks of `model` under the key created at `created`.
    fn of(&self, model: &str, created: i64) -> Arc<Lock<Clock>> {
        let mut clocks = self.0.lock();
        match clocks.get(model) {
            Some((at, clock)) if *at == created => Arc::clone(clock),
            _ => {
                let clock = Arc::new(Lock::new(Clock::default()));
                clocks.insert(model.to_owned(), (created, Arc::clone(&clock)));
                clock
            }
        }
    }

    /// Forgets the clocks of `model`'s rollout, which ended.
    fn forget(&self, model: &str, created: i64) {
        let mut clocks = self.0.lock();
        if clocks.get(model).is_some_and(|(at, _)| *at == created) {
            clocks.remove(model);
        }
    }
}

/// What one look decided.
enum Look {
    /// It wrote the next state (or found the record changed meanwhile):
    /// wait for the watch to say so.
    Wrote,
    /// Nothing to do until something changes, or until this instant.
    Wait(Option<Instant>),
}

/// Drives the rollout of `model` until it ends, as the holder of the
/// coordinator key of `tenure`. Returns the final record; stops with
/// [`ClusterError::Fenced`] as soon as the key is gone or another's.
pub async fn coordinate(
    store: &Store,
    model: &str,
    me: &str,
    tenure: Tenure,
    health: &Health,
) -> Result<RolloutRecord, ClusterError> {
    let spans = View::spans(&store.keys, model);
    let mut view = View::load(store, model).await?;
    let mut watch = store.watch(&spans, view.revision + 1).await?;
    let clock = health.clocks.of(model, tenure.created);
    loop {
        if view.holder != Some((tenure.created, tenure.revision)) {
            return Err(ClusterError::Fenced(format!("the coordinator key of model {model} is gone or another's")));
        }
        let Some(read) = view.record.clone() else {
            return Err(ClusterError::Refused(format!("model {model} has no fleet rollout")));
        };
        clock.lock().observe(&read.value);
        if !read.value.phase.in_progress() {
            health.clocks.forget(model, tenure.created);
            return finish(store, model, tenure, view, watch, read, health).await;
        }
        let until = match look(store, &view, &clock, &read, me, tenure, health).await? {
            Look::Wrote => None,
            Look::Wait(until) => Some(until),
        };
        // Woken by a change of what it watches, or at its next deadline.
        // Changes that follow within a few milliseconds (a fleet's acks
        // arrive together) are taken in the same look.
        let deadline = until.flatten();
        tokio::select! {
            events = watch.next() => match events {
                Ok(events) => {
                    view.apply(events);
                    let more = tokio::time::Instant::now() + BATCH;
                    while let Ok(events) = tokio::time::timeout_at(more, watch.next()).await {
                        view.apply(events?);
                    }
                }
                Err(ClusterError::Compacted(_)) => {
                    view = View::load(store, model).await?;
                    watch = store.watch(&spans, view.revision + 1).await?;
                }
                Err(error) => return Err(error),
            },
            () = sleep_until(deadline) => {}
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// One look at a rollout in progress: writes the next state when there is
/// one.
async fn look(
    store: &Store,
    view: &View,
    clock: &Lock<Clock>,
    read: &Read<RolloutRecord>,
    me: &str,
    tenure: Tenure,
    health: &Health,
) -> Result<Look, ClusterError> {
    let record = &read.value;
    let model = record.model.as_str();
    let mut next = record.clone();
    let mut txn = Txn::new();
    // Why the rollout ends here without promoting, counted once written.
    let mut ends: Option<&'static str> = None;
    match record.phase {
        FleetPhase::Preparing => {
            let mut trouble: Vec<(String, String)> = view
                .failed
                .iter()
                .map(|id| (id.clone(), format!("replica {id} could not prepare: {}", view.failure(id))))
                .collect();
            let failed = !trouble.is_empty();
            trouble.extend(view.lost.iter().map(|id| (id.clone(), format!("replica {id} lost its lease"))));
            if !trouble.is_empty() {
                if record.missing.len() + trouble.len() > record.plan.allow_missing {
                    ends = Some(if failed { "prepare_failed" } else { "lease_lost" });
                    ops::end(&mut next, FleetPhase::Aborted, summarize_reasons(&trouble), me);
                } else {
                    for (id, why) in trouble {
                        decide(&mut next, "left_out", me, format!("{why}; the rollout goes on without it."));
                        next.missing.push(id);
                    }
                    if next.missing.len() >= next.participants.len() {
                        ends = Some("no_members");
                        let reason = "no participant prepared the candidate".to_owned();
                        ops::end(&mut next, FleetPhase::Aborted, reason, me);
                    }
                }
            } else if view.counted().is_empty() {
                ends = Some("no_members");
                ops::end(&mut next, FleetPhase::Aborted, "no participant prepared the candidate".into(), me);
            } else if record.paused.is_some() {
                // Held by an operator: no commit, and no timeout.
                return Ok(Look::Wait(None));
            } else if view.ok.len() == view.counted().len() {
                txn = commit(&mut next, 0, me, view, &store.keys, txn)?;
            } else {
                let timeout = Duration::from_millis(record.plan.prepare_timeout_ms);
                let deadline = clock.lock().since() + timeout;
                if Instant::now() < deadline {
                    return Ok(Look::Wait(Some(deadline)));
                }
                let waiting: Vec<(String, String)> = view
                    .counted()
                    .iter()
                    .filter(|id| !view.ok.contains(*id))
                    .map(|id| (id.clone(), id.clone()))
                    .collect();
                if record.missing.len() + waiting.len() <= record.plan.allow_missing {
                    // Late is lost, for a plan that may go on without some:
                    // left out like a replica that failed, it converges later.
                    for (id, _) in waiting {
                        let why = format!(
                            "replica {id} did not prepare within {} ms; the rollout goes on without it.",
                            record.plan.prepare_timeout_ms
                        );
                        decide(&mut next, "left_out", me, why);
                        next.missing.push(id);
                    }
                } else {
                    let reason = format!(
                        "prepare timed out after {} ms waiting for {}",
                        record.plan.prepare_timeout_ms,
                        summarize_names(&waiting)
                    );
                    ends = Some("prepare_timeout");
                    ops::end(&mut next, FleetPhase::Aborted, reason, me);
                }
            }
        }
        FleetPhase::Committed => {
            if record.paused.is_some() {
                return Ok(Look::Wait(None));
            }
            if !record.plan.guards.unknown.is_empty() {
                // No judgement on some of the guards is no judgement:
                // held for a coordinator that knows them, or an operator.
                let names: Vec<&str> = record.plan.guards.unknown.keys().map(String::as_str).collect();
                let why = format!(
                    "the plan has guards this baton does not know ({}); a baton that knows them must judge the step",
                    names.join(", ")
                );
                decide(&mut next, "paused", me, format!("Paused: {why}."));
                next.paused = Some(why);
            } else {
                let mut clock = clock.lock();
                let due =
                    clock.judged.unwrap_or_else(|| clock.since()) + Duration::from_millis(record.plan.interval_ms);
                if Instant::now() < due {
                    return Ok(Look::Wait(Some(due)));
                }
                clock.judged = Some(Instant::now());
                drop(clock);
                txn = judge(view, &mut next, me, &store.keys, txn)?;
            }
        }
        _ => return Ok(Look::Wait(None)),
    }
    if next.phase == FleetPhase::RolledBack {
        ends = Some("guards");
    }
    let key = store.keys.record(model);
    let txn = tenure.fence(store, model, txn).if_changed_at(&key, read.revision).put_record(&key, &next, None)?;
    if store.commit(txn).await?.is_some() {
        if let Some(reason) = ends {
            health.aborted(reason);
        }
        tracing::info!(
            model,
            version = next.version,
            phase = next.phase.as_str(),
            step = next.step,
            "{}",
            next.decisions.last().map_or("", |d| d.message.as_str())
        );
    } else {
        fenced(store, model, tenure).await?;
    }
    Ok(Look::Wrote)
}

/// After a write that did not happen: an error when the key is no longer
/// this coordinator's, else the record changed meanwhile (the watch will
/// deliver it).
async fn fenced(store: &Store, model: &str, tenure: Tenure) -> Result<(), ClusterError> {
    let holder = store.get::<String>(&store.keys.coordinator(model)).await?;
    if holder.is_some_and(|h| (h.created, h.revision) == (tenure.created, tenure.revision)) {
        return Ok(());
    }
    Err(ClusterError::Fenced(format!("the coordinator key of model {model} is gone or another's")))
}

/// Reasons for people: the first few, and how many more.
fn summarize_reasons(trouble: &[(String, String)]) -> String {
    let mut text = trouble.iter().take(NAMED).map(|(_, why)| why.as_str()).collect::<Vec<_>>().join("; ");
    if trouble.len() > NAMED {
        text.push_str(&format!("; and {} more", trouble.len() - NAMED));
    }
    text
}

/// Replica names for people: the first few, and how many more.
fn summarize_names(names: &[(String, String)]) -> String {
    let mut text = names.iter().take(NAMED).map(|(id, _)| id.as_str()).collect::<Vec<_>>().join(", ");
    if names.len() > NAMED {
        text.push_str(&format!(" and {} more", names.len() - NAMED));
    }
    text
}

/// Commits step `index`: its subset switches to the candidate, or, at the
/// last step, every replica promotes it (and the committed version is
/// written in the same transaction).
fn commit(
    next: &mut RolloutRecord,
    index: usize,
    me: &str,
    view: &View,
    keys: &crate::keys::Keys,
    txn: Txn,
) -> Result<Txn, ClusterError> {
    let counted: Vec<String> = next.participants.iter().filter(|p| !next.missing.contains(p)).cloned().collect();
    if counted.is_empty() {
        ops::end(next, FleetPhase::Aborted, "no participant prepared the candidate".into(), me);
        return Ok(txn);
    }
    if index + 1 >= next.plan.steps.len() {
        let (key, value) = ops::promote(next, me, keys)?;
        return Ok(txn.put(&key, value, None));
    }
    let members: Vec<String> = if index == 0 && !next.plan.selector.is_empty() {
        counted
            .iter()
            .filter(|p| {
                view.labels(p).is_some_and(|labels| next.plan.selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
            })
            .cloned()
            .collect()
    } else {
        let share = next.plan.steps[index] / 100.0;
        let count = ((share * counted.len() as f64).ceil() as usize).clamp(1, counted.len());
        let mut members = next.members.clone();
        let already: BTreeSet<&String> = next.members.iter().collect();
        members
            .extend(counted.iter().filter(|p| !already.contains(p)).take(count.saturating_sub(members.len())).cloned());
        members
    };
    if members.is_empty() {
        ops::end(next, FleetPhase::Aborted, "the selector matches no participant".into(), me);
        return Ok(txn);
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
    Ok(txn)
}

/// Judges the committed subset on what every participant observed during
/// the step, merged: the guards and their minimum samples hold fleet-wide.
fn judge(
    view: &View,
    next: &mut RolloutRecord,
    me: &str,
    keys: &crate::keys::Keys,
    txn: Txn,
) -> Result<Txn, ClusterError> {
    let step = next.step.unwrap_or(0);
    let mut merged = Sums::default();
    let mut replicas = 0;
    for report in view.sums.values().filter(|r| r.rollout == next.id && r.step == step) {
        merged.merge(&report.sums);
        replicas += 1;
    }
    let window = merged.window();
    // A fleet's rollout is a canary: the candidate's answers reach users.
    let mut verdict = guard::evaluate(&next.plan.guards.known, &window, false);
    verdict.reason = format!("{} (merged from {replicas} replicas)", verdict.reason);
    next.judge_at_ms = Some(now_ms() + next.plan.interval_ms);
    let txn = match verdict.outcome {
        Outcome::Pass => {
            next.inconclusive = 0;
            commit(next, step + 1, me, view, keys, txn)?
        }
        Outcome::Fail => {
            next.failures += 1;
            if next.failures >= next.plan.failure_limit {
                ops::end(next, FleetPhase::RolledBack, format!("the guards failed: {}", verdict.reason), me);
            } else {
                decide(next, "held", me, format!("A judgement failed ({}); the step holds.", verdict.reason));
            }
            txn
        }
        Outcome::Inconclusive => {
            next.inconclusive += 1;
            if next.inconclusive >= next.plan.max_inconclusive {
                next.paused = Some(format!("{} judgements in a row were inconclusive", next.inconclusive));
                decide(next, "paused", me, format!("Paused: {}.", verdict.reason));
            } else {
                decide(next, "held", me, format!("Inconclusive: {}.", verdict.reason));
            }
            txn
        }
    };
    if let Some(last) = next.decisions.last_mut() {
        last.verdict = Some(verdict);
    }
    Ok(txn)
}

/// After the rollout ended: for a promotion, waits for every member's
/// switch report (from the watch) and files how far apart they switched.
async fn finish(
    store: &Store,
    model: &str,
    tenure: Tenure,
    mut view: View,
    mut watch: crate::etcd::Watch,
    read: Read<RolloutRecord>,
    health: &Health,
) -> Result<RolloutRecord, ClusterError> {
    let record = read.value;
    if record.phase != FleetPhase::Promoted || record.switch.is_some() {
        return Ok(record);
    }
    let deadline = Instant::now() + SWITCH_REPORTS;
    let stamps = loop {
        let stamps: Vec<(u64, u64)> = view
            .switched
            .values()
            .filter(|r| r.rollout == record.id && r.phase == FleetPhase::Promoted)
            .map(|r| (r.seen_us, r.at_us))
            .collect();
        if stamps.len() >= record.members.len() || Instant::now() >= deadline {
            break stamps;
        }
        tokio::select! {
            events = watch.next() => match events {
                Ok(events) => view.apply(events),
                Err(ClusterError::Compacted(_)) => {
                    view = View::load(store, model).await?;
                    watch = store.watch(&View::spans(&store.keys, model), view.revision + 1).await?;
                }
                Err(error) => return Err(error),
            },
            () = tokio::time::sleep_until(deadline.into()) => {}
        }
    };
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
    let key = store.keys.record(model);
    let txn =
        tenure.fence(store, model, Txn::new()).if_changed_at(&key, read.revision).put_record(&key, &filed, None)?;
    if store.commit(txn).await?.is_none() {
        // Another rollout began, or the key is gone: the summary is only
        // for status, so it is not filed.
        return Ok(record);
    }
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
    use super::{summarize, summarize_names};

    #[test]
    fn the_skew_is_last_minus_first_and_delays_count_from_the_commit() {
        let stamps = [(1_001_000, 1_002_000), (1_000_100, 1_000_500), (1_003_000, 1_004_000)];
        let s = summarize(&stamps, 1_000_000).unwrap();
        assert_eq!((s.replicas, s.skew_ms, s.first_ms, s.last_ms), (3, 3.5, 0.5, 4.0));
        assert_eq!((s.delivery_skew_ms, s.last_seen_ms), (2.9, 3.0));
        assert!(summarize(&[], 0).is_none());
    }

    #[test]
    fn long_lists_of_replicas_are_cut_for_people() {
        let names: Vec<(String, String)> = (0..8).map(|i| (format!("r{i}"), String::new())).collect();
        assert_eq!(summarize_names(&names), "r0, r1, r2, r3, r4 and 3 more");
        assert_eq!(summarize_names(&names[..2]), "r0, r1");
    }
}
