//! The metric guards' Prometheus at the edge of trust, black box.
//!
//! - A model's name goes into a guard's query as a PromQL string, escaped:
//!   a name with quotes and braces reads its own series, never a different
//!   query (the real Prometheus answers).
//! - The Prometheus URL's credentials and query string reach no error, no
//!   status, no metric and no log line.
//! - A Prometheus that stalls (a listener that accepts and never answers)
//!   holds up no operator: pausing, resuming and aborting the rollout are
//!   answered while the controller's query waits.

mod common;

use baton_testkit::prometheus::{Exporter, Prometheus, Stalled};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::{Server, eventually};
use common::{mlp, plain_log, start};
use serde_json::{Value, json};

/// A server of `name` serving version 1, with version 2 published beside it.
fn two_versions(name: &str, args: &[&str]) -> (TestRepo, Server) {
    let repo = TestRepo::new();
    repo.add_model(name, &mlp_toml(&mlp(1), "[policy]\nkeep_previous = 1\n"));
    repo.publish_mlp(name, 1, &mlp(1));
    let mut all = vec!["--no-watch"];
    all.extend_from_slice(args);
    let server = start(&repo, &all);
    server.wait_settled(&segment(name), 1);
    repo.publish_mlp(name, 2, &mlp(2));
    (repo, server)
}

/// A model name as a URL path segment.
fn segment(name: &str) -> String {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Starts a rollout of version 2 of `name`, retrying while the start's
/// load still holds the model.
fn start_rollout(server: &Server, name: &str, body: &Value) {
    let path = format!("/baton/v1/models/{}/rollout", segment(name));
    eventually("the rollout to start", || {
        let answer = server.post_json(&path, body);
        match answer.status {
            200 => Some(()),
            409 if answer.json()["kind"] == "load_in_progress" => None,
            _ => panic!("start: {}", String::from_utf8_lossy(&answer.body)),
        }
    });
}

fn status(server: &Server, name: &str) -> Value {
    server.get(&format!("/baton/v1/models/{}/rollout", segment(name))).json()
}

/// The metric guard's check in the last judged window, once there is one.
fn judged_metric(server: &Server, name: &str, guard: &str) -> (Value, Value) {
    eventually("a judged window", || {
        let status = status(server, name);
        let decisions = status["rollout"]["decisions"].as_array().cloned().unwrap_or_default();
        let judged = decisions.iter().rev().find(|d| !d["verdict"].is_null())?;
        let checks = judged["verdict"]["checks"].as_array()?;
        let check = checks.iter().find(|c| c["guard"] == format!("metric:{guard}"))?.clone();
        Some((check, status))
    })
}

/// A plan with one metric guard that reads `shop_ctr` for the model and
/// the side's version, judged every `interval_ms`.
fn ctr_plan(interval_ms: u64) -> Value {
    let ctr =
        json!({ "name": "ctr", "query": "shop_ctr{model=\"{{model}}\",version=\"{{version}}\"}", "min_ratio": 0.9 });
    json!({ "steps": [50, 100], "interval_ms": interval_ms, "watch_ms": 0, "max_inconclusive": 1000,
            "guards": { "min_samples": 1, "metrics": [ctr] } })
}

/// Sends `count` inference requests to `name`, so that windows have samples.
fn traffic(server: &Server, name: &str, count: usize) {
    let input = baton_testkit::onnx::sample_input(common::SIZES[0], 1, 7);
    for _ in 0..count {
        let answer = server.post_json(&format!("/v2/models/{}/infer", segment(name)), &common::request(&input, 1));
        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    }
}

#[test]
fn a_model_name_with_quotes_reads_its_own_series_never_another_query() {
    // Unescaped, this name would close the label's string and make the
    // query `shop_ctr{model="x"} or vector(0.5) or shop_ctr{...}`: 0.5 on
    // both sides, a pass.
    let name = r#"x"} or vector(0.5) or shop_ctr{model="x"#;
    let label = name.replace('\\', "\\\\").replace('"', "\\\"");
    let page = format!(
        "# TYPE shop_ctr gauge\nshop_ctr{{model=\"{label}\",version=\"1\"}} 0.20\n\
         shop_ctr{{model=\"{label}\",version=\"2\"}} 0.08\n"
    );
    let exporter = Exporter::start(&page);
    let prometheus = Prometheus::start(&exporter.target());
    let (_repo, server) = two_versions(name, &["--prometheus-url", &prometheus.url()]);
    start_rollout(&server, name, &ctr_plan(500));
    traffic(&server, name, 40);
    let (check, status) = judged_metric(&server, name, "ctr");
    let value = check["value"].as_f64().unwrap_or_else(|| panic!("no value read: {check}\n{status}"));
    assert!((value - 0.4).abs() < 1e-9, "the candidate's 0.08 over the stable version's 0.20: {check}");
    assert_eq!(check["outcome"], "fail", "{check}");
    drop(exporter);
}

#[test]
fn credentials_in_the_prometheus_url_reach_no_error_status_metric_or_log() {
    // A port nobody listens on: every query fails, and says so.
    let port = baton_testkit::server::free_port();
    let url = format!("http://watcher:Pa55-s3cret@127.0.0.1:{port}/prom?token=Qu3ry-T0ken");
    let (_repo, server) = two_versions("m", &["--prometheus-url", &url]);
    start_rollout(&server, "m", &ctr_plan(300));
    traffic(&server, "m", 20);
    let (check, status) = judged_metric(&server, "m", "ctr");
    assert_eq!(check["outcome"], "inconclusive", "{check}");
    let note = check["note"].as_str().unwrap_or_default();
    assert!(note.contains("did not answer") && note.contains(&format!("127.0.0.1:{port}")), "{note}");
    let everything =
        [status.to_string(), server.get("/baton/v1/status").json().to_string(), server.metrics(), plain_log(&server)];
    for (what, text) in ["rollout status", "status", "metrics", "log"].iter().zip(everything) {
        for secret in ["Pa55-s3cret", "Qu3ry-T0ken", "watcher:"] {
            assert!(!text.contains(secret), "the {what} shows {secret}: {text}");
        }
    }
}

#[test]
fn an_operator_is_answered_while_prometheus_stalls() {
    let stalled = Stalled::start();
    // Long enough that the controller's query outlasts the test.
    let (_repo, server) = two_versions("m", &["--prometheus-url", &stalled.url(), "--prometheus-timeout", "120s"]);
    start_rollout(&server, "m", &ctr_plan(100));
    eventually("the controller's query to reach the stalled Prometheus", || (stalled.accepted() > 0).then_some(()));
    for operation in ["pause", "resume", "abort"] {
        let answer = server.post_json(&format!("/baton/v1/models/m/rollout/{operation}"), &json!({}));
        assert_eq!(answer.status, 200, "{operation}: {}", String::from_utf8_lossy(&answer.body));
    }
    assert_eq!(status(&server, "m")["rollout"]["phase"], "aborted");
    // The model is free for the next operation at once.
    start_rollout(&server, "m", &json!({ "steps": [50, 100], "interval_ms": 600000 }));
    assert_eq!(status(&server, "m")["rollout"]["phase"], "running");
}
