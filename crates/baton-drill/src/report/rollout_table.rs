//! The rollout's part of the report on the terminal: its phases with
//! latency and the answers per role, its decisions with the guard values
//! they were decided on, and the rollback's timing.

use std::fmt::Write;

use serde_json::Value;

use super::table::{count, ms};
use crate::analyze::rollout::RolloutReport;

/// Appends the rollout's section to `out`.
pub fn render(out: &mut String, r: &RolloutReport) {
    let versions = match (r.candidate, r.stable) {
        (Some(c), Some(s)) => format!("version {c} beside {s}"),
        _ => "a rollout".to_owned(),
    };
    let mode = r.mode.as_deref().unwrap_or("?");
    if !r.started {
        let _ = writeln!(out, "\nrollout: the start failed after {:.1} ms: {}", r.start_ms, r.detail);
    } else {
        let ended = match (&r.outcome, r.ended_s) {
            (Some(o), Some(t)) => format!("{o} at {t:.2} s"),
            (Some(o), None) => format!("still {o} when the drill stopped following"),
            _ => "not seen to end".to_owned(),
        };
        let _ = writeln!(
            out,
            "\nrollout: {versions} ({mode}), started at {:.2} s (the start answered in {:.1} ms), {ended}",
            r.trigger_s, r.start_ms
        );
    }
    let _ = writeln!(
        out,
        "  {:<20} {:>13} {:>9} {:>6} {:>8} {:>8}  answers by role",
        "phase", "from–to (s)", "requests", "failed", "p50", "p99"
    );
    for p in &r.phases {
        let roles: Vec<String> = p.roles.iter().map(|s| format!("{} {:.1}%", s.role, s.share * 100.0)).collect();
        let _ = writeln!(
            out,
            "  {:<20} {:>13} {:>9} {:>6} {:>8} {:>8}  {}",
            p.name,
            format!("{:.2}–{:.2}", p.from_s, p.to_s),
            count(p.stats.requests),
            count(p.stats.failed),
            ms(p.stats.p50_ms),
            ms(p.stats.p99_ms),
            if roles.is_empty() { "-".to_owned() } else { roles.join(", ") }
        );
    }
    if !r.decisions.is_empty() {
        let _ = writeln!(out, "  decisions:");
    }
    for d in &r.decisions {
        let window = d.window_end_s.map(|w| format!(", window ended {w:.2} s")).unwrap_or_default();
        let _ = writeln!(
            out,
            "    {:>7.2} s  {:<11} by {:<8} step {} at {}%{window}{}",
            d.at_s,
            d.action,
            d.by,
            d.step,
            d.weight_percent,
            checks(&d.verdict)
        );
    }
    if let Some(t) = &r.rollback {
        let after = |v: Option<f64>| v.map_or("not seen".to_owned(), |v| format!("{v:+.1} ms"));
        let _ = writeln!(
            out,
            "  rollback: window ended {:.3} s; decided {:+.1} ms; last candidate answer {}; weight 0 stored {}; candidate answers to requests started after the store: {}",
            t.window_end_s,
            t.decided_ms,
            after(t.last_candidate_answer_ms),
            after(t.weight_zero_ms),
            t.candidate_answers_started_after_weight_zero
        );
    }
    if let Some(e) = &r.events_error {
        let _ = writeln!(out, "  event stream: {e}");
    }
}

/// A verdict's checks on one line: `; checks: rel_l2:output 0.41 > 0.05 fail (40), …`.
fn checks(verdict: &Value) -> String {
    let Some(checks) = verdict["checks"].as_array() else { return String::new() };
    let list: Vec<String> = checks
        .iter()
        .map(|c| {
            let value = c["value"].as_f64().map_or("-".to_owned(), |v| format!("{v:.4}"));
            format!(
                "{} {value} (≤{}) {} ×{}",
                c["guard"].as_str().unwrap_or("?"),
                c["threshold"],
                c["outcome"].as_str().unwrap_or("?"),
                c["samples"]
            )
        })
        .collect();
    format!("; {}: {}", verdict["outcome"].as_str().unwrap_or("?"), list.join(", "))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn checks_read_on_one_line() {
        let verdict = json!({"outcome": "fail", "checks": [
            {"guard": "rel_l2:output", "value": 0.4, "threshold": 0.05, "samples": 40, "outcome": "fail"},
            {"guard": "p99_ratio", "value": null, "threshold": 1e9, "samples": 3, "outcome": "inconclusive"}]});
        assert_eq!(
            checks(&verdict),
            "; fail: rel_l2:output 0.4000 (≤0.05) fail ×40, p99_ratio - (≤1000000000.0) inconclusive ×3"
        );
        assert_eq!(checks(&Value::Null), "");
    }
}
