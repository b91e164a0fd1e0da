//! `baton status` in text: the server, a row per model (what serves, the
//! decision holding it, its rollout, its last operation), a row per version
//! in memory or refused (its role, kind of update, memory and worker), then
//! a sentence for each decision in force and each error still current.
//!
//! An error is current until a later operation on its model succeeds: the
//! status document keeps the last error whatever came after, with its time,
//! and the text shows it only while nothing has gone through since.

use serde_json::Value;

use super::render::{local, mib, ms, version};

/// Every model's status, or `only` that one's.
pub fn view(status: &Value, only: Option<&str>) -> String {
    let mut out = format!(
        "server: {}{}, pid {}, baton {}\n\n",
        if status["ready"].as_bool() == Some(true) { "ready" } else { "NOT ready" },
        if status["draining"].as_bool() == Some(true) { " (draining)" } else { "" },
        version(&status["pid"]),
        status["version"].as_str().unwrap_or("?"),
    );
    if let Some(store) = status.get("store").filter(|s| !s.is_null()) {
        out.push_str(&match store["ok"].as_bool() {
            Some(true) => "store: answers\n".to_owned(),
            _ => format!(
                "store: FAILING ({}){}\n",
                text(&store["kind"]),
                store["message"].as_str().map(|m| format!(": {m}")).unwrap_or_default()
            ),
        });
    }
    if let Some(cluster) = status.get("cluster").filter(|c| !c.is_null()) {
        let connected = cluster["connected"].as_bool() == Some(true);
        out.push_str(if connected { "fleet: connected\n" } else { "fleet: NOT connected\n" });
    }
    if status.get("store").is_some_and(|s| !s.is_null()) || status.get("cluster").is_some_and(|c| !c.is_null()) {
        out.push('\n');
    }
    let models: Vec<&Value> = status["models"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| only.is_none_or(|name| m["name"] == name))
        .collect();
    if models.is_empty() {
        out.push_str("No models.\n");
        return out;
    }
    let mut rows =
        vec![["MODEL", "STATE", "SERVING", "DECISION", "ROLLOUT", "LAST OPERATION"].map(str::to_owned).to_vec()];
    for m in &models {
        rows.push(vec![
            text(&m["name"]),
            text(&m["state"]),
            version(&m["serving"]),
            decision_short(&m["decision"]),
            rollout_short(&m["rollout"]),
            last_operation(&m["last"]),
        ]);
    }
    out.push_str(&table(&rows));
    out.push('\n');
    let mut rows = vec![["MODEL", "VERSION", "ROLE", "UPDATE", "MEMORY", "WORKER"].map(str::to_owned).to_vec()];
    for m in &models {
        rows.extend(versions(m));
    }
    out.push_str(&table(&rows));
    let mut notes: Vec<String> = models.iter().flat_map(|m| notes(m)).collect();
    // One model: what each stage of its last operation took.
    if let (Some(_), [m]) = (only, models.as_slice())
        && !m["last"].is_null()
    {
        notes.push(format!(
            "{}: last {}: {}",
            text(&m["name"]),
            last_operation(&m["last"]),
            super::render::stage_list(&m["last"]["stages"])
        ));
    }
    if !notes.is_empty() {
        out.push('\n');
        for note in notes {
            out.push_str(&note);
            out.push('\n');
        }
    }
    out
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("-").to_owned()
}

/// Columns padded to their widest cell, two spaces apart.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if c + 1 < row.len() {
                line.push_str(&" ".repeat(widths[c] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The decision in force, in a word or two.
fn decision_short(d: &Value) -> String {
    match d["kind"].as_str() {
        None => "-".into(),
        Some("pin") => format!("pinned to {}", version(&d["version"])),
        Some("unload") => "kept unloaded".into(),
        Some(kind) => format!("held at {} ({kind})", version(&d["version"])),
    }
}

/// The rollout in progress (mode, phase, the candidate's share and step),
/// or how the last one ended.
fn rollout_short(r: &Value) -> String {
    let Some(phase) = r["phase"].as_str() else { return "-".into() };
    let candidate = version(&r["candidate"]);
    match phase {
        "running" | "paused" => format!(
            "{} of {candidate} {phase}, {}% (step {}/{})",
            r["mode"].as_str().unwrap_or("?"),
            r["weight_percent"].as_f64().map_or("?".into(), |w| format!("{w}")),
            r["step"].as_u64().map_or(0, |s| s + 1),
            r["plan"]["steps"].as_array().map_or(0, Vec::len),
        ),
        "watching" => format!("{candidate} promoted, watched against {}", version(&r["stable"])),
        ended => format!("last: {candidate} {}", ended.replace('_', " ")),
    }
}

/// The last operation that went through: what, to which version, how
/// long, when.
fn last_operation(last: &Value) -> String {
    if last.is_null() {
        return "-".into();
    }
    format!(
        "{} {} in {}{}",
        last["operation"].as_str().unwrap_or("?"),
        version(&last["version"]),
        ms(&last["total"]),
        last["finished_at"].as_f64().and_then(local).map(|t| format!(", {t}")).unwrap_or_default()
    )
}

/// A row per version in memory, then one per version whose last load failed.
fn versions(m: &Value) -> Vec<Vec<String>> {
    let name = text(&m["name"]);
    let previous: Vec<u64> = m["previous"].as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
    let rollout = &m["rollout"];
    let in_rollout = matches!(rollout["phase"].as_str(), Some("running" | "paused" | "watching"));
    let mut rows = Vec::new();
    for v in m["live"].as_array().into_iter().flatten() {
        let number = v["version"].as_u64();
        let role = if v["twin"].as_bool() == Some(true) {
            "twin of the stable version (runs the rollout's paired copies)".to_owned()
        } else if in_rollout && number == rollout["candidate"].as_u64() && number != m["serving"].as_u64() {
            format!("rollout candidate, {}% of requests", rollout["weight_percent"].as_f64().unwrap_or(0.0))
        } else if number.is_some() && number == m["serving"].as_u64() {
            "serving".to_owned()
        } else if in_rollout && rollout["phase"] == "watching" && number == rollout["stable"].as_u64() {
            "replaced, kept while the new version is watched".to_owned()
        } else if number.is_some_and(|n| previous.contains(&n)) {
            "previous (for rollback)".to_owned()
        } else {
            "draining".to_owned()
        };
        let role = if v["alive"].as_bool() == Some(false) { format!("{role}, its worker EXITED") } else { role };
        let worker = match v.get("worker") {
            Some(w) if !w.is_null() => format!(
                "pid {}{}",
                version(&w["pid"]),
                w["rss"].as_u64().map(|b| format!(", {} resident", mib(b))).unwrap_or_default()
            ),
            _ => "in the server".to_owned(),
        };
        rows.push(vec![
            name.clone(),
            version(&v["version"]),
            role,
            text(&v["update"]),
            v["bytes_held"].as_u64().map(mib).unwrap_or_else(|| "-".into()),
            worker,
        ]);
    }
    for (v, failure) in m["failed_versions"].as_object().into_iter().flatten() {
        rows.push(vec![
            name.clone(),
            v.clone(),
            format!("refused at {} ({})", text(&failure["stage"]), text(&failure["kind"])),
            "-".into(),
            "-".into(),
            "-".into(),
        ]);
    }
    rows
}

/// A sentence for the decision in force, each refused version, and the
/// last error while it is current.
fn notes(m: &Value) -> Vec<String> {
    let name = text(&m["name"]);
    let mut notes = Vec::new();
    let d = &m["decision"];
    if let Some(kind) = d["kind"].as_str() {
        let since = d["at"].as_f64().and_then(local).map(|t| format!(" since {t}")).unwrap_or_default();
        let what = match kind {
            "pin" => format!("pinned to version {}", version(&d["version"])),
            "unload" => "kept unloaded by an unload".to_owned(),
            "rollout" => format!("held at version {} by a rollout", version(&d["version"])),
            kind => format!("held at version {} by a {kind}", version(&d["version"])),
        };
        notes.push(format!("{name}: {what}{since}, {}.", d["holds"].as_str().unwrap_or("until changed")));
    }
    for (v, failure) in m["failed_versions"].as_object().into_iter().flatten() {
        let when = failure["at"].as_f64().and_then(local).map(|t| format!(" at {t}")).unwrap_or_default();
        notes.push(format!("{name}: version {v} was refused{when}: {}", text(&failure["message"])));
    }
    // What the repository poller found it cannot serve, and why.
    let cannot = &m["cannot_serve"];
    if !cannot.is_null() {
        let why = cannot.as_str().map(str::to_owned).unwrap_or_else(|| {
            let message = cannot["message"].as_str().or_else(|| cannot["kind"].as_str());
            message.map(str::to_owned).unwrap_or_else(|| cannot.to_string())
        });
        notes.push(format!("{name}: cannot serve: {why}"));
    }
    for u in m["unpackaged"].as_array().into_iter().flatten() {
        notes.push(format!(
            "{name}: version {} has no MANIFEST and is not loaded; run `baton package {}`",
            version(&u["version"]),
            text(&u["dir"])
        ));
    }
    if let Some(error) = current_error(m) {
        let when = error["at"].as_f64().and_then(local).map(|t| format!(" at {t}")).unwrap_or_default();
        let of = error["version"].as_u64().map(|v| format!(" of version {v}")).unwrap_or_default();
        notes.push(format!(
            "{name}: LAST ERROR{when}: {}{of} failed: {}",
            error["operation"].as_str().unwrap_or("an operation"),
            text(&error["message"])
        ));
    }
    notes
}

/// The last error, unless an operation on the model went through after
/// it, or it is a refused version's (said with that version).
fn current_error(m: &Value) -> Option<&Value> {
    let error = &m["last_error"];
    let at = error["at"].as_f64()?;
    let superseded = m["last"]["finished_at"].as_f64().is_some_and(|done| done >= at);
    let said = error["version"].as_u64().is_some_and(|v| !m["failed_versions"][v.to_string()].is_null());
    (!superseded && !said).then_some(error)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn what_the_poller_cannot_serve_is_said() {
        let m = model(json!({
            "cannot_serve": "config failed: model.toml line 3",
            "unpackaged": [{ "version": 3, "dir": "/models/ranker/3", "message": "no MANIFEST" }],
        }));
        let said = notes(&m);
        assert!(said.contains(&"ranker: cannot serve: config failed: model.toml line 3".to_owned()), "{said:?}");
        let hint = "ranker: version 3 has no MANIFEST and is not loaded; run `baton package /models/ranker/3`";
        assert!(said.contains(&hint.to_owned()), "{said:?}");
        let kind_only = model(json!({ "cannot_serve": { "kind": "config_failed" } }));
        assert!(notes(&kind_only).contains(&"ranker: cannot serve: config_failed".to_owned()));
    }

    fn model(extra: Value) -> Value {
        let mut m = json!({
            "name": "ranker", "state": "READY", "serving": 2, "previous": [1], "decision": null, "rollout": null,
            "last": { "operation": "load", "version": 2, "total": 28.2, "finished_at": 100.0, "stages": [] },
            "last_error": null, "failed_versions": {},
            "live": [
                { "version": 1, "bytes_held": 1_048_576, "update": "graph", "alive": true },
                { "version": 2, "bytes_held": 2_097_152, "update": "weights", "alive": true,
                  "worker": { "pid": 77, "rss": 10_485_760 } },
            ],
        });
        for (k, v) in extra.as_object().unwrap() {
            m[k] = v.clone();
        }
        m
    }

    fn render(m: Value) -> String {
        view(&json!({ "ready": true, "pid": 9, "version": "0.1.0", "models": [m] }), None)
    }

    #[test]
    fn versions_have_their_role_memory_and_worker() {
        let text = render(model(json!({})));
        assert!(text.contains("ranker  1        previous (for rollback)  graph    1.0 MiB  in the server"), "{text}");
        assert!(
            text.contains("ranker  2        serving                  weights  2.0 MiB  pid 77, 10.0 MiB resident"),
            "{text}"
        );
        assert!(!text.contains("LAST ERROR"), "{text}");
    }

    #[test]
    fn a_rollout_names_its_candidate_and_the_stable_versions_twin() {
        let text = render(model(json!({
            "live": [
                { "version": 2, "bytes_held": 0, "update": "graph", "alive": true },
                { "version": 2, "bytes_held": 0, "update": "graph", "alive": true, "twin": true },
                { "version": 3, "bytes_held": 0, "update": "graph", "alive": true },
            ],
            "rollout": { "phase": "running", "mode": "canary", "candidate": 3, "stable": 2, "weight_percent": 25.0,
                         "step": 1, "plan": { "steps": [1000, 2500, 10000] } },
        })));
        assert!(text.contains("canary of 3 running, 25% (step 2/3)"), "{text}");
        assert!(
            text.contains("ranker  2        twin of the stable version (runs the rollout's paired copies)"),
            "{text}"
        );
        assert!(text.contains("ranker  3        rollout candidate, 25% of requests"), "{text}");
    }

    #[test]
    fn an_error_is_current_until_an_operation_goes_through_after_it() {
        let error = json!({ "operation": "rollback", "version": null, "kind": "no_previous", "message": "no previous version", "at": 200.0 });
        let text = render(model(json!({ "last_error": error })));
        assert!(
            text.lines()
                .any(|l| l.starts_with("ranker: LAST ERROR at ")
                    && l.ends_with(": rollback failed: no previous version")),
            "{text}"
        );
        let superseded = model(
            json!({ "last_error": error, "last": { "operation": "load", "version": 2, "total": 1.0, "finished_at": 300.0 } }),
        );
        assert!(!render(superseded).contains("LAST ERROR"));
        // A refused version's error is said with that version.
        let refused = json!({ "operation": "load", "version": 3, "stage": "verify", "kind": "verify_failed", "message": "verify failed: digest", "at": 200.0 });
        let text = render(model(json!({ "last_error": refused, "failed_versions": { "3": refused } })));
        assert!(text.contains("ranker  3        refused at verify (verify_failed)"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("ranker: version 3 was refused at ") && l.ends_with("verify failed: digest")),
            "{text}"
        );
        assert!(!text.contains("LAST ERROR"), "{text}");
    }

    #[test]
    fn decisions_and_the_store_are_said() {
        let decision = json!({ "kind": "rollback", "version": 1, "at": 100, "holds": "until a version newer than 2 is published" });
        let mut status =
            json!({ "ready": true, "pid": 9, "version": "0.1.0", "models": [model(json!({ "decision": decision }))] });
        status["store"] = json!({ "ok": false, "kind": "store_unavailable", "message": "connection refused" });
        let text = view(&status, Some("ranker"));
        assert!(text.contains("store: FAILING (store_unavailable): connection refused"), "{text}");
        assert!(text.contains("held at 1 (rollback)"), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with("ranker: held at version 1 by a rollback since ")
                && l.ends_with(", until a version newer than 2 is published.")),
            "{text}"
        );
        assert!(text.contains("ranker: last load 2 in 28.2 ms"), "{text}");
    }
}
