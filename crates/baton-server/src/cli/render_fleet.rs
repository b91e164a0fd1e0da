//! `baton fleet status` as text: one line per replica, then each model's
//! committed version and rollout.

use std::collections::BTreeMap;
use std::fmt::Write;

use baton_cluster::records::{Ack, Desired, FleetPhase, ReplicaRecord, RolloutRecord, Serving};

/// What `baton fleet status` reads, shown as text or as JSON.
#[derive(serde::Serialize)]
pub struct Fleet {
    /// Live replicas.
    pub replicas: Vec<ReplicaRecord>,
    /// Committed versions per model.
    pub desired: BTreeMap<String, Desired>,
    /// Each model's rollout (in progress or last).
    pub rollouts: Vec<RolloutRecord>,
    /// Per model, the acks of its rollout by replica.
    pub acks: BTreeMap<String, BTreeMap<String, Ack>>,
}

/// The text.
pub fn render(view: &Fleet) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} live replicas", view.replicas.len());
    let _ = writeln!(out, "{:<20} {:<6} {:<28} {:<24} LABELS", "REPLICA", "READY", "ADDRESS", "MODELS");
    for r in &view.replicas {
        let models: Vec<String> = r
            .models
            .iter()
            .map(|(m, s)| {
                let stable = s.stable.map_or("-".into(), |v| v.to_string());
                match s.candidate {
                    Some(c) => format!("{m}:{stable}+{c}@{}%", s.candidate_percent),
                    None => format!("{m}:{stable}"),
                }
            })
            .collect();
        let labels: Vec<String> = r.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let id = if r.agent { format!("{} (agent)", r.id) } else { r.id.clone() };
        let ready = if r.ready { "yes" } else { "no" };
        let _ = writeln!(out, "{id:<20} {ready:<6} {:<28} {:<24} {}", r.address, models.join(" "), labels.join(","));
    }
    for (model, d) in &view.desired {
        let _ = writeln!(out, "\nmodel {model}: the fleet serves version {}", d.version);
        // Replicas that say they serve another version, and why.
        for r in &view.replicas {
            let Some(serving) = r.models.get(model) else { continue };
            if serves(serving, d.version) {
                continue;
            }
            let stable = serving.stable.map_or("no version".into(), |v| format!("version {v}"));
            let why = r.note.as_deref().map(|n| format!(": {n}")).unwrap_or_default();
            let _ = writeln!(out, "  {} serves {stable}{why}", r.id);
        }
        let Some(r) = view.rollouts.iter().find(|r| &r.model == model) else { continue };
        rollout(&mut out, r, view.acks.get(model), &view.replicas);
    }
    out
}

/// Whether a replica serving `serving` answers with `version`: as its
/// stable version, or as a candidate with all of its traffic.
fn serves(serving: &Serving, version: u64) -> bool {
    (serving.stable == Some(version) && serving.candidate.is_none_or(|_| serving.candidate_percent < 100.0))
        || (serving.candidate == Some(version) && serving.candidate_percent >= 100.0)
}

fn rollout(out: &mut String, r: &RolloutRecord, acks: Option<&BTreeMap<String, Ack>>, replicas: &[ReplicaRecord]) {
    let step = r.step.map_or("-".into(), |s| format!("{}/{}", s + 1, r.plan.steps.len()));
    // Counted from what each participant says it serves, not from whom
    // the record told to switch: a replica whose switch failed is not one.
    let switched = replicas
        .iter()
        .filter(|p| r.participants.contains(&p.id))
        .filter(|p| p.models.get(&r.model).is_some_and(|s| serves(s, r.version)))
        .count();
    let _ = writeln!(
        out,
        "  rollout of version {} (from {}): {}{}, step {step}, {} of {} replicas serve it",
        r.version,
        r.from.map_or("-".into(), |v| v.to_string()),
        r.phase.as_str(),
        r.paused.as_ref().map(|p| format!(" (paused: {p})")).unwrap_or_default(),
        if r.phase == FleetPhase::Promoted || r.phase.in_progress() { switched } else { 0 },
        r.participants.len()
    );
    if r.phase == FleetPhase::Preparing {
        for id in &r.participants {
            let state = match acks.and_then(|a| a.get(id)) {
                Some(a) if a.ok => format!("prepared in {} ms", a.prepare_ms),
                Some(a) => format!(
                    "FAILED at {}: {}",
                    a.stage.as_deref().unwrap_or("?"),
                    a.reason.as_deref().unwrap_or("no reason given")
                ),
                None if r.missing.contains(id) => "left out".into(),
                None => "preparing…".into(),
            };
            let _ = writeln!(out, "    {id:<18} {state}");
        }
    }
    if let Some(reason) = &r.reason {
        let _ = writeln!(out, "  reason: {reason}");
    }
    if let Some(s) = &r.switch {
        let _ = writeln!(
            out,
            "  switched: {} replicas within {:.1} ms, {:.1}–{:.1} ms after the commit write",
            s.replicas, s.skew_ms, s.first_ms, s.last_ms
        );
    }
    for d in r.decisions.iter().rev().take(5).collect::<Vec<_>>().into_iter().rev() {
        let _ = writeln!(out, "  - {}", d.message);
    }
}

#[cfg(test)]
mod tests {
    use baton_cluster::records::FleetPlan;

    use super::*;

    fn replica(id: &str, stable: u64) -> ReplicaRecord {
        ReplicaRecord {
            id: id.into(),
            address: format!("{id}:8000"),
            labels: BTreeMap::new(),
            models: [("m".to_owned(), Serving { stable: Some(stable), candidate: None, candidate_percent: 0.0 })]
                .into(),
            ready: stable == 3,
            agent: false,
            note: (stable != 3).then(|| "could not load the committed version 3".to_owned()),
            since_ms: 0,
        }
    }

    #[test]
    fn a_promoted_rollout_counts_the_replicas_that_serve_it_not_those_told_to() {
        let mut record = RolloutRecord::new("m", 3, Some(2), FleetPlan::default(), vec!["a".into(), "b".into()]);
        record.phase = FleetPhase::Promoted;
        record.members = vec!["a".into(), "b".into()];
        let desired = Desired { version: 3, rollout: Some(record.id), at_ms: 0 };
        let fleet = Fleet {
            replicas: vec![replica("a", 3), replica("b", 2)],
            desired: [("m".to_owned(), desired)].into(),
            rollouts: vec![record],
            acks: BTreeMap::new(),
        };
        let text = render(&fleet);
        assert!(text.contains("1 of 2 replicas serve it"), "{text}");
        assert!(text.contains("b serves version 2: could not load the committed version 3"), "{text}");
    }
}
