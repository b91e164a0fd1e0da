//! Rollouts, black box. A rollout the repository watcher starts is written
//! to the state file, and a restarted server takes it up where it was
//! rather than swapping to the candidate. Sticky keys keep a client on one
//! side of a rollout, whether sent as a header or as a request parameter,
//! over HTTP and gRPC alike, with NVIDIA's tritonclient.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Server, eventually, metric};
use common::{assert_close, mlp, output_f32, repo_with, request, start, version_of};
use serde_json::Value;

/// A rollout policy whose windows are so long that the controller never
/// decides while a test runs: the rollout stays at the step it is at.
fn rollout_policy(steps: &str) -> String {
    format!("[rollout]\nauto = true\nsteps = {steps}\ninterval_ms = 600000")
}

fn state_path(repo: &TestRepo) -> PathBuf {
    repo.root().join(".baton-state.json")
}

fn state_file(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// Publishes `candidate` and waits until the watcher has started a rollout
/// of it beside `stable` (rather than swapping to it); returns the status.
fn publish_and_wait_for_rollout(server: &Server, repo: &TestRepo, stable: u64, candidate: u64) -> Value {
    repo.publish_mlp("m", candidate, &mlp(candidate));
    eventually(&format!("a running rollout of version {candidate}"), || {
        let status = server.status("m");
        let rollout = &status["rollout"];
        (rollout["phase"] == "running" && rollout["candidate"] == candidate).then_some(status)
    });
    let status = server.status("m");
    assert_eq!(status["serving"], stable, "the stable version keeps serving: {status}");
    assert_eq!(status["rollout"]["stable"], stable, "{status}");
    status
}

/// The role a version answers in while `stable` is the stable one.
fn role_of(version: u64, stable: u64) -> &'static str {
    if version == stable { "stable" } else { "candidate" }
}

#[test]
fn a_restart_mid_rollout_takes_it_up_where_it_was() {
    let repo = repo_with("m", &[1], &rollout_policy("[10, 50, 100]"));
    let mut server = start(&repo, &[]);
    server.wait_settled("m", 1);
    publish_and_wait_for_rollout(&server, &repo, 1, 2);
    let recorded = eventually("the state file to record the rollout", || {
        let state = state_file(&state_path(&repo))?;
        (state["models"]["m"]["kind"] == "rollout").then_some(state)
    });
    let decision = &recorded["models"]["m"];
    assert_eq!(decision["version"], 1, "the stable version is recorded: {recorded}");
    assert_eq!(decision["rollout"]["candidate"], 2, "{recorded}");
    assert_eq!(decision["rollout"]["step"], 0, "{recorded}");
    assert!(server.terminate().success(), "baton did not stop cleanly");

    let server = start(&repo, &[]);
    server.wait_ready();
    let status = eventually("the recorded rollout to be taken up", || {
        let status = server.status("m");
        (status["rollout"]["phase"] == "running").then_some(status)
    });
    assert_eq!(status["serving"], 1, "version 2 must not serve all traffic: {status}");
    let rollout = &status["rollout"];
    assert_eq!(
        (&rollout["stable"], &rollout["candidate"], &rollout["step"]),
        (&1.into(), &2.into(), &0.into()),
        "{status}"
    );
    assert_eq!(rollout["weight_percent"], 10.0, "{status}");
    assert_eq!(status["decision"]["kind"], "rollout", "{status}");

    // Requests that name no version are answered by either side, and say
    // which in the header and the response parameters.
    let input: Vec<f32> = (0..8).map(|i| i as f32 / 8.0).collect();
    for _ in 0..40 {
        let answer = server.post_json("/v2/models/m/infer", &request(&input, 1));
        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
        let body = answer.json();
        let version = version_of(&body);
        assert!(version == 1 || version == 2, "{body}");
        let role = role_of(version, 1);
        assert_eq!(answer.header("baton-role"), Some(role), "version {version} answered: {body}");
        assert_eq!(body["parameters"]["baton_role"], role, "{body}");
        assert_close(&output_f32(&body, "output"), &mlp(version).forward(&input, 1), "the answer");
    }
    // The rollout's gauges, and the one that mutes alerts while it runs.
    let text = String::from_utf8_lossy(&server.get("/metrics").body).into_owned();
    for (series, value) in [
        ("baton_rollout_weight{model=\"m\",mode=\"canary\"}", 0.1),
        ("baton_rollout_step{model=\"m\"}", 0.0),
        ("baton_rollout_paused{model=\"m\"}", 0.0),
        ("baton_model_operation_in_progress{model=\"m\"}", 1.0),
        ("baton_rollout_last_decision{model=\"m\",decision=\"started\"}", 1.0),
    ] {
        assert_eq!(metric(&text, series), Some(value), "{series} in:\n{text}");
    }
    common::assert_no_panic(&server);
}

/// What one way of sending a sticky key saw: key -> [(version, role)].
type Seen = BTreeMap<String, Vec<(u64, String)>>;

fn parse_seen(ways: &Value, way: &str) -> Seen {
    let keys = ways[way].as_object().unwrap_or_else(|| panic!("no {way} in {ways}"));
    keys.iter()
        .map(|(key, answers)| {
            let answers = answers.as_array().expect("a list of answers");
            let answers = answers
                .iter()
                .map(|a| {
                    let version = a[0].as_str().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{way}: {a}"));
                    let role = a[1].as_str().unwrap_or_else(|| panic!("{way}: no baton_role in {a}")).to_owned();
                    (version, role)
                })
                .collect();
            (key.clone(), answers)
        })
        .collect()
}

#[test]
fn sticky_keys_keep_a_client_on_one_side_over_http_and_grpc() {
    const KEYS: usize = 20;
    const REPEATS: usize = 5;
    let repo = repo_with("m", &[1], &rollout_policy("[50, 100]"));
    let server = start(&repo, &[]);
    server.wait_settled("m", 1);
    let status = publish_and_wait_for_rollout(&server, &repo, 1, 2);
    assert_eq!(status["rollout"]["weight_percent"], 50.0, "{status}");

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/sticky.py");
    let output = Command::new(common::client_python())
        .arg(&script)
        .args([server.base().trim_start_matches("http://"), server.grpc_address(), "m"])
        .args([KEYS.to_string(), REPEATS.to_string()])
        .output()
        .expect("running the tritonclient script");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the tritonclient script failed:\n{stderr}\n{}", server.log());
    let ways: Value = serde_json::from_slice(&output.stdout).expect("the script prints JSON");

    let mut sides: Option<BTreeMap<String, (u64, String)>> = None;
    for way in ["http_header", "http_parameter", "grpc_header", "grpc_parameter"] {
        let seen = parse_seen(&ways, way);
        assert_eq!(seen.len(), KEYS, "{way}: {ways}");
        let mut side_of = BTreeMap::new();
        for (key, answers) in &seen {
            assert_eq!(answers.len(), REPEATS, "{way} {key}");
            let first = answers[0].clone();
            assert!(answers.iter().all(|a| *a == first), "{way}: key {key} was answered by both sides: {answers:?}");
            assert_eq!(first.1, role_of(first.0, 1), "{way}: key {key}: version {} in the wrong role", first.0);
            side_of.insert(key.clone(), first);
        }
        let roles: std::collections::BTreeSet<_> = side_of.values().map(|(_, role)| role.as_str()).collect();
        assert_eq!(roles.len(), 2, "{way}: across {KEYS} keys at 50 % both sides should answer: {side_of:?}");
        match &sides {
            None => sides = Some(side_of),
            Some(before) => assert_eq!(&side_of, before, "{way} put keys on other sides than over HTTP headers"),
        }
    }
    assert_eq!(server.status("m")["rollout"]["phase"], "running", "the rollout did not move during the test");
    common::assert_no_panic(&server);
}

#[test]
fn a_candidate_the_guards_roll_back_stays_out_after_a_restart() {
    // Windows of 300 ms with 20 samples a side, drift guarded: version 2
    // (other weights) fails its first judged window.
    let policy = "[rollout]\nauto = true\nsteps = [50, 100]\ninterval_ms = 300\n\
                  [rollout.guards]\nmin_samples = 20\nmax_rel_l2 = 0.05";
    let repo = repo_with("m", &[1], policy);
    let mut server = start(&repo, &[]);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    eventually("a rollout of version 2", || (server.status("m")["rollout"]["candidate"] == 2).then_some(()));
    let input = baton_testkit::onnx::sample_input(common::SIZES[0], 1, 7);
    let mut failed = 0;
    let status = eventually("the guards to roll version 2 back", || {
        for _ in 0..20 {
            if server.post_json("/v2/models/m/infer", &request(&input, 1)).status != 200 {
                failed += 1;
            }
        }
        let status = server.status("m");
        (status["rollout"]["phase"] == "rolled_back").then_some(status)
    });
    assert_eq!(failed, 0, "requests failed while the candidate was rolled back");
    let last = status["rollout"]["decisions"].as_array().and_then(|d| d.last()).cloned().unwrap_or_default();
    assert_eq!(last["action"], "rolled_back", "{status}");
    let checks = last["verdict"]["checks"].as_array().cloned().unwrap_or_default();
    let drift = checks.iter().find(|c| c["guard"].as_str().is_some_and(|g| g.starts_with("rel_l2"))).cloned();
    let drift = drift.unwrap_or_else(|| panic!("the decision carries the drift it was made on: {last}"));
    assert!(drift["value"].as_f64().unwrap_or(0.0) > 0.05 && drift["samples"].as_u64().unwrap_or(0) >= 20, "{drift}");
    let held = eventually("the state file to hold version 1", || {
        let state = state_file(&state_path(&repo))?;
        (state["models"]["m"]["kind"] == "load").then_some(state)
    });
    assert_eq!((&held["models"]["m"]["version"], &held["models"]["m"]["yields_to"]), (&1.into(), &2.into()), "{held}");
    assert!(server.terminate().success(), "baton did not stop cleanly");

    let server = start(&repo, &[]);
    server.wait_settled("m", 1);
    let status = server.status("m");
    assert_eq!(status["serving"], 1, "the rolled-back candidate must not come back: {status}");
    assert!(status["rollout"].is_null(), "no rollout after the restart: {status}");
}
