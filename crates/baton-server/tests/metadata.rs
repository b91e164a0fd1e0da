//! What the server says about itself and its models, end to end: liveness,
//! readiness (which waits for every required model, says which it waits
//! for, and is never claimed before the repository has been listed), server metadata with its extensions, model and version metadata,
//! model and version readiness, Triton's model configuration
//! (`max_batch_size` from `model.toml`, dims without the batch dimension,
//! `TYPE_FP32`), and `/metrics` exposing every metric family with the right
//! labels and values after requests, loads, a refused load, a rollback and
//! a free.

mod common;

use baton_testkit::onnx::sample_input;
use baton_testkit::repo::{Damage, TestRepo, mlp_toml};
use baton_testkit::server::{eventually, metric};
use common::{SIZES, infer, mlp, repo_with, start};
use serde_json::json;

#[test]
fn health_server_metadata_model_metadata_readiness_and_config() {
    let repo = repo_with("m", &[1], "max_batch_size = 48\n[policy]\nkeep_previous = 1");
    let server = start(&repo, &[]);
    server.wait_ready();
    repo.publish_mlp("m", 2, &mlp(2));
    server.wait_serving("m", 2);

    let live = server.get("/v2/health/live");
    assert_eq!((live.status, live.json()), (200, json!({ "live": true })));
    let ready = server.get("/v2/health/ready");
    assert_eq!((ready.status, ready.json()["ready"].clone()), (200, json!(true)));

    let meta = server.get("/v2").json();
    assert_eq!(meta["name"], "baton");
    assert!(meta["version"].as_str().is_some_and(|v| !v.is_empty()), "{meta}");
    let extensions: Vec<&str> = meta["extensions"].as_array().unwrap().iter().filter_map(|e| e.as_str()).collect();
    for wanted in ["binary_tensor_data", "model_repository", "model_configuration", "baton_management"] {
        assert!(extensions.contains(&wanted), "extension {wanted} missing from {meta}");
    }

    let input = json!([{ "name": "input", "datatype": "FP32", "shape": [-1, SIZES[0]] }]);
    let output = json!([{ "name": "output", "datatype": "FP32", "shape": [-1, SIZES[2]] }]);
    let model = server.get("/v2/models/m");
    assert_eq!(model.status, 200);
    let model = model.json();
    assert_eq!(model["name"], "m");
    assert_eq!(model["versions"], json!(["1", "2"]), "every loaded version, the kept one included");
    assert_eq!(model["platform"], "onnxruntime_onnx");
    assert_eq!((&model["inputs"], &model["outputs"]), (&input, &output));
    let v1 = server.get("/v2/models/m/versions/1").json();
    assert_eq!((&v1["name"], &v1["inputs"], &v1["outputs"]), (&json!("m"), &input, &output));
    assert_eq!(server.get("/v2/models/m/versions/3").status, 404, "version 3 is not loaded");
    assert_eq!(server.get("/v2/models/nope").status, 404);

    let ready = server.get("/v2/models/m/ready");
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json(), json!({ "name": "m", "version": "2", "ready": true, "state": "READY" }));
    let ready = server.get("/v2/models/m/versions/1/ready");
    assert_eq!((ready.status, ready.json()["version"].clone()), (200, json!("1")));
    let ready = server.get("/v2/models/m/versions/3/ready");
    assert_eq!((ready.status, ready.json()["ready"].clone()), (503, json!(false)), "version 3 does not serve");
    assert_eq!(server.get("/v2/models/nope/ready").status, 404);

    let config = server.get("/v2/models/m/config");
    assert_eq!(config.status, 200);
    let config = config.json();
    assert_eq!(config["name"], "m");
    assert_eq!(config["max_batch_size"], 48, "from model.toml: {config}");
    assert_eq!(config["platform"], "onnxruntime_onnx");
    assert_eq!(config["input"][0]["name"], "input");
    assert_eq!(config["input"][0]["data_type"], "TYPE_FP32");
    assert_eq!(config["input"][0]["dims"], json!([SIZES[0]]), "dims exclude the batch dimension: {config}");
    assert_eq!(config["output"][0]["name"], "output");
    assert_eq!(config["output"][0]["data_type"], "TYPE_FP32");
    assert_eq!(config["output"][0]["dims"], json!([SIZES[2]]));
    assert_eq!(server.get("/v2/models/m/versions/1/config").json()["max_batch_size"], 48);
    assert_eq!(server.get("/v2/models/nope/config").status, 404);
}

#[test]
fn readiness_waits_for_required_models_only() {
    let repo = repo_with("good", &[1], "");
    let broken = mlp(2);
    repo.add_model("broken", &mlp_toml(&broken, ""));
    repo.publish_damaged("broken", 1, &broken, Damage::FlipByte);
    // The strict setting: by default a model whose every version is
    // refused is not waited for (tests/operator_errors.rs).
    let server = start(&repo, &["--readiness", "all"]);
    server.wait_serving("good", 1);
    eventually("the broken model's load to be refused", || {
        server.status("broken")["failed_versions"].get("1").map(|_| ())
    });

    let ready = server.get("/v2/health/ready");
    assert_eq!(ready.status, 503, "a required model does not serve");
    let body = ready.json();
    assert_eq!((&body["ready"], &body["draining"]), (&json!(false), &json!(false)));
    assert_eq!(body["waiting_for"], json!(["broken"]), "{body}");
    assert_eq!(metric(&server.metrics(), "baton_ready"), Some(0.0));

    // The model is no longer required: the server becomes ready at the next scan.
    repo.add_model("broken", &mlp_toml(&broken, "required = false"));
    server.wait_ready();
    assert_eq!(metric(&server.metrics(), "baton_ready"), Some(1.0));
}

#[test]
fn readiness_is_not_claimed_before_the_repository_is_listed() {
    // A model.toml that takes a while to parse makes the first listing of
    // the repository slow; until it is done the server does not know which
    // models it waits for, and must not say it is ready.
    let repo = repo_with("a-required", &[1], "");
    let slow_to_parse = format!("required = false\n[engine]\nfiller = [{}]\n", vec!["1"; FILLER].join(", "));
    repo.add_model("b-filler", &slow_to_parse);
    let server = start(&repo, &[]);
    server.wait_ready();
    let input = sample_input(SIZES[0], 1, 22);
    let (version, output) = infer(&server, "a-required", &input, 1);
    assert_eq!(version, 1, "ready means the required model serves");
    common::assert_close(&output, &mlp(1).forward(&input, 1), "the first request after ready");
}

/// Elements of an array in a model.toml, to make it slow to parse.
const FILLER: usize = 20_000;

#[test]
fn metrics_expose_every_family_with_its_labels() {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), "[policy]\nkeep_previous = 1"));
    repo.publish_mlp("m", 1, &mlp(1));
    let server = start(&repo, &[]);
    server.wait_ready();
    repo.publish_mlp("m", 2, &mlp(2));
    server.wait_serving("m", 2);

    let batch = 2;
    let input = sample_input(SIZES[0], batch, 21);
    let sent = 5;
    for _ in 0..sent {
        assert_eq!(infer(&server, "m", &input, batch).0, 2);
    }
    let _ = common::infer_at(&server, "/v2/models/m/versions/1/infer", &input, batch);
    let bad = server.post_raw("/v2/models/m/infer", b"{not json", &[("content-type", "application/json")]);
    assert_eq!(bad.status, 400);
    let mut wrong = common::request(&input, batch);
    wrong["inputs"][0]["shape"] = json!([batch * 2, SIZES[0] / 2]);
    assert_eq!(server.post_json("/v2/models/m/infer", &wrong).status, 400);

    // A refused version: counted by the stage that refused it.
    repo.publish_damaged("m", 3, &mlp(3), Damage::FlipByte);
    eventually("version 3 to be refused, and the model free again", || {
        let status = server.status("m");
        (status["failed_versions"].get("3").is_some() && status["busy"] == false).then_some(())
    });
    let m = |series: &str| format!("{series}{{model=\"m\"}}");
    // Load metrics are fed from the event stream, a moment after the fact.
    let text = eventually("the metrics to count both loads and the refusal", || {
        let text = server.metrics();
        let loads = metric(&text, &m("baton_load_duration_seconds_count"));
        let refused = metric(&text, "baton_load_failures_total{model=\"m\",stage=\"verify\"}");
        (loads == Some(2.0) && refused == Some(1.0)).then_some(text)
    });

    for family in [
        "baton_ready",
        "baton_inflight_requests",
        "baton_inference_requests_total",
        "baton_inference_errors_total",
        "baton_inference_duration_seconds",
        "baton_load_duration_seconds",
        "baton_load_stage_duration_seconds",
        "baton_load_failures_total",
        "baton_rollbacks_total",
        "baton_unloads_total",
        "baton_memory_residual_bytes",
        "baton_unload_residual_bytes",
        "baton_events_missed_total",
        "baton_model_active_version",
        "baton_model_load_in_progress",
        "baton_model_state",
        "baton_model_live_versions",
        "baton_version_bytes_held",
        "baton_loader_step_asides_total",
        "baton_loader_step_aside_seconds_total",
        "baton_loader_step_asides_declined_total",
    ] {
        assert!(text.contains(&format!("# HELP {family} ")), "no HELP for {family}");
        assert!(text.contains(&format!("# TYPE {family} ")), "no TYPE for {family}");
    }
    assert_eq!(metric(&text, "baton_ready"), Some(1.0));
    assert_eq!(metric(&text, "baton_inflight_requests"), Some(0.0), "no inference runs while /metrics answers");
    let v2 = "model=\"m\",version=\"2\",role=\"stable\"";
    // The request refused by the version's signature reached version 2 too.
    let sent = sent + 1;
    assert_eq!(metric(&text, &format!("baton_inference_requests_total{{{v2}}}")), Some(sent as f64));
    assert_eq!(metric(&text, "baton_inference_requests_total{model=\"m\",version=\"1\",role=\"previous\"}"), Some(1.0));
    assert_eq!(metric(&text, &format!("baton_inference_duration_seconds_count{{{v2}}}")), Some(sent as f64));
    assert_eq!(
        metric(&text, &format!("baton_inference_duration_seconds_bucket{{{v2},le=\"+Inf\"}}")),
        Some(sent as f64)
    );
    assert!(metric(&text, &format!("baton_inference_duration_seconds_sum{{{v2}}}")).is_some_and(|s| s > 0.0));
    let refused_json = "baton_inference_errors_total{model=\"m\",version=\"\",role=\"\",kind=\"invalid_json\"}";
    assert_eq!(metric(&text, refused_json), Some(1.0), "a request refused before a version was chosen");
    let invalid_input =
        "baton_inference_errors_total{model=\"m\",version=\"2\",role=\"stable\",kind=\"invalid_input\"}";
    assert_eq!(metric(&text, invalid_input), Some(1.0), "a request refused by the version's signature");

    // Two loads went through (1, 2): each stage timed twice.
    assert_eq!(metric(&text, &m("baton_load_duration_seconds_count")), Some(2.0));
    for stage in ["fetch", "verify", "load", "validate", "warmup", "commit", "drain"] {
        let series = format!("baton_load_stage_duration_seconds_count{{model=\"m\",stage=\"{stage}\"}}");
        assert_eq!(metric(&text, &series), Some(2.0), "{series}");
    }
    assert_eq!(metric(&text, "baton_load_failures_total{model=\"m\",stage=\"verify\"}"), Some(1.0));
    assert_eq!(metric(&text, &m("baton_model_active_version")), Some(2.0));
    assert_eq!(metric(&text, &m("baton_model_live_versions")), Some(2.0), "2 serves, 1 is kept");
    assert_eq!(metric(&text, &m("baton_model_load_in_progress")), Some(0.0));
    assert_eq!(metric(&text, "baton_model_state{model=\"m\",state=\"READY\"}"), Some(1.0));
    for version in [1, 2] {
        let series = format!("baton_version_bytes_held{{model=\"m\",version=\"{version}\",twin=\"false\"}}");
        assert!(metric(&text, &series).is_some(), "{series} missing");
    }
    // No rollback yet: the counter is there, at 0, from the model's first
    // event on.
    assert_eq!(metric(&text, &m("baton_rollbacks_total")), Some(0.0), "no rollback yet");

    // A rollback: counted, the active version moves back, version 2 is freed.
    let rollback = server.post_json("/baton/v1/models/m/rollback", &json!({}));
    assert_eq!(rollback.status, 200, "{}", String::from_utf8_lossy(&rollback.body));
    let text = eventually("the rollback to be counted and version 2 freed", || {
        let text = server.metrics();
        let freed = metric(&text, &m("baton_unloads_total")) == Some(1.0);
        (freed && metric(&text, &m("baton_rollbacks_total")) == Some(1.0)).then_some(text)
    });
    assert_eq!(metric(&text, &m("baton_model_active_version")), Some(1.0));
    assert_eq!(metric(&text, &m("baton_model_live_versions")), Some(1.0));
    assert!(metric(&text, "baton_memory_residual_bytes").is_some());
    assert!(metric(&text, "baton_memory_unaccounted_bytes").is_some_and(|b| b > 0.0), "the server itself takes memory");
    assert!(metric(&text, "baton_unload_residual_bytes{model=\"m\",version=\"2\"}").is_some());
    assert!(metric(&text, "baton_version_bytes_held{model=\"m\",version=\"2\",twin=\"false\"}").is_none(), "2 is gone");
    for stage in ["commit", "drain"] {
        let series = format!("baton_load_stage_duration_seconds_count{{model=\"m\",stage=\"{stage}\"}}");
        assert_eq!(metric(&text, &series), Some(3.0), "two loads and a rollback: {series}");
    }
    assert_eq!(metric(&text, "baton_events_missed_total"), Some(0.0));
    // Stepping aside is off unless --loader-step-aside: the counters exist and stay at zero.
    let steps = metric(&text, "baton_loader_step_asides_total").expect("step-aside counter");
    let paused = metric(&text, "baton_loader_step_aside_seconds_total").expect("step-aside time");
    assert_eq!((steps, paused), (0.0, 0.0), "loads stepped aside without --loader-step-aside");
    let cap = format!("stepped aside {} times its CPU time", baton_core::threads::step_aside::MAX_PAUSED_PER_CPU);
    assert!(text.contains(&cap), "the declined counter's help names the cap");
}

/// During a canary the stable version runs twice, its second instance (the
/// twin, in a worker of its own here) running the paired copies: every
/// series of `/metrics` is still one name with one set of labels, so
/// Prometheus keeps every sample, and the twin's series say `twin="true"`.
#[test]
fn every_series_is_unique_while_a_twin_of_the_stable_version_runs() {
    let repo = repo_with("m", &[1], "[engine]\nisolation = \"process\"\n");
    let server = start(&repo, &["--no-watch"]);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    let plan = json!({ "steps": [10, 100], "interval_ms": 600_000, "watch_ms": 0 });
    eventually("the rollout to start", || {
        let answer = server.post_json("/baton/v1/models/m/rollout", &plan);
        match answer.status {
            200 => Some(()),
            409 if answer.json()["kind"] == "load_in_progress" => None,
            _ => panic!("start: {}", answer.error()),
        }
    });
    eventually("the canary to run with a twin", || {
        let rollout = server.get("/baton/v1/models/m/rollout").json();
        (rollout["rollout"]["twin"]["loaded"] == true).then_some(())
    });
    let text = server.metrics();
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (key, _value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample without a value: {line}"));
        assert!(seen.insert(key.to_owned()), "a second sample for {key} in:\n{text}");
    }
    for family in ["baton_version_bytes_held", "baton_version_memory_bytes", "baton_worker_resident_bytes"] {
        let twin = format!("{family}{{model=\"m\",version=\"1\",twin=\"true\"");
        let stable = format!("{family}{{model=\"m\",version=\"1\",twin=\"false\"");
        assert!(
            text.contains(&twin) && text.contains(&stable),
            "{family}: the twin and the stable version in:\n{text}"
        );
    }
    common::assert_no_panic(&server);
}
