//! How `baton rollout` prints a rollout's status: the mode and phase, the
//! steps with the one reached, the candidate's share, the last judged
//! window's guard checks, the counts, the time to the next window, and the
//! latest decisions.

use serde_json::Value;

/// Decisions the view shows, newest last.
const SHOWN_DECISIONS: usize = 5;

fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{x:.0}"),
        Some(x) => format!("{x:.4}").trim_end_matches('0').trim_end_matches('.').to_owned(),
        None => "-".into(),
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("?")
}

/// Whether the rollout has ended (promoted and no longer watched, rolled
/// back or aborted), or there is none.
pub fn ended(answer: &Value) -> bool {
    !matches!(answer["rollout"]["phase"].as_str(), Some("running" | "paused" | "watching"))
}

/// The steps in percent, the one reached in brackets.
fn steps(rollout: &Value) -> String {
    let reached = rollout["step"].as_u64().unwrap_or_default() as usize;
    let steps = rollout["plan"]["steps"].as_array().map(Vec::as_slice).unwrap_or_default();
    let shown: Vec<String> = steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let percent = format!("{}%", number(step));
            if i == reached { format!("[{percent}]") } else { percent }
        })
        .collect();
    shown.join(" → ")
}

/// The latest decision that judged a window, whose verdict holds the
/// checks.
fn last_verdict(rollout: &Value) -> Option<&Value> {
    rollout["decisions"].as_array()?.iter().rev().map(|d| &d["verdict"]).find(|v| v.is_object())
}

/// The checks of a verdict as a table.
fn checks(verdict: &Value) -> String {
    let mut out = format!(
        "  last window: {} — {}\n    {:<28} {:>10} {:>10} {:>8}  {}\n",
        text(&verdict["outcome"]),
        text(&verdict["reason"]),
        "GUARD",
        "VALUE",
        "THRESHOLD",
        "SAMPLES",
        "OUTCOME"
    );
    for check in verdict["checks"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "    {:<28} {:>10} {:>10} {:>8}  {}\n",
            text(&check["guard"]),
            number(&check["value"]),
            number(&check["threshold"]),
            number(&check["samples"]),
            text(&check["outcome"])
        ));
    }
    out
}

/// One decision as a line: when (the local time of day), what, by whom,
/// and the sentence.
fn decision(d: &Value) -> String {
    let at = d["at_ms"]
        .as_u64()
        .and_then(|ms| crate::clock::local_time_of_day(ms as f64 / 1000.0))
        .unwrap_or_else(|| "-".into());
    format!("    {at} {:<11} {:<8} {}\n", text(&d["action"]), text(&d["by"]), text(&d["message"]))
}

/// The view of a rollout operation's answer (`{"model", "serving",
/// "rollout"}`).
pub fn view(answer: &Value) -> String {
    let model = text(&answer["model"]);
    let serving = answer["serving"].as_u64().map_or_else(|| "nothing".to_owned(), |v| format!("version {v}"));
    let rollout = &answer["rollout"];
    if rollout.is_null() {
        return format!("{model}: no rollout; {serving} serving\n");
    }
    let phase = text(&rollout["phase"]);
    let mut out = format!(
        "{model}: {} rollout of version {} beside version {}: {phase}{}\n",
        text(&rollout["mode"]),
        number(&rollout["candidate"]),
        number(&rollout["stable"]),
        rollout["paused"].as_str().map(|why| format!(" ({why})")).unwrap_or_default()
    );
    let count = rollout["plan"]["steps"].as_array().map_or(0, Vec::len);
    out.push_str(&format!(
        "  step {}/{count}: {}\n  candidate share {}%; {serving} serving\n",
        rollout["step"].as_u64().unwrap_or_default() + 1,
        steps(rollout),
        number(&rollout["weight_percent"])
    ));
    let next = match rollout["next_window_ms"].as_f64() {
        Some(ms) => format!("next window in {:.1} s", ms / 1000.0),
        None => "no window is judged".to_owned(),
    };
    if let Some(watch) = rollout["watch"].as_object() {
        out.push_str(&format!(
            "  watched after promotion against version {} for {:.0} s more; a failed window rolls back to it\n",
            number(&watch["against"]),
            watch["left_ms"].as_f64().unwrap_or_default() / 1000.0
        ));
    }
    let twin = &rollout["twin"];
    if twin["loaded"].as_bool() == Some(true) {
        let mib = twin["bytes_held"].as_f64().unwrap_or_default() / f64::from(1u32 << 20);
        out.push_str(&format!("  paired copies run on a twin of the stable version ({mib:.1} MiB)\n"));
    } else if let Some(why) = twin["reason"].as_str() {
        out.push_str(&format!("  no twin of the stable version: {why}\n"));
    }
    out.push_str(&format!(
        "  failures {}/{}, inconclusive {}/{} in a row; {next}\n",
        number(&rollout["failures"]),
        number(&rollout["plan"]["failure_limit"]),
        number(&rollout["inconclusive"]),
        number(&rollout["plan"]["max_inconclusive"])
    ));
    match last_verdict(rollout) {
        Some(verdict) => out.push_str(&checks(verdict)),
        None => out.push_str("  last window: none judged yet\n"),
    }
    let decisions = rollout["decisions"].as_array().map(Vec::as_slice).unwrap_or_default();
    out.push_str("  decisions:\n");
    for d in &decisions[decisions.len().saturating_sub(SHOWN_DECISIONS)..] {
        out.push_str(&decision(d));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn answer(phase: &str) -> Value {
        json!({
            "model": "ranker", "serving": 1,
            "rollout": {
                "model": "ranker", "stable": 1, "candidate": 2, "mode": "canary", "phase": phase, "paused": null,
                "step": 1, "weight_percent": 5.0, "failures": 0, "inconclusive": 2, "next_window_ms": 12_300,
                "plan": { "steps": [1.0, 5.0, 25.0], "failure_limit": 1, "max_inconclusive": 10 },
                "decisions": [
                    { "action": "started", "by": "operator", "at_ms": 1_000, "message": "started", "verdict": null },
                    { "action": "advanced", "by": "guards", "at_ms": 2_000, "message": "moved on", "verdict": {
                        "outcome": "pass", "reason": "every guard held",
                        "checks": [{ "guard": "p99_ratio", "value": 1.02, "threshold": 1.5, "samples": 340,
                                     "outcome": "pass" }] } }
                ]
            }
        })
    }

    #[test]
    fn a_watched_rollout_says_against_what_and_for_how_long() {
        let mut watched = answer("watching");
        watched["rollout"]["watch"] = json!({ "against": 1, "left_ms": 240_000 });
        let view = view(&watched);
        assert!(view.contains("watched after promotion against version 1 for 240 s more"), "{view}");
        assert!(!ended(&watched));
        assert!(ended(&answer("promoted")));
    }

    #[test]
    fn the_view_shows_steps_checks_counts_and_decisions() {
        let view = view(&answer("running"));
        for needle in [
            "ranker: canary rollout of version 2 beside version 1: running",
            "step 2/3: 1% → [5%] → 25%",
            "candidate share 5%; version 1 serving",
            "failures 0/1, inconclusive 2/10 in a row; next window in 12.3 s",
            "last window: pass — every guard held",
            "p99_ratio",
            "1.02",
            "340",
            "advanced",
            "moved on",
        ] {
            assert!(view.contains(needle), "{needle:?} missing from:\n{view}");
        }
    }

    #[test]
    fn the_view_says_what_runs_the_paired_copies() {
        let mut twinned = answer("running");
        twinned["rollout"]["twin"] = json!({ "loaded": true, "bytes_held": 3 << 20 });
        assert!(view(&twinned).contains("paired copies run on a twin of the stable version (3.0 MiB)"));
        twinned["rollout"]["twin"] = json!({ "loaded": false, "reason": "twin_max_mb = 0" });
        assert!(view(&twinned).contains("no twin of the stable version: twin_max_mb = 0"));
    }

    #[test]
    fn only_running_and_paused_rollouts_go_on() {
        assert!(!ended(&answer("running")) && !ended(&answer("paused")));
        for phase in ["promoted", "rolled_back", "aborted"] {
            assert!(ended(&answer(phase)), "{phase}");
        }
        assert!(ended(&json!({ "model": "m", "serving": 1, "rollout": null })));
        assert_eq!(view(&json!({ "model": "m", "serving": 1, "rollout": null })), "m: no rollout; version 1 serving\n");
    }
}
