//! The status documents REST (`/baton/v1/status`,
//! `/baton/v1/models/{m}/status`) and gRPC (`Management.Status`) share:
//! the registry's view of each model, with the operator's decision in
//! force beside it.

use baton_core::registry::ModelStatus;
use baton_core::registry::events::State;
use serde_json::{Value, json};

use crate::app::App;
use crate::clock::add_rfc3339;
use crate::decisions::view;

/// One model's status with its decision (`null` when none is in force),
/// each time in it also in RFC 3339. Why the watcher gave the model up
/// names paths and what a store said: its message is for a `privileged`
/// caller only.
fn with_decision(app: &App, status: &ModelStatus, privileged: bool) -> Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        fields.insert("decision".into(), app.decisions.get(&status.name).as_ref().map(view).into());
        // What the repository watcher found it cannot load, and why.
        if let serde_json::Value::Object(found) = app.findings(|f| f.of(&status.name, privileged)) {
            fields.extend(found);
        }
    }
    for (key, time) in [("decision", "at"), ("last", "finished_at"), ("last_error", "at")] {
        if let Some(part) = value.get_mut(key) {
            add_rfc3339(part, time);
        }
    }
    if let Some(failed) = value.get_mut("failed_versions").and_then(Value::as_object_mut) {
        failed.values_mut().for_each(|f| add_rfc3339(f, "at"));
    }
    if let Some(rollout) = value.get_mut("rollout") {
        add_rollout_times(rollout);
    }
    if let Some(live) = value.get_mut("live").and_then(Value::as_array_mut) {
        live.iter_mut().filter_map(|v| v.get_mut("worker")).for_each(|w| add_rfc3339(w, "started_at"));
    }
    value
}

/// Beside each decision's `at_ms` in a rollout's document (or `null`),
/// puts `at_rfc3339`.
pub fn add_rollout_times(rollout: &mut Value) {
    // `get_mut`, not indexing: indexing a `null` rollout would make it an object.
    let decisions = rollout.get_mut("decisions").and_then(Value::as_array_mut);
    for decision in decisions.into_iter().flatten() {
        if let Some(ms) = decision.get("at_ms").and_then(Value::as_u64) {
            decision["at_rfc3339"] = crate::clock::rfc3339(ms as f64 / 1000.0).into();
        }
    }
}

/// The status of a model the registry has not touched since start, but
/// about which a decision is in force (one kept unloaded, say).
fn idle(model: &str) -> ModelStatus {
    ModelStatus {
        name: model.to_owned(),
        state: State::Idle,
        serving: None,
        previous: Vec::new(),
        live: Vec::new(),
        retained: 0,
        busy: false,
        paused: false,
        working_on: None,
        last: None,
        last_error: None,
        failed_versions: Default::default(),
        rollout: None,
        workers: Default::default(),
    }
}

/// One model's status, if the registry knows it or a decision names it;
/// a `privileged` caller also sees why the repository poller gave it up.
pub fn model_as(app: &App, model: &str, privileged: bool) -> Option<Value> {
    let known = || app.decisions.get(model).is_some() || app.findings(|f| f.knows(model));
    let status = app.registry.status(model).or_else(|| known().then(|| idle(model)))?;
    Some(with_decision(app, &status, privileged))
}

/// The server's status: readiness and every model. In a fleet, anyone
/// sees whether the replica is connected; a `privileged` caller (one the
/// management scope would let in) also sees the fleet's details: the
/// errors, which name etcd's endpoints, and the timings.
pub fn server(app: &App, privileged: bool) -> Value {
    let mut statuses = app.registry.statuses();
    let found: Vec<String> = app.findings(|f| f.cannot_serve.keys().chain(f.unpackaged.keys()).cloned().collect());
    for name in app.decisions.all().into_keys().chain(found) {
        if !statuses.iter().any(|s| s.name == name) {
            statuses.push(idle(&name));
        }
    }
    statuses.sort_by(|a, b| a.name.cmp(&b.name));
    let models: Vec<Value> = statuses.iter().map(|s| with_decision(app, s, privileged)).collect();
    let mut status = json!({
        "ready": app.ready(),
        "draining": app.draining(),
        "pid": std::process::id(),
        "process_started": baton_drill::rss::start_time(std::process::id()),
        "version": crate::build::version(),
        "required": app.required(),
        "models": models,
    });
    if let Some(answer) = app.registry.source().store_answer() {
        // The message names the store and what it said: for management only.
        status["store"] = if privileged {
            json!({
                "url": answer.url,
                "ok": answer.ok,
                "kind": answer.kind,
                "message": answer.message,
                "failures": answer.failures,
                "listings": answer.listings,
                "bytes_fetched": answer.bytes_fetched,
                "cache_hits": answer.cache_hits,
            })
        } else {
            json!({ "ok": answer.ok, "kind": answer.kind })
        };
    }
    if let Some(health) = app.cluster.get() {
        status["cluster"] = if privileged {
            serde_json::to_value(health.state()).unwrap_or_default()
        } else {
            json!({ "connected": health.connected() })
        };
    }
    status
}
