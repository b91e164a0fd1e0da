//! How the client commands print what the server says.

use serde_json::Value;

fn ms(v: &Value) -> String {
    v.as_f64().map(|ms| format!("{ms:.1} ms")).unwrap_or_else(|| "-".into())
}

fn stage_list(stages: &Value) -> String {
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

fn version(v: &Value) -> String {
    v.as_u64().map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// The status table.
pub fn status_table(status: &Value) -> String {
    let mut out = format!(
        "server: {}{}\n",
        if status["ready"].as_bool() == Some(true) { "ready" } else { "NOT ready" },
        if status["draining"].as_bool() == Some(true) { " (draining)" } else { "" }
    );
    out.push_str(&format!(
        "{:<20} {:<9} {:>7} {:<10} {:<10} {:>10}  {}\n",
        "MODEL", "STATE", "SERVING", "PREVIOUS", "LIVE", "LAST LOAD", "LAST ERROR"
    ));
    for m in status["models"].as_array().into_iter().flatten() {
        let list = |v: &Value, key: Option<&str>| {
            v.as_array()
                .map(|a| a.iter().map(|x| version(key.map_or(x, |k| &x[k]))).collect::<Vec<_>>().join(","))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "-".into())
        };
        let last = if m["last"].is_null() { "-".into() } else { ms(&m["last"]["total"]) };
        let error = m["last_error"]["message"].as_str().unwrap_or("-");
        out.push_str(&format!(
            "{:<20} {:<9} {:>7} {:<10} {:<10} {:>10}  {}\n",
            m["name"].as_str().unwrap_or("?"),
            m["state"].as_str().unwrap_or("?"),
            version(&m["serving"]),
            list(&m["previous"], None),
            list(&m["live"], Some("version")),
            last,
            error
        ));
    }
    out
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
    let at = event["at"].as_f64().unwrap_or_default();
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
        "unloaded" => format!(
            "freed: held {} B, returned {} B, residual {} B, unaccounted {} B",
            event["held"], event["returned"], event["residual"], event["unaccounted"]
        ),
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
        "store" if event["ok"].as_bool() == Some(true) => "the model store answers again".to_owned(),
        "store" => format!(
            "the model store fails ({}): {}",
            event["kind"].as_str().unwrap_or("?"),
            event["message"].as_str().unwrap_or("?")
        ),
        other => other.to_owned(),
    };
    format!("{at:.3} {model}{v} {what}")
}
