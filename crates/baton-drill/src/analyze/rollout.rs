//! What a rollout drill concludes: latency and the share of answers per
//! role in each phase of the rollout (before it, each step, after it
//! ended), its decisions with their guard values, and for a rollback how
//! long the candidate kept answering after the failing window ended.

use serde::Serialize;
use serde_json::Value;

use super::secs;
use super::stats::{Collector, Stats};
use crate::record::Record;
use crate::role;
use crate::rollout::RolloutRecord;

/// Milliseconds from `from` to `to` (negative when `to` is earlier).
fn ms_between(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1e6
}

/// Answers of one role in a phase.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoleShare {
    /// `stable`, `candidate`, `previous`, `none` or `other`.
    pub role: &'static str,
    /// Successful answers naming it.
    pub answers: u64,
    /// Their share of the phase's successful answers.
    pub share: f64,
}

/// A span of the rollout between two decisions that change the candidate's share.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseReport {
    /// `before`, `step 2 (50%)`, `paused at 50%`, `after rolled_back`, …
    pub name: String,
    /// Start, s since the load started.
    pub from_s: f64,
    /// End, s.
    pub to_s: f64,
    /// The candidate's share the server set for it, in percent (none before the rollout).
    pub weight_percent: Option<f64>,
    /// Requests started in it.
    pub stats: Stats,
    /// Successful answers per role, in the order of the roles' codes.
    pub roles: Vec<RoleShare>,
}

/// A decision as the report shows it.
#[derive(Clone, Debug, Serialize)]
pub struct DecisionReport {
    /// What was decided.
    pub action: String,
    /// Who decided.
    pub by: String,
    /// When, s since the load started.
    pub at_s: f64,
    /// When its judged window ended, s.
    pub window_end_s: Option<f64>,
    /// The step after it (1-based, as the report names phases).
    pub step: u64,
    /// The candidate's share after it, in percent.
    pub weight_percent: f64,
    /// The judged window's verdict with every guard's value, threshold and samples.
    pub verdict: Value,
    /// The server's sentence.
    pub message: String,
}

/// How long the candidate lasted after its failing window, client-observed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RollbackTiming {
    /// When the window that failed ended (the decision's `window_end_ms`), s.
    pub window_end_s: f64,
    /// From it to the decision, ms.
    pub decided_ms: f64,
    /// From it to the end of the last answer the candidate gave, ms
    /// (negative when that came before the window's end; none when the
    /// candidate never answered a client, as in shadow mode).
    pub last_candidate_answer_ms: Option<f64>,
    /// From it to the server's store of the candidate's weight 0 (the
    /// `abort` operation finished), ms; none when the drill did not see it.
    pub weight_zero_ms: Option<f64>,
    /// Answers by the candidate to requests started after that store (0
    /// when it took effect at once).
    pub candidate_answers_started_after_weight_zero: u64,
}

/// Everything about the rollout.
#[derive(Clone, Debug, Serialize)]
pub struct RolloutReport {
    /// The start's body.
    pub request: Value,
    /// Whether the start succeeded.
    pub started: bool,
    /// What the server said, or what went wrong.
    pub detail: String,
    /// When the start was sent, s.
    pub trigger_s: f64,
    /// How long the start took to answer (the candidate's load), ms.
    pub start_ms: f64,
    /// The stable version.
    pub stable: Option<u64>,
    /// The candidate.
    pub candidate: Option<u64>,
    /// The mode.
    pub mode: Option<String>,
    /// How it ended: `promoted`, `rolled_back`, `aborted`, `paused`, or
    /// the phase it was in when the drill stopped following (`running`).
    pub outcome: Option<String>,
    /// When the drill saw it end, s.
    pub ended_s: Option<f64>,
    /// Each phase in time order.
    pub phases: Vec<PhaseReport>,
    /// The decisions, oldest first.
    pub decisions: Vec<DecisionReport>,
    /// Operations of the model that finished while it was followed (s).
    pub operations: Vec<(String, f64)>,
    /// For a rollback (or an abort): how long the candidate lasted.
    pub rollback: Option<RollbackTiming>,
    /// Why the event stream could not be read, if it could not.
    pub events_error: Option<String>,
}

/// The decisions that start a phase: those that change the candidate's
/// share or whether windows are judged.
fn starts_phase(action: &str) -> bool {
    !matches!(action, "held")
}

/// The name of the phase a decision starts.
fn phase_name(action: &str, step: u64, weight: f64) -> String {
    match action {
        "started" | "advanced" | "resumed" => format!("step {} ({weight}%)", step + 1),
        "paused" => format!("paused at {weight}%"),
        other => format!("after {other}"),
    }
}

/// Analyses the rollout against the run's records (sorted by start), the load ending at `end`.
pub fn measure(r: &RolloutRecord, records: &[Record], end: u64) -> RolloutReport {
    let mut bounds: Vec<(u64, String, Option<f64>)> = vec![(0, "before".to_owned(), None)];
    let mut decisions = r.decisions.clone();
    decisions.sort_by_key(|d| d.at);
    for d in decisions.iter().filter(|d| starts_phase(&d.action)) {
        let at = d.at.max(bounds.last().map_or(0, |b| b.0));
        bounds.push((at, phase_name(&d.action, d.step, d.weight_percent), Some(d.weight_percent)));
    }
    let mut collectors: Vec<(Collector, [u64; role::NAMES.len()])> =
        bounds.iter().map(|_| (Collector::default(), [0; role::NAMES.len()])).collect();
    for rec in records {
        let i = bounds.partition_point(|b| b.0 <= rec.start).saturating_sub(1);
        collectors[i].0.add(rec.latency, rec.ok());
        if rec.ok() {
            collectors[i].1[usize::from(rec.role).min(role::NAMES.len() - 1)] += 1;
        }
    }
    let phases = bounds
        .iter()
        .enumerate()
        .zip(collectors.iter_mut())
        .map(|((i, (from, name, weight)), (collector, roles))| {
            let to = bounds.get(i + 1).map_or(end, |b| b.0).max(*from);
            let answered: u64 = roles.iter().sum();
            PhaseReport {
                name: name.clone(),
                from_s: secs(*from),
                to_s: secs(to),
                weight_percent: *weight,
                stats: collector.stats(),
                roles: roles
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n > 0)
                    .map(|(code, &n)| RoleShare {
                        role: role::name(code as u8),
                        answers: n,
                        share: n as f64 / answered as f64,
                    })
                    .collect(),
            }
        })
        .collect();
    let operations: Vec<(String, f64)> = r.operations.iter().map(|o| (o.operation.clone(), secs(o.at))).collect();
    RolloutReport {
        request: r.request.clone(),
        started: r.ok,
        detail: r.detail.clone(),
        trigger_s: secs(r.trigger),
        start_ms: ms_between(r.trigger, r.done),
        stable: r.stable,
        candidate: r.candidate,
        mode: r.mode.clone(),
        outcome: r.phase.clone(),
        ended_s: r.ended.map(secs),
        phases,
        rollback: rollback(r, &decisions, records),
        decisions: decisions
            .iter()
            .map(|d| DecisionReport {
                action: d.action.clone(),
                by: d.by.clone(),
                at_s: secs(d.at),
                window_end_s: d.window_end.map(secs),
                step: d.step + 1,
                weight_percent: d.weight_percent,
                verdict: d.verdict.clone(),
                message: d.message.clone(),
            })
            .collect(),
        operations,
        events_error: r.events_error.clone(),
    }
}

/// The timing of the decision that took the candidate out, if one did.
fn rollback(
    r: &RolloutRecord,
    decisions: &[crate::rollout::DecisionSeen],
    records: &[Record],
) -> Option<RollbackTiming> {
    let out = decisions.iter().rev().find(|d| matches!(d.action.as_str(), "rolled_back" | "aborted"))?;
    // An operator's abort judges no window: time it from the decision.
    let from = out.window_end.unwrap_or(out.at);
    let weight_zero =
        r.operations.iter().filter(|o| o.operation == "abort" && o.at >= out.at.min(from)).map(|o| o.at).min();
    let candidate = records.iter().filter(|rec| rec.ok() && rec.role == role::CANDIDATE);
    let last = candidate.clone().map(Record::end).max();
    Some(RollbackTiming {
        window_end_s: secs(from),
        decided_ms: ms_between(from, out.at),
        last_candidate_answer_ms: last.map(|t| ms_between(from, t)),
        weight_zero_ms: weight_zero.map(|t| ms_between(from, t)),
        candidate_answers_started_after_weight_zero: weight_zero
            .map_or(0, |w| candidate.filter(|rec| rec.start > w).count() as u64),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::rollout::{DecisionSeen, OperationSeen};

    const MS: u64 = 1_000_000;

    fn rec(start_ms: u64, latency_ms: u64, role: u8, error: u32) -> Record {
        Record { start: start_ms * MS, latency: latency_ms * MS, version: 1, error, worker: 0, role }
    }

    fn decision(action: &str, at_ms: u64, window_end_ms: Option<u64>, step: u64, weight: f64) -> DecisionSeen {
        DecisionSeen {
            action: action.into(),
            by: if action == "started" { "operator" } else { "guards" }.into(),
            at: at_ms * MS,
            window_end: window_end_ms.map(|w| w * MS),
            step,
            weight_percent: weight,
            verdict: json!({"outcome": "fail", "checks": [{"guard": "rel_l2:output", "value": 0.4}]}),
            message: String::new(),
        }
    }

    /// A canary started at 100 ms (10 %), advanced at 400 ms (50 %), held
    /// at 700 ms and rolled back at 1010 ms on a window that ended at
    /// 1000 ms; the abort's store finished at 1012 ms.
    fn rolled_back() -> RolloutRecord {
        RolloutRecord {
            trigger: 50 * MS,
            done: 100 * MS,
            ok: true,
            phase: Some("rolled_back".into()),
            ended: Some(1020 * MS),
            decisions: vec![
                decision("held", 700, Some(700), 1, 50.0),
                decision("started", 100, None, 0, 10.0),
                decision("advanced", 400, Some(400), 1, 50.0),
                decision("rolled_back", 1010, Some(1000), 1, 0.0),
            ],
            operations: vec![
                OperationSeen { operation: "rollout".into(), at: 100 * MS },
                OperationSeen { operation: "abort".into(), at: 1012 * MS },
            ],
            ..RolloutRecord::default()
        }
    }

    #[test]
    fn phases_split_at_the_decisions_that_change_the_share() {
        let records = [
            rec(10, 1, role::STABLE, 0),
            rec(150, 1, role::STABLE, 0),
            rec(160, 3, role::CANDIDATE, 0),
            rec(170, 1, role::STABLE, 0),
            rec(450, 2, role::CANDIDATE, 0),
            rec(800, 1, role::STABLE, 1),
            rec(1100, 1, role::STABLE, 0),
        ];
        let report = measure(&rolled_back(), &records, 1200 * MS);
        let names: Vec<&str> = report.phases.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["before", "step 1 (10%)", "step 2 (50%)", "after rolled_back"]);
        let spans: Vec<(f64, f64)> = report.phases.iter().map(|p| (p.from_s, p.to_s)).collect();
        assert_eq!(spans, [(0.0, 0.1), (0.1, 0.4), (0.4, 1.01), (1.01, 1.2)]);
        let step1 = &report.phases[1];
        assert_eq!((step1.stats.requests, step1.stats.failed), (3, 0));
        assert_eq!(
            step1.roles.iter().map(|r| (r.role, r.answers)).collect::<Vec<_>>(),
            [("stable", 2), ("candidate", 1)]
        );
        assert!((step1.roles[1].share - 1.0 / 3.0).abs() < 1e-9);
        // A failed request counts in its phase, not in the role shares.
        let step2 = &report.phases[2];
        assert_eq!((step2.stats.requests, step2.stats.failed), (2, 1));
        assert_eq!(step2.roles, [RoleShare { role: "candidate", answers: 1, share: 1.0 }]);
        assert_eq!(report.phases[0].weight_percent, None);
        assert_eq!(report.decisions.len(), 4, "held decisions are reported, though they start no phase");
        assert_eq!(report.decisions[0].action, "started");
    }

    #[test]
    fn a_rollback_is_timed_from_the_failing_windows_end() {
        // The candidate's last answer ends at 1005 ms, inside the decision's tick.
        let records =
            [rec(900, 2, role::CANDIDATE, 0), rec(1000, 5, role::CANDIDATE, 0), rec(1001, 1, role::STABLE, 0)];
        let t = measure(&rolled_back(), &records, 1200 * MS).rollback.expect("a rollback");
        assert_eq!(t.window_end_s, 1.0);
        assert_eq!(t.decided_ms, 10.0);
        assert_eq!(t.last_candidate_answer_ms, Some(5.0));
        assert_eq!(t.weight_zero_ms, Some(12.0));
        assert_eq!(t.candidate_answers_started_after_weight_zero, 0);
        // A candidate answering a request started after the store is counted.
        let late = [rec(1013, 1, role::CANDIDATE, 0)];
        let t = measure(&rolled_back(), &late, 1200 * MS).rollback.unwrap();
        assert_eq!((t.last_candidate_answer_ms, t.candidate_answers_started_after_weight_zero), (Some(14.0), 1));
    }

    #[test]
    fn no_rollback_no_timing_and_a_failed_start_is_all_before() {
        let mut promoted = rolled_back();
        promoted.decisions.pop();
        promoted.decisions.push(decision("promoted", 1010, Some(1000), 1, 100.0));
        let report = measure(&promoted, &[], 1200 * MS);
        assert!(report.rollback.is_none());
        assert_eq!(report.phases.last().unwrap().name, "after promoted");
        let failed =
            RolloutRecord { ok: false, detail: "HTTP 409: rollout_in_progress".into(), ..RolloutRecord::default() };
        let report = measure(&failed, &[rec(10, 1, role::NONE, 0)], 100 * MS);
        assert_eq!(report.phases.len(), 1);
        assert_eq!(report.phases[0].roles[0].role, "none");
        assert!(!report.started);
    }
}
