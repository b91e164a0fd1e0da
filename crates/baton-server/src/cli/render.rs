//! How the client commands print what the server says.

use serde_json::Value;

/// Bytes in MiB, to a tenth.
pub(super) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Signed bytes in MiB, to a tenth.
fn signed_mib(bytes: i64) -> String {
    format!("{:+.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Seconds since the Unix epoch as the local date and time.
pub(super) fn local(epoch_s: f64) -> Option<String> {
    crate::clock::local(epoch_s)
}

pub(super) fn ms(v: &Value) -> String {
    v.as_f64().map(|ms| format!("{ms:.1} ms")).unwrap_or_else(|| "-".into())
}

/// "fetch 0.4 ms, verify 0.5 ms, …".
pub(super) fn stage_list(stages: &Value) -> String {
    stages
        .as_array()
        .map(|s| {
            s.iter()
                .map(|s| format!("{} {}", s["stage"].as_str().unwrap_or("?"), ms(&s["duration"])))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .join(", ")
}

pub(super) fn version(v: &Value) -> String {
    v.as_u64().map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// Lines of load progress for one event of the model being loaded: each
/// stage finished since the last event (`printed` counts those already
/// shown), then the state entered.
pub fn progress(event: &Value, printed: &mut usize) -> Vec<String> {
    let mut lines = Vec::new();
    match event["event"].as_str() {
        Some("transition") => {
            let stages = event["stages"].as_array().map(Vec::as_slice).unwrap_or_default();
            for s in stages.iter().skip(*printed) {
                lines.push(format!("  {:<9} {:>10}", s["stage"].as_str().unwrap_or("?"), ms(&s["duration"])));
            }
            *printed = stages.len().max(*printed);
            lines.push(event["to"].as_str().unwrap_or("?").to_owned());
        }
        Some("failed") => lines.push(format!(
            "FAILED at {}: {}",
            event["stage"].as_str().unwrap_or("?"),
            event["message"].as_str().unwrap_or("?")
        )),
        Some("drain_timed_out") => {
            lines.push(format!("drain timed out with {} requests still running", event["stragglers"]))
        }
        Some("paused") => lines.push(format!("PAUSED: version {} is freed first; requests wait", event["replacing"])),
        Some("resumed") => lines.push(format!("RESUMED after {}", ms(&event["paused_ms"]))),
        _ => {}
    }
    lines
}

/// The summary of an operation's report.
pub fn report(report: &Value) -> String {
    let operation = report["operation"].as_str().unwrap_or("operation");
    let mut text = format!(
        "{} {}: version {} serving (was {}), {} in all [{}]",
        operation,
        report["model"].as_str().unwrap_or("?"),
        version(&report["version"]),
        version(&report["replaced"]),
        ms(&report["total"]),
        stage_list(&report["stages"])
    );
    if report["drain_timed_out"].as_bool() == Some(true) {
        text.push_str(&format!("; drain timed out with {} stragglers", report["stragglers"]));
    }
    if !report["paused_ms"].is_null() {
        text.push_str(&format!("; paused {} (requests waited)", ms(&report["paused_ms"])));
    }
    text
}

/// The answer to a pin or unpin: what serves, and the decision in force.
pub fn decision(answer: &Value) -> String {
    let model = answer["model"].as_str().unwrap_or("?");
    let held = match answer["decision"]["kind"].as_str() {
        Some(kind) => format!(
            "; {kind} of version {} {}",
            version(&answer["decision"]["version"]),
            answer["decision"]["holds"].as_str().unwrap_or_default()
        ),
        None => "; no decision in force, it follows the newest version".to_owned(),
    };
    let mut text = format!("{model}: version {} serving{held}", version(&answer["serving"]));
    if !answer["report"].is_null() {
        text.push_str(&format!("\n{}", report(&answer["report"])));
    }
    text
}

/// One event as a line of text.
pub fn event_line(event: &Value) -> String {
    let at = event["at"].as_f64().and_then(crate::clock::local_time_of_day).unwrap_or_else(|| "?".into());
    // An event about the repository as a whole names no model.
    let model = event["model"].as_str().filter(|m| !m.is_empty()).unwrap_or("repository");
    let v = event["version"].as_u64().map(|v| format!(" v{v}")).unwrap_or_default();
    let what = match event["event"].as_str().unwrap_or("?") {
        "transition" => format!(
            "{} -> {}{}",
            event["from"].as_str().unwrap_or("?"),
            event["to"].as_str().unwrap_or("?"),
            event["stages"]
                .as_array()
                .filter(|s| !s.is_empty())
                .map(|_| format!(" [{}]", stage_list(&event["stages"])))
                .unwrap_or_default()
        ),
        "failed" => format!(
            "FAILED at {} ({}): {}",
            event["stage"].as_str().unwrap_or("?"),
            event["kind"].as_str().unwrap_or("?"),
            event["message"].as_str().unwrap_or("?")
        ),
        "finished" => format!("finished: {}", report(&event["report"])),
        "unloaded" => freed(event),
        "drain_timed_out" => format!("drain timed out, {} stragglers", event["stragglers"]),
        "paused" => format!("paused: version {} is freed before the new one loads; requests wait", event["replacing"]),
        "resumed" => format!(
            "resumed after {}: version {} serving{}",
            ms(&event["paused_ms"]),
            version(&event["serving"]),
            if event["restored"].as_bool() == Some(true) { " again, loaded back" } else { "" }
        ),
        "decision" => format!(
            "decision {} ({}): {}",
            event["change"].as_str().unwrap_or("?"),
            event["decision"].as_str().unwrap_or("?"),
            event["message"].as_str().unwrap_or("?")
        ),
        "unpackaged" => {
            let dir = event["dir"].as_str().unwrap_or("?");
            format!(
                "unpackaged: {dir} has no MANIFEST, so it is not loaded; run `baton package {dir}` once its files are complete"
            )
        }
        "store" if event["ok"].as_bool() == Some(true) => "the model store answers again".to_owned(),
        "store" => format!(
            "the model store fails ({}): {}",
            event["kind"].as_str().unwrap_or("?"),
            event["message"].as_str().unwrap_or("?")
        ),
        other => other.to_owned(),
    };
    format!("{at} {model}{v} {what}")
}

/// What freeing a version gave back, for an operator: what it held, what
/// came back, and what stayed behind.
fn freed(event: &Value) -> String {
    let bytes = |key: &str| event[key].as_u64().unwrap_or(0);
    let whose = if event["twin"].as_bool() == Some(true) { "its rollout twin" } else { "it" };
    let mut text =
        format!("freed: {whose} held {}; {} came back to the system", mib(bytes("held")), mib(bytes("returned")));
    if let Some(worker) = event.get("worker").filter(|w| !w.is_null()) {
        text.push_str(&format!(" (worker process {})", version(&worker["pid"])));
    }
    let residual = event["residual"].as_i64().unwrap_or(0);
    // Below a MiB either way is the allocator's noise.
    if residual.unsigned_abs() < 1024 * 1024 {
        text.push_str("; nothing left behind");
    } else if residual > 0 {
        text.push_str(&format!("; {} left behind since the last free", signed_mib(residual)));
    } else {
        text.push_str(&format!("; {} given back beyond it", mib(residual.unsigned_abs())));
    }
    text.push_str(&format!("; the server holds {} beyond its live versions", mib(bytes("unaccounted"))));
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_free_reads_in_mib_with_what_came_back_and_what_stayed() {
        let event = json!({
            "event": "unloaded", "model": "ranker", "version": 1, "at": 1_796_649_909.25,
            "held": 12_897_484, "returned": 12_582_912, "residual": -45_056, "unaccounted": 46_440_448,
        });
        let line = event_line(&event);
        let time = line.split(' ').next().unwrap();
        assert_eq!(Some(time.to_owned()), crate::clock::local_time_of_day(1_796_649_909.25), "{line}");
        assert!(
            line.ends_with(
                " ranker v1 freed: it held 12.3 MiB; 12.0 MiB came back to the system; nothing left behind; \
                 the server holds 44.3 MiB beyond its live versions"
            ),
            "{line}"
        );
        let grew = json!({ "event": "unloaded", "held": 0, "returned": 0, "residual": 3_145_728, "unaccounted": 0,
                           "twin": true, "worker": { "pid": 42 } });
        let line = event_line(&grew);
        assert!(line.contains("freed: its rollout twin held 0.0 MiB; 0.0 MiB came back to the system (worker process 42); +3.0 MiB left behind since the last free"), "{line}");
    }

    #[test]
    fn a_version_without_its_manifest_says_what_to_run() {
        let event = json!({ "event": "unpackaged", "model": "ranker", "version": 2, "at": 1_796_649_909.25,
                            "dir": "/srv/models/ranker/2", "message": "…" });
        let line = event_line(&event);
        assert!(
            line.ends_with(
                " ranker v2 unpackaged: /srv/models/ranker/2 has no MANIFEST, so it is not loaded; \
                 run `baton package /srv/models/ranker/2` once its files are complete"
            ),
            "{line}"
        );
    }
}
