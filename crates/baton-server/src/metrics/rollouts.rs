//! The rollout families of `/metrics`: the gauges of rollouts in
//! progress (share, step, pause, watch, each guard's value and threshold),
//! the last decision of each model's latest rollout, and the decisions
//! counted so far.

use std::collections::BTreeMap;
use std::fmt::Write;

use baton_core::rollout::control::{Phase, RolloutStatus};
use baton_core::rollout::guard::Check;

use super::{escape, help};

/// A rollout's guard checks in its last judged window.
fn last_checks(r: &RolloutStatus) -> &[Check] {
    r.decisions.iter().rev().find_map(|d| d.verdict.as_ref()).map_or(&[], |v| v.checks.as_slice())
}

/// The gauges of rollouts in progress, and the decisions counted so far.
pub(super) fn render(
    out: &mut String,
    statuses: &[baton_core::registry::ModelStatus],
    decisions: &BTreeMap<(String, &'static str), u64>,
) {
    let running: Vec<_> =
        statuses.iter().filter_map(|s| s.rollout.as_ref()).filter(|r| r.phase.in_progress()).collect();
    help(out, "baton_rollout_weight", "gauge", "The candidate's share of a rollout in progress, 0 to 1.");
    for r in &running {
        let (model, mode) = (escape(&r.model), r.mode.as_str());
        let _ = writeln!(out, "baton_rollout_weight{{model=\"{model}\",mode=\"{mode}\"}} {}", r.weight_percent / 100.0);
    }
    help(out, "baton_rollout_step", "gauge", "The step a rollout in progress has reached, from 0.");
    for r in &running {
        let _ = writeln!(out, "baton_rollout_step{{model=\"{}\"}} {}", escape(&r.model), r.step);
    }
    help(out, "baton_rollout_paused", "gauge", "1 while a rollout is paused.");
    for r in &running {
        let _ = writeln!(
            out,
            "baton_rollout_paused{{model=\"{}\"}} {}",
            escape(&r.model),
            u8::from(r.phase == Phase::Paused)
        );
    }
    help(
        out,
        "baton_rollout_watching",
        "gauge",
        "1 while a promoted version is still judged against the one it replaced.",
    );
    for r in &running {
        let watching = u8::from(r.phase == Phase::Watching);
        let _ = writeln!(out, "baton_rollout_watching{{model=\"{}\"}} {watching}", escape(&r.model));
    }
    help(out, "baton_rollout_guard_value", "gauge", "Each guard's value in the last judged window.");
    for r in &running {
        for c in last_checks(r).iter().filter(|c| c.value.is_some_and(f64::is_finite)) {
            let (model, guard) = (escape(&r.model), escape(&c.guard));
            let _ = writeln!(
                out,
                "baton_rollout_guard_value{{model=\"{model}\",guard=\"{guard}\"}} {}",
                c.value.unwrap_or_default()
            );
        }
    }
    help(out, "baton_rollout_guard_threshold", "gauge", "Each guard's threshold.");
    for r in &running {
        for c in last_checks(r) {
            let (model, guard) = (escape(&r.model), escape(&c.guard));
            let _ =
                writeln!(out, "baton_rollout_guard_threshold{{model=\"{model}\",guard=\"{guard}\"}} {}", c.threshold);
        }
    }
    help(out, "baton_rollout_shadow_dropped_total", "counter", "Comparison copies dropped in a rollout in progress.");
    for r in &running {
        let _ =
            writeln!(out, "baton_rollout_shadow_dropped_total{{model=\"{}\"}} {}", escape(&r.model), r.totals.dropped);
    }
    help(out, "baton_rollout_last_decision", "gauge", "1 for what the latest rollout of the model last decided.");
    for r in statuses.iter().filter_map(|s| s.rollout.as_ref()) {
        if let Some(last) = r.decisions.last() {
            let (model, decision) = (escape(&r.model), last.action.as_str());
            let _ = writeln!(out, "baton_rollout_last_decision{{model=\"{model}\",decision=\"{decision}\"}} 1");
        }
    }
    help(out, "baton_rollout_decisions_total", "counter", "Rollout decisions, by what was decided.");
    for ((model, decision), n) in decisions {
        let _ =
            writeln!(out, "baton_rollout_decisions_total{{model=\"{}\",decision=\"{decision}\"}} {n}", escape(model));
    }
}
