//! What an operator is told when a model cannot serve, on the real binary.
//!
//! - Readiness: by default, a new model that cannot load does not take a
//!   server that serves its other models out of its load balancer; a
//!   server that serves nothing is not ready; `--readiness all` waits for
//!   every model.
//! - A `model.toml` that does not parse fails at stage `config` (not
//!   `fetch`), says the fix is taken up, and fixing the file loads the
//!   model without an operator's call.

mod common;

use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::{Server, eventually};
use common::{mlp, plain_log, start};
use serde_json::{Value, json};

/// `model.toml` with a typo in a key, as an operator makes one.
fn typo_toml() -> String {
    mlp_toml(&mlp(1), "max_batch_sise = 8")
}

/// A repository with a model `good` that loads and a model `bad` whose
/// `model.toml` has a typo, each with version 1.
fn good_and_bad() -> TestRepo {
    let repo = TestRepo::new();
    repo.add_model("good", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("good", 1, &mlp(1));
    repo.add_model("bad", &typo_toml());
    repo.publish_mlp("bad", 1, &mlp(1));
    repo
}

/// The server's event stream, read from as far as it has come.
struct Events {
    stream: std::net::TcpStream,
    seen: String,
}

impl Events {
    fn open(server: &baton_testkit::server::Server) -> Events {
        let address = server.base().trim_start_matches("http://").to_owned();
        let mut stream = std::net::TcpStream::connect(&address).expect("connecting");
        common::conn::send_get(&mut stream, "/baton/v1/events");
        stream.set_read_timeout(Some(std::time::Duration::from_millis(200))).expect("a read timeout");
        Events { stream, seen: String::new() }
    }

    /// Reads until the stream so far contains `needle` (or a minute passed).
    fn wait_for(&mut self, needle: &str) -> String {
        use std::io::Read;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut buf = [0u8; 8192];
        while !self.seen.contains(needle) {
            assert!(std::time::Instant::now() < deadline, "no event with {needle:?} in:\n{}", self.seen);
            match self.stream.read(&mut buf) {
                Ok(0) => panic!("the event stream ended:\n{}", self.seen),
                Ok(n) => self.seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("reading events: {e}"),
            }
        }
        self.seen.clone()
    }
}

/// Waits until the model's last error is known, and returns it.
fn last_error(server: &baton_testkit::server::Server, model: &str) -> Value {
    eventually(&format!("{model} to report its failure"), || {
        let status = server.get(&format!("/baton/v1/models/{model}/status"));
        let status = (status.status == 200).then(|| status.json())?;
        (status["busy"] == false && !status["last_error"].is_null()).then(|| status["last_error"].clone())
    })
}

#[test]
fn a_new_model_that_cannot_load_leaves_the_server_ready() {
    let repo = good_and_bad();
    let (_dir, file) = common::token_file(TOKEN);
    let server = start(&repo, &["--admin-token-file", &file]);
    server.wait_settled("good", 1);
    last_error(&server, "bad");
    server.wait_ready();
    let ready = server.get("/v2/health/ready").json();
    assert_eq!(ready["ready"], true);
    // Anyone is told which model and at what stage; the message, which
    // names repository paths, is for those management would let in.
    assert_eq!(ready["cannot_serve"]["bad"], json!({ "kind": "config_failed", "stage": "config" }), "{ready}");
    let status = server.get("/baton/v1/status").json();
    let bad = status["models"].as_array().into_iter().flatten().find(|m| m["name"] == "bad").cloned();
    assert_eq!(bad.map(|m| m["cannot_serve"].clone()), Some(json!({ "kind": "config_failed", "stage": "config" })));
    let client = baton_testkit::server::Client::new(server.base());
    let privileged = [("authorization", BEARER)];
    let ready = client.get_with("/v2/health/ready", &privileged).json();
    let message = ready["cannot_serve"]["bad"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("model.toml"), "{ready}");
    let status = client.get_with("/baton/v1/status", &privileged).json();
    let bad = status["models"].as_array().into_iter().flatten().find(|m| m["name"] == "bad").cloned();
    assert!(bad.is_some_and(|m| m["cannot_serve"]["message"] == message), "{status}");
    // The model's own status likewise.
    let own = server.get("/baton/v1/models/bad/status").json();
    assert_eq!(own["cannot_serve"], json!({ "kind": "config_failed", "stage": "config" }), "{own}");
    let own = client.get_with("/baton/v1/models/bad/status", &privileged).json();
    assert_eq!(own["cannot_serve"]["message"], message, "{own}");
    assert_eq!(server.get("/v2/models/bad/ready").status, 503, "the model's own readiness stays exact");
    assert_eq!(server.get("/v2/models/good/ready").status, 200);
    common::assert_no_panic(&server);
}

/// The admin token of servers started with `--admin-token-file`.
const TOKEN: &str = "operator-errors-token";
const BEARER: &str = "Bearer operator-errors-token";

#[test]
fn a_model_refused_for_a_reason_of_the_moment_is_waited_for_and_tried_again() {
    let repo = TestRepo::new();
    repo.add_model("good", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("good", 1, &mlp(1));
    // A memory budget smaller than the version's files: refused at load,
    // not for anything wrong with the files.
    repo.add_model("big", &mlp_toml(&mlp(1), "[policy]\nmemory_budget = 1"));
    repo.publish_mlp("big", 1, &mlp(1));
    let server = start(&repo, &[]);
    server.wait_settled("good", 1);
    let error = last_error(&server, "big");
    assert_eq!(error["kind"], "memory_budget_exceeded", "{error}");
    // Readiness waits through its first tries, then excuses it while the
    // tries go on: the model that serves is not held out of its balancer.
    let ready = eventually("big to be excused", || {
        let ready = server.get("/v2/health/ready");
        (ready.status == 200).then_some(ready.json())
    });
    assert_eq!(ready["cannot_serve"]["big"]["kind"], "memory_budget_exceeded", "{ready}");
    let tries = plain_log(&server).matches("will be tried again").count();
    assert!(tries >= 4, "excused after {tries} tries, before its fourth");

    // The budget grows: the model is tried again, with no operator's call.
    repo.add_model("big", &mlp_toml(&mlp(1), "[policy]\nmemory_budget = \"4GiB\""));
    server.wait_settled("big", 1);
    server.wait_ready();
    let ready = server.get("/v2/health/ready").json();
    assert!(ready["cannot_serve"].is_null(), "{ready}");
}

#[test]
fn an_older_version_serves_while_a_newer_one_fails_for_a_reason_of_the_moment() {
    let repo = TestRepo::new();
    // Version 2 is some 3 MiB of weights, over the model's budget; version
    // 1 is a few KiB under it.
    repo.add_model("m", &mlp_toml(&mlp(1), "[policy]\nmemory_budget = \"2MiB\""));
    repo.publish_mlp("m", 1, &mlp(1));
    repo.publish_mlp("m", 2, &baton_testkit::onnx::Mlp::new(&[8, 65536, 2], 7));
    let server = start(&repo, &[]);
    server.wait_settled("m", 1);
    server.wait_ready();
    // Version 2 is tried again, more than once, while version 1 serves.
    eventually("version 2 to be tried again twice", || {
        (plain_log(&server).matches("will be tried again").count() >= 2).then_some(())
    });
    assert_eq!(server.status("m")["serving"], 1);
    // The budget grows: version 2 is taken up with no operator's call.
    repo.add_model("m", &mlp_toml(&mlp(1), "[policy]\nmemory_budget = \"4GiB\""));
    server.wait_settled("m", 2);
}

#[test]
fn a_server_that_does_not_poll_excuses_a_model_of_the_moment_at_once() {
    let repo = TestRepo::new();
    repo.add_model("good", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("good", 1, &mlp(1));
    repo.add_model("big", &mlp_toml(&mlp(1), "[policy]\nmemory_budget = 1"));
    repo.publish_mlp("big", 1, &mlp(1));
    // Nothing would ever try it again: waiting would be for ever.
    let server = start(&repo, &["--no-poll"]);
    server.wait_settled("good", 1);
    server.wait_ready();
    let ready = server.get("/v2/health/ready").json();
    assert_eq!(ready["cannot_serve"]["big"]["kind"], "memory_budget_exceeded", "{ready}");
}

#[test]
fn a_model_loaded_by_hand_is_no_longer_listed_as_one_that_cannot_serve() {
    let repo = good_and_bad();
    let server = start(&repo, &["--no-poll"]);
    server.wait_settled("good", 1);
    last_error(&server, "bad");
    eventually("bad to be given up on", || {
        (!server.get("/v2/health/ready").json()["cannot_serve"]["bad"].is_null()).then_some(())
    });
    repo.add_model("bad", &mlp_toml(&mlp(1), "max_batch_size = 8"));
    let load = server.post_json("/baton/v1/models/bad/load", &json!({}));
    assert_eq!(load.status, 200, "{}", String::from_utf8_lossy(&load.body));
    let ready = server.get("/v2/health/ready").json();
    assert!(ready["cannot_serve"].is_null(), "{ready}");
    assert!(server.status("bad")["cannot_serve"].is_null(), "{}", server.status("bad"));
}

#[test]
fn the_strict_setting_waits_for_every_model() {
    let repo = good_and_bad();
    let server = start(&repo, &["--readiness", "all"]);
    server.wait_settled("good", 1);
    last_error(&server, "bad");
    let ready = server.get("/v2/health/ready");
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json()["waiting_for"], json!(["bad"]));
}

#[test]
fn a_server_that_serves_nothing_is_not_ready() {
    let repo = TestRepo::new();
    repo.add_model("bad", &typo_toml());
    repo.publish_mlp("bad", 1, &mlp(1));
    let server = start(&repo, &[]);
    last_error(&server, "bad");
    let ready = server.get("/v2/health/ready");
    assert_eq!(ready.status, 503, "{}", String::from_utf8_lossy(&ready.body));
    assert_eq!(ready.json()["cannot_serve"]["bad"]["kind"], "config_failed", "says why: {}", ready.json());
}

#[test]
fn an_invalid_model_toml_fails_at_config_and_its_fix_is_taken_up() {
    let repo = TestRepo::new();
    repo.add_model("good", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("good", 1, &mlp(1));
    let server = start(&repo, &[]);
    server.wait_settled("good", 1);
    let mut events = Events::open(&server);
    repo.add_model("bad", &typo_toml());
    repo.publish_mlp("bad", 1, &mlp(1));
    events.wait_for("\"stage\":\"config\"");
    let error = last_error(&server, "bad");
    assert_eq!(error["stage"], "config", "{error}");
    assert_eq!(error["kind"], "config_failed", "{error}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(!message.contains("fetch failed"), "{message}");
    assert!(message.contains("max_batch_sise") && message.contains("line"), "names the key and where: {message}");
    assert!(message.contains("next poll"), "says the fix will be taken up: {message}");
    let metrics = server.metrics();
    assert!(
        metrics.lines().any(|l| l.contains("model=\"bad\"") && l.contains("stage=\"config\"")),
        "the failure is counted at stage config:\n{metrics}"
    );

    // Fixing the file is noticed by the watcher: no operator's call.
    repo.add_model("bad", &mlp_toml(&mlp(1), "max_batch_size = 8"));
    server.wait_settled("bad", 1);
    let log = plain_log(&server);
    assert!(log.contains("next poll"), "the log says the fix will be taken up:\n{log}");
}

/// A server of `m` version 1 with its event stream open, and the model
/// file of a version 2 to copy into the repository.
fn serving_with_a_model_file_to_copy() -> (TestRepo, Server, Events, Vec<u8>) {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("m", 1, &mlp(1));
    let server = start(&repo, &[]);
    server.wait_settled("m", 1);
    let events = Events::open(&server);
    let scratch = TestRepo::new();
    let onnx = std::fs::read(scratch.publish_mlp("x", 2, &mlp(2)).join("model.onnx")).expect("the model file");
    (repo, server, events, onnx)
}

#[test]
fn a_version_without_its_manifest_is_reported_once_with_what_to_run() {
    // The files of version 2, copied in without a MANIFEST.
    let (repo, server, mut events, onnx) = serving_with_a_model_file_to_copy();
    let dir = repo.write_files("m", 2, &[("model.onnx", onnx.as_slice())]);
    backdate(&dir);
    let dir = dir.display().to_string();
    let hint = format!("baton package {dir}");
    eventually("the log to name the version without a MANIFEST", || plain_log(&server).contains(&hint).then_some(()));
    let status = server.status("m");
    let unpackaged = &status["unpackaged"];
    assert_eq!(unpackaged[0]["version"], 2, "{status}");
    assert!(unpackaged[0]["message"].as_str().is_some_and(|m| m.contains(&hint)), "{status}");
    events.wait_for("unpackaged");
    let seen = events.wait_for(&hint);
    assert_eq!(seen.matches("event: unpackaged").count(), 1, "one event: {seen}");

    // Polls go by (version 3 is published and taken up): still one line.
    repo.publish_mlp("m", 3, &mlp(3));
    server.wait_settled("m", 3);
    assert_eq!(plain_log(&server).matches(&hint).count(), 1, "logged once, not every poll");
    assert_eq!(events.wait_for("event: unpackaged").matches("event: unpackaged").count(), 1, "one event");

    // Loading it asks for `baton package`, with one stage prefix.
    let load = server.post_json("/v2/repository/models/m/load", &json!({ "parameters": { "version": 2 } }));
    assert_eq!(load.status, 422, "{}", String::from_utf8_lossy(&load.body));
    let message = load.error();
    assert!(message.contains(&hint), "{message}");
    assert_eq!(message.matches("verify failed").count(), 1, "{message}");

    // Packaged, it loads, and it is no longer reported.
    repo.seal("m", 2);
    let load = server.post_json("/v2/repository/models/m/load", &json!({ "parameters": { "version": 2 } }));
    assert_eq!(load.status, 200, "{}", String::from_utf8_lossy(&load.body));
    eventually("the version to leave the unpackaged list", || {
        server.status("m")["unpackaged"].as_array().is_none_or(Vec::is_empty).then_some(())
    });
}

/// Sets the modification time of the files in `dir`, then of `dir`, an
/// hour back: files copied in long ago, and left unpackaged.
fn backdate(dir: &std::path::Path) {
    let past = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let entries = std::fs::read_dir(dir).expect("listing the version directory");
    for path in entries.map(|e| e.expect("an entry").path()).chain([dir.to_path_buf()]) {
        std::fs::File::open(&path).and_then(|f| f.set_modified(past)).expect("backdating");
    }
}

#[test]
fn a_version_being_copied_in_then_packaged_is_not_reported() {
    // Files copied in, the MANIFEST not written yet, as `cp` then
    // `baton package` leave a version for a while.
    let (repo, server, mut events, onnx) = serving_with_a_model_file_to_copy();
    repo.write_files("m", 2, &[("model.onnx", onnx.as_slice())]);
    // Polls go by: each probe version served proves a scan that began
    // after the files were written.
    repo.add_model("probe", &mlp_toml(&mlp(1), "required = false"));
    for v in 1..=4 {
        repo.publish_mlp("probe", v, &mlp(v));
        server.wait_serving("probe", v);
    }
    assert_eq!(server.status("m")["unpackaged"], json!([]), "{}", server.status("m"));
    repo.seal("m", 2);
    server.wait_settled("m", 2);
    // An unpackaged event would come before the load's first event.
    let seen = events.wait_for("\"model\":\"m\",");
    assert!(!seen.contains("unpackaged"), "no event: {seen}");
    assert!(!plain_log(&server).contains("baton package"), "no warning:\n{}", plain_log(&server));
}

#[test]
fn wrong_names_list_the_right_ones() {
    let repo = TestRepo::new();
    for model in ["ranker", "scorer"] {
        repo.add_model(model, &mlp_toml(&mlp(1), ""));
        repo.publish_mlp(model, 1, &mlp(1));
    }
    let server = start(&repo, &[]);
    server.wait_settled("ranker", 1);
    server.wait_settled("scorer", 1);
    let input = vec![0.5f32; common::SIZES[0]];
    let body = json!({ "inputs": [{ "name": "features", "datatype": "FP32", "shape": [1, 8], "data": input }] });
    let answer = server.post_json("/v2/models/ranker/infer", &body);
    common::assert_error(&answer, 400, &["missing input 'input'", "features"], "a wrong input name");
    let answer = server.post_json("/v2/models/rankr/infer", &common::request(&input, 1));
    common::assert_error(&answer, 404, &["'rankr'", "ranker", "scorer"], "an unknown model");

    use baton_protocol::grpc::pb::model_infer_request::InferInputTensor;
    use baton_protocol::grpc::pb::{InferTensorContents, ModelInferRequest};
    use common::grpc::{assert_status, client, runtime, within};
    let request = |model: &str, name: &str| ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: name.into(),
            datatype: "FP32".into(),
            shape: vec![1, 8],
            contents: Some(InferTensorContents { fp32_contents: input.clone(), ..Default::default() }),
            ..Default::default()
        }],
        ..Default::default()
    };
    runtime().block_on(async {
        let mut c = client(&server).await;
        let result = within("renamed", c.model_infer(request("ranker", "features"))).await;
        assert_status(result, tonic::Code::InvalidArgument, &["missing input 'input'", "features"], "grpc input");
        let result = within("unknown", c.model_infer(request("rankr", "input"))).await;
        assert_status(result, tonic::Code::NotFound, &["'rankr'", "ranker", "scorer"], "grpc model");
    });
}

#[test]
fn a_refused_rollout_loads_nothing() {
    let repo = TestRepo::new();
    repo.add_model("ranker", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("ranker", 1, &mlp(1));
    repo.publish_mlp("ranker", 2, &mlp(2));
    repo.add_model("other", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("other", 1, &mlp(1));
    let server = start(&repo, &[]);
    server.wait_settled("ranker", 2);
    server.wait_settled("other", 1);
    let mut events = Events::open(&server);
    for body in [json!({ "version": 2 }), json!({})] {
        let answer = server.post_json("/baton/v1/models/ranker/rollout", &body);
        common::assert_error(&answer, 400, &["nothing to roll out"], "a rollout of the stable version");
    }
    // A load of another model, after both refusals: its events come after
    // any the refusals made.
    let load = server.post_json("/baton/v1/models/other/load", &json!({ "version": 1 }));
    assert_eq!(load.status, 200, "{}", String::from_utf8_lossy(&load.body));
    let seen = events.wait_for("\"model\":\"other\"");
    let before_marker = &seen[..seen.find("\"model\":\"other\"").unwrap_or(seen.len())];
    // A refusal shows as FAILED, then READY again; nothing LOADING.
    let loading = before_marker.lines().filter(|l| l.contains("\"model\":\"ranker\"") && l.contains("LOADING"));
    assert_eq!(loading.count(), 0, "the refused rollouts loaded something:\n{before_marker}");
    assert_eq!(server.status("ranker")["serving"], 2);
}

#[test]
fn logs_to_a_file_are_plain_with_fields_as_people_write_them() {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("m", 1, &mlp(1));
    let server = start(&repo, &[]);
    server.wait_settled("m", 1);
    let log = eventually("the load's last line", || {
        let log = server.log();
        log.contains("Model operation finished.").then_some(log)
    });
    assert!(!log.contains('\u{1b}'), "no terminal colours in a file:\n{log}");
    assert!(!log.contains("Some("), "fields in Display form:\n{log}");
    let line = log.lines().find(|l| l.contains("Model operation finished.")).expect("the line");
    assert!(line.contains("version=1"), "{line}");
    let total = line.split("total_ms=").nth(1).and_then(|t| t.split_whitespace().next()).expect("total_ms");
    let decimals = total.split('.').nth(1).map_or(0, str::len);
    assert!(decimals <= 2 && total.parse::<f64>().is_ok(), "total_ms={total} in {line}");
}

#[test]
fn logs_can_be_json_lines() {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("m", 1, &mlp(1));
    let server = start(&repo, &["--log-format", "json"]);
    server.wait_settled("m", 1);
    let log = eventually("the load's last line", || {
        let log = server.log();
        log.contains("Model operation finished.").then_some(log)
    });
    let lines: Vec<Value> =
        log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))).collect();
    let finished = lines.iter().find(|l| l["fields"]["message"] == "Model operation finished.").expect("the line");
    assert_eq!(finished["fields"]["version"], 1, "{finished}");
    assert_eq!(finished["fields"]["model"], "m", "{finished}");
    assert!(finished["level"].is_string() && finished["timestamp"].is_string(), "{finished}");
}

/// The version an answer names in its header, and in its body.
fn answered(server: &baton_testkit::server::Server, model: &str, key: &str) -> (String, String) {
    let input = vec![0.25f32; common::SIZES[0]];
    let body = serde_json::to_vec(&common::request(&input, 1)).expect("JSON");
    let answer = server.post_raw(
        &format!("/v2/models/{model}/infer"),
        &body,
        &[("content-type", "application/json"), ("baton-sticky-key", key)],
    );
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    let header = answer.header("baton-model-version").unwrap_or_else(|| panic!("no version header")).to_owned();
    let body = answer.json()["model_version"].as_str().unwrap_or_default().to_owned();
    (header, body)
}

#[test]
fn answers_name_the_version_that_answered_in_a_header() {
    let policy = "[rollout]\ninterval_ms = 600000\nsteps = [50, 100]";
    let repo = TestRepo::new();
    for model in ["canary", "shadow"] {
        repo.add_model(model, &mlp_toml(&mlp(1), policy));
        repo.publish_mlp(model, 1, &mlp(1));
    }
    let server = start(&repo, &[]);
    server.wait_settled("canary", 1);
    server.wait_settled("shadow", 1);
    assert_eq!(answered(&server, "canary", "k"), ("1".to_owned(), "1".to_owned()));

    repo.publish_mlp("canary", 2, &mlp(2));
    repo.publish_mlp("shadow", 2, &mlp(2));
    server.wait_settled("canary", 2);
    server.wait_settled("shadow", 2);
    // Back to 1, then roll 2 out: a canary at half, a shadow.
    for model in ["canary", "shadow"] {
        let back = server.post_json(&format!("/baton/v1/models/{model}/rollback"), &json!({}));
        assert_eq!(back.status, 200, "{}", String::from_utf8_lossy(&back.body));
    }
    let canary = server.post_json("/baton/v1/models/canary/rollout", &json!({ "version": 2 }));
    assert_eq!(canary.status, 200, "{}", String::from_utf8_lossy(&canary.body));
    let shadow = server.post_json("/baton/v1/models/shadow/rollout", &json!({ "version": 2, "mode": "shadow" }));
    assert_eq!(shadow.status, 200, "{}", String::from_utf8_lossy(&shadow.body));

    let mut seen = std::collections::BTreeSet::new();
    for key in 0..64 {
        let (header, body) = answered(&server, "canary", &format!("key-{key}"));
        assert_eq!(header, body, "the header names the version of this very answer");
        seen.insert(header);
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["1", "2"], "both sides of the canary answered");
    for key in 0..8 {
        assert_eq!(answered(&server, "shadow", &format!("key-{key}")), ("1".to_owned(), "1".to_owned()));
    }

    // gRPC: the same in the response metadata.
    use baton_protocol::grpc::pb::model_infer_request::InferInputTensor;
    use baton_protocol::grpc::pb::{InferTensorContents, ModelInferRequest};
    let request = |model: &str| ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![1, 8],
            contents: Some(InferTensorContents { fp32_contents: vec![0.25; 8], ..Default::default() }),
            ..Default::default()
        }],
        ..Default::default()
    };
    common::grpc::runtime().block_on(async {
        let mut c = common::grpc::client(&server).await;
        for model in ["canary", "shadow"] {
            let answer = common::grpc::within("infer", c.model_infer(request(model))).await.expect("an answer");
            let header = answer.metadata().get("baton-model-version").and_then(|v| v.to_str().ok()).map(str::to_owned);
            assert_eq!(header.as_deref(), Some(answer.get_ref().model_version.as_str()), "{model}");
        }
    });
}
