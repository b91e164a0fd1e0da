//! The rollout operations on every management interface, black box. Over
//! REST a start puts the candidate beside the stable version and status
//! shows it running; pause and resume change the phase; abort leaves the
//! stable version serving alone; promote makes the candidate stable. gRPC
//! starts, shows and aborts the same way; the CLI starts, shows (once, and
//! following until the rollout ends) and promotes, and refuses a flag an
//! action does not take. With an admin token the
//! operations need it while status stays open; with an admin listener they
//! move there while status is served on both; malformed start bodies are
//! refused with 400 and a kind that says what is wrong.
//!
//! Windows last ten minutes here, so the controller never decides during a
//! test: every change of phase is an operator's.

mod common;

use std::io::Read;
use std::process::{Command, Output, Stdio};

use baton_core::rollout::assign::{bucket, salt};
use baton_protocol::grpc::pb_baton;
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Answer, Client, PATIENCE, Server, eventually};
use common::grpc::{assert_status, clients_at, runtime, with_token, within};
use common::{Reaper, bin, mlp, post_with, repo_with, start, text, token_file};
use serde_json::{Value, json};
use tonic::Code;

/// A rollout section whose windows outlast every test.
const SLOW: &str = "[policy]\nkeep_previous = 1\n[rollout]\ninterval_ms = 600000\nsteps = [10, 50, 100]";
const TOKEN: &str = "roll-Token_9";

/// A server of model `m` serving version 1 and not watching the
/// repository, with version 2 published beside it, ready to roll out.
fn two_versions(args: &[&str]) -> (TestRepo, Server) {
    let repo = repo_with("m", &[1], SLOW);
    let mut all = vec!["--no-watch"];
    all.extend_from_slice(args);
    let server = start(&repo, &all);
    server.wait_settled("m", 1);
    if !args.contains(&"--admin-http") {
        wait_free(server.base());
    }
    repo.publish_mlp("m", 2, &mlp(2));
    (repo, server)
}

/// Waits until an operation on `m` at `url` is no longer refused because
/// the start's load still holds the model: its claim is let go just after
/// the model settles. An abort with no rollout changes nothing, and says
/// `no_rollout` once it gets past the claim.
fn wait_free(url: &str) {
    let auth = format!("Bearer {TOKEN}");
    eventually("m to take operations", || {
        let answer = post_with(url, &rollout_path("abort"), &json!({}), &[("authorization", &auth)]);
        (answer.json()["kind"] == "no_rollout").then_some(())
    });
}

fn ok(answer: Answer, what: &str) -> Value {
    assert_eq!(answer.status, 200, "{what}: {}", String::from_utf8_lossy(&answer.body));
    answer.json()
}

fn rollout_path(action: &str) -> String {
    match action {
        "" => "/baton/v1/models/m/rollout".to_owned(),
        action => format!("/baton/v1/models/m/rollout/{action}"),
    }
}

/// Asserts an answer's `serving`, and the rollout's phase and candidate.
fn assert_rollout(answer: &Value, serving: u64, phase: &str) {
    assert_eq!(answer["model"], "m", "{answer}");
    assert_eq!(answer["serving"], serving, "{answer}");
    assert_eq!(answer["rollout"]["phase"], phase, "{answer}");
    assert_eq!(answer["rollout"]["candidate"], 2, "{answer}");
    assert_eq!(answer["rollout"]["stable"], 1, "{answer}");
}

/// A sticky key on the candidate's side (version 2 of `m`) at `weight`
/// basis points, or on the stable side.
fn key(candidate: bool, weight: u32) -> String {
    (0..)
        .map(|i| format!("user-{i}"))
        .find(|k| (bucket(salt("m", 2), k.as_bytes()) < weight) == candidate)
        .expect("a key on each side")
}

/// Infers with `key` as the `baton-sticky-key` header, or as the
/// `baton_sticky_key` parameter; returns the version that answered and the
/// role the answer names (the `baton-role` header and the `baton_role`
/// parameter, which must agree).
fn infer_keyed(server: &Server, key: &str, as_parameter: bool) -> (u64, String) {
    let input = baton_testkit::onnx::sample_input(common::SIZES[0], 1, 7);
    let mut request = common::request(&input, 1);
    let mut headers = vec![("content-type", "application/json")];
    if as_parameter {
        request["parameters"] = json!({ "baton_sticky_key": key });
    } else {
        headers.push(("baton-sticky-key", key));
    }
    let answer = server.post_raw("/v2/models/m/infer", request.to_string().as_bytes(), &headers);
    let header = answer.header("baton-role").map(str::to_owned);
    let body = ok(answer, "infer");
    let role = body["parameters"]["baton_role"].as_str().unwrap_or("?").to_owned();
    assert_eq!(header.as_deref(), Some(role.as_str()), "the role header and parameter agree: {body}");
    (common::version_of(&body), role)
}

/// Asserts requests keyed to each side of a rollout at `weight` basis
/// points are answered by `sides` (stable side, candidate side), in the
/// roles given.
fn assert_sides(server: &Server, weight: u32, sides: [(u64, &str); 2]) {
    for (candidate, (version, role)) in [false, true].into_iter().zip(sides) {
        let key = key(candidate, weight);
        for as_parameter in [false, true] {
            let got = infer_keyed(server, &key, as_parameter);
            assert_eq!(got, (version, role.to_owned()), "key {key} (as a parameter: {as_parameter})");
        }
    }
}

#[test]
fn rest_start_status_pause_resume_and_abort() {
    let (_repo, server) = two_versions(&[]);
    let none = server.get(&rollout_path(""));
    assert_eq!((none.status, none.json()["kind"].clone()), (404, json!("no_rollout")), "{}", none.error());

    let started = ok(server.post_json(&rollout_path(""), &json!({ "version": 2 })), "start");
    assert_rollout(&started, 1, "running");
    assert_eq!(started["rollout"]["mode"], "canary", "{started}");
    assert_eq!(started["rollout"]["weight_percent"], 10.0, "{started}");
    // In percent, as `[rollout] steps` and the start request give them,
    // and as `weight_percent` says the share; also in the decision kept.
    assert_eq!(started["rollout"]["plan"]["steps"], json!([10.0, 50.0, 100.0]), "{started}");
    let kept = server.status("m");
    assert_eq!(kept["decision"]["rollout"]["plan"]["steps"], json!([10.0, 50.0, 100.0]), "{kept}");
    let status = ok(server.get(&rollout_path("")), "status");
    assert_rollout(&status, 1, "running");
    assert!(status["rollout"]["next_window_ms"].as_u64().is_some_and(|ms| ms > 0), "{status}");

    // Another start while one runs is refused.
    let again = server.post_json(&rollout_path(""), &json!({}));
    assert_eq!((again.status, again.json()["kind"].clone()), (409, json!("rollout_in_progress")));

    let paused = ok(server.post_json(&rollout_path("pause"), &json!({ "reason": "checking dashboards" })), "pause");
    assert_rollout(&paused, 1, "paused");
    assert_eq!(paused["rollout"]["paused"], "checking dashboards", "{paused}");
    assert!(paused["rollout"]["next_window_ms"].is_null(), "a paused rollout judges no window: {paused}");
    let resumed = ok(server.post_json(&rollout_path("resume"), &json!({})), "resume");
    assert_rollout(&resumed, 1, "running");

    // Both versions answer while it runs, each for the keys on its side.
    assert_sides(&server, 1000, [(1, "stable"), (2, "candidate")]);

    let aborted = ok(server.post_json(&rollout_path("abort"), &json!({})), "abort");
    assert_rollout(&aborted, 1, "aborted");
    assert_eq!(aborted["rollout"]["weight_percent"], 0.0, "{aborted}");
    let actions: Vec<&str> =
        aborted["rollout"]["decisions"].as_array().unwrap().iter().map(|d| d["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["started", "paused", "resumed", "aborted"], "{aborted}");
    // Only the stable version answers after an abort, whatever the key.
    assert_sides(&server, 1000, [(1, "stable"), (1, "stable")]);
    // The ended rollout stays visible; operating on it is refused.
    assert_rollout(&ok(server.get(&rollout_path("")), "status after abort"), 1, "aborted");
    let late = server.post_json(&rollout_path("pause"), &json!({}));
    assert_eq!((late.status, late.json()["kind"].clone()), (409, json!("no_rollout")));
    common::assert_no_panic(&server);
}

#[test]
fn rest_promote_makes_the_candidate_stable() {
    let (_repo, server) = two_versions(&[]);
    let started = ok(server.post_json(&rollout_path(""), &json!({ "mode": "ab", "steps": [50] })), "start");
    assert_rollout(&started, 1, "running");
    assert_eq!(
        (started["rollout"]["mode"].clone(), started["rollout"]["weight_percent"].clone()),
        (json!("ab"), json!(50.0))
    );
    assert_sides(&server, 5000, [(1, "stable"), (2, "candidate")]);

    // Promoted, and watched against version 1 (five minutes by default).
    let promoted = ok(server.post_json(&rollout_path("promote"), &json!({})), "promote");
    assert_rollout(&promoted, 2, "watching");
    assert_eq!(promoted["rollout"]["weight_percent"], 100.0, "{promoted}");
    assert_eq!(promoted["rollout"]["watch"]["against"], 1, "{promoted}");
    // The candidate, now stable, answers every key.
    assert_sides(&server, 5000, [(2, "stable"), (2, "stable")]);
    assert_eq!(server.status("m")["serving"], 2);
    // A second promote ends the watch.
    let confirmed = ok(server.post_json(&rollout_path("promote"), &json!({})), "promote again");
    assert_rollout(&confirmed, 2, "promoted");
    common::assert_no_panic(&server);
}

#[test]
fn malformed_start_bodies_are_refused_with_what_is_wrong() {
    let (_repo, server) = two_versions(&[]);
    let cases: [(&[u8], &str, &str); 7] = [
        (b"{", "invalid_json", "rollout request body"),
        (br#"{"versoin": 2}"#, "invalid_rollout", "versoin"),
        (br#"{"mode": "blue"}"#, "invalid_rollout", "blue"),
        (br#"{"steps": "1,5"}"#, "invalid_rollout", "steps"),
        (br#"{"steps": [50, 10]}"#, "invalid_rollout", "steps must rise"),
        (br#"{"interval_ms": 1}"#, "invalid_rollout", "interval_ms"),
        (br#"{"guards": {"max_rel": 0.1}}"#, "invalid_rollout", "max_rel"),
    ];
    for (body, kind, needle) in cases {
        let answer = server.post_raw(&rollout_path(""), body, &[("content-type", "application/json")]);
        let what = String::from_utf8_lossy(body);
        assert_eq!(answer.status, 400, "{what}: {}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.json()["kind"], kind, "{what}");
        assert!(answer.error().contains(needle), "{what}: the error should mention {needle:?}: {}", answer.error());
    }
    let pause = server.post_json(&rollout_path("pause"), &json!({ "why": "x" }));
    assert_eq!(pause.status, 400, "an unknown pause field: {}", String::from_utf8_lossy(&pause.body));
    // Nothing started: the refusals came before any load.
    assert_eq!(server.get(&rollout_path("")).status, 404);
    assert_eq!(server.status("m")["serving"], 1);
    common::assert_no_panic(&server);
}

#[test]
fn grpc_start_status_and_abort() {
    let (_repo, server) = two_versions(&[]);
    let rt = runtime();
    rt.block_on(async {
        let (_, mut manage) = clients_at(server.grpc_address()).await;
        let model = || pb_baton::RolloutRequest { model: "m".into() };
        let none = within("status", manage.rollout_status(model())).await;
        assert_eq!(assert_status(none, Code::NotFound, &["no rollout"], "status before"), "no_rollout");

        let bad = pb_baton::RolloutStartRequest { model: "m".into(), mode: Some("blue".into()), ..Default::default() };
        let refused = within("bad start", manage.rollout_start(bad)).await;
        assert_eq!(assert_status(refused, Code::InvalidArgument, &["blue"], "bad mode"), "invalid_rollout");
        let bad =
            pb_baton::RolloutStartRequest { model: "m".into(), guards_json: Some("{".into()), ..Default::default() };
        let refused = within("bad guards", manage.rollout_start(bad)).await;
        assert_eq!(assert_status(refused, Code::InvalidArgument, &["guards"], "bad guards"), "invalid_rollout");

        let start = pb_baton::RolloutStartRequest {
            model: "m".into(),
            version: Some(2),
            steps: vec![5.0, 100.0],
            guards_json: Some(r#"{"min_samples": 7}"#.into()),
            ..Default::default()
        };
        let started = within("start", manage.rollout_start(start)).await.expect("start").into_inner();
        assert_eq!((started.serving, started.candidate), (Some(1), Some(2)), "{started:?}");
        assert_eq!((started.phase.as_str(), started.mode.as_str()), ("running", "canary"), "{started:?}");
        assert_eq!((started.weight_percent, started.step), (5.0, 0), "{started:?}");
        let json: Value = serde_json::from_str(&started.status_json).expect("status_json is JSON");
        assert_eq!(json["rollout"]["plan"]["guards"]["min_samples"], 7, "{json}");

        let status = within("status", manage.rollout_status(model())).await.expect("status").into_inner();
        assert_eq!((status.phase.as_str(), status.candidate), ("running", Some(2)), "{status:?}");

        let aborted = within("abort", manage.rollout_abort(model())).await.expect("abort").into_inner();
        assert_eq!((aborted.phase.as_str(), aborted.serving, aborted.weight_percent), ("aborted", Some(1), 0.0));
        let again = within("abort again", manage.rollout_abort(model())).await;
        assert_eq!(assert_status(again, Code::Aborted, &["no rollout"], "abort again"), "no_rollout");
    });
    common::assert_no_panic(&server);
}

#[test]
fn grpc_pause_resume_and_promote() {
    let (_repo, server) = two_versions(&[]);
    let rt = runtime();
    rt.block_on(async {
        let (_, mut manage) = clients_at(server.grpc_address()).await;
        let model = || pb_baton::RolloutRequest { model: "m".into() };
        // No watch after promotion: promote ends it.
        let start = pb_baton::RolloutStartRequest { model: "m".into(), watch_ms: Some(0), ..Default::default() };
        let started = within("start", manage.rollout_start(start)).await.expect("start").into_inner();
        assert_eq!((started.candidate, started.weight_percent), (Some(2), 10.0), "the newest, at the first step");
        let pause = pb_baton::RolloutPauseRequest { model: "m".into(), reason: Some("lunch".into()) };
        let paused = within("pause", manage.rollout_pause(pause)).await.expect("pause").into_inner();
        assert_eq!(paused.phase, "paused");
        assert!(paused.status_json.contains("lunch"), "{}", paused.status_json);
        let resumed = within("resume", manage.rollout_resume(model())).await.expect("resume").into_inner();
        assert_eq!(resumed.phase, "running");
        let promoted = within("promote", manage.rollout_promote(model())).await.expect("promote").into_inner();
        assert_eq!((promoted.phase.as_str(), promoted.serving), ("promoted", Some(2)));
    });
    common::assert_no_panic(&server);
}

#[test]
fn the_operations_need_the_token_and_status_does_not() {
    let (_dir, file) = token_file(TOKEN);
    let (_repo, server) = two_versions(&["--admin-token-file", &file]);
    let url = server.base().to_owned();
    let auth = format!("Bearer {TOKEN}");
    for action in ["", "pause", "resume", "promote", "abort"] {
        let refused = post_with(&url, &rollout_path(action), &json!({}), &[]);
        assert_eq!(refused.status, 401, "POST {} without the token", rollout_path(action));
        assert_eq!(refused.json()["kind"], "unauthorized");
        let wrong = post_with(&url, &rollout_path(action), &json!({}), &[("authorization", "Bearer nope")]);
        assert_eq!(wrong.status, 401, "POST {} with another token", rollout_path(action));
    }
    let started =
        ok(post_with(&url, &rollout_path(""), &json!({ "version": 2 }), &[("authorization", &auth)]), "start");
    assert_rollout(&started, 1, "running");
    // Status is a read: open, like the other status endpoints.
    assert_rollout(&ok(Client::new(&url).get(&rollout_path("")), "status without a token"), 1, "running");

    let rt = runtime();
    rt.block_on(async {
        let (_, mut manage) = clients_at(server.grpc_address()).await;
        let model = || pb_baton::RolloutRequest { model: "m".into() };
        let status = within("status", manage.rollout_status(model())).await.expect("status is open");
        assert_eq!(status.into_inner().phase, "running");
        let pause = || pb_baton::RolloutPauseRequest { model: "m".into(), reason: None };
        let refused = within("pause", manage.rollout_pause(pause())).await;
        assert_eq!(assert_status(refused, Code::Unauthenticated, &["token"], "pause without a token"), "unauthorized");
        let refused = within("abort", manage.rollout_abort(model())).await;
        assert_eq!(assert_status(refused, Code::Unauthenticated, &["token"], "abort"), "unauthorized");
        let start = pb_baton::RolloutStartRequest { model: "m".into(), ..Default::default() };
        let refused = within("start", manage.rollout_start(start)).await;
        assert_eq!(assert_status(refused, Code::Unauthenticated, &["token"], "start"), "unauthorized");
        let paused = within("pause", manage.rollout_pause(with_token(pause(), TOKEN))).await.expect("pause");
        assert_eq!(paused.into_inner().phase, "paused");
        let aborted = within("abort", manage.rollout_abort(with_token(model(), TOKEN))).await.expect("abort");
        assert_eq!(aborted.into_inner().phase, "aborted");
    });
    common::assert_no_panic(&server);
}

#[test]
fn an_admin_listener_takes_the_operations_and_status_stays_on_both() {
    let (_repo, mut server) = two_versions(&["--admin-http", "127.0.0.1:0", "--admin-grpc", "127.0.0.1:0"]);
    let admin = format!("http://{}", common::listening_address(&server.next_line()));
    let admin_grpc = common::listening_address(&server.next_line());
    wait_free(&admin);
    let refused = post_with(server.base(), &rollout_path(""), &json!({}), &[]);
    assert_eq!((refused.status, refused.json()["kind"].clone()), (403, json!("wrong_listener")));
    assert_rollout(&ok(post_with(&admin, &rollout_path(""), &json!({}), &[]), "start on the admin port"), 1, "running");
    for url in [server.base(), admin.as_str()] {
        assert_rollout(&ok(Client::new(url).get(&rollout_path("")), "status"), 1, "running");
    }
    let rt = runtime();
    rt.block_on(async {
        let model = || pb_baton::RolloutRequest { model: "m".into() };
        let (_, mut inference_port) = clients_at(server.grpc_address()).await;
        let refused = within("abort", inference_port.rollout_abort(model())).await;
        assert_eq!(assert_status(refused, Code::PermissionDenied, &["admin"], "abort"), "wrong_listener");
        let status = within("status", inference_port.rollout_status(model())).await.expect("status");
        assert_eq!(status.into_inner().phase, "running");
        let (_, mut admin_port) = clients_at(&admin_grpc).await;
        let aborted = within("abort", admin_port.rollout_abort(model())).await.expect("abort on the admin port");
        assert_eq!(aborted.into_inner().phase, "aborted");
    });
    common::assert_no_panic(&server);
}

/// Runs `baton args...` to completion, without the environment's settings.
fn baton(args: &[&str], env: &[(&str, &str)]) -> Output {
    command(args, env).output().expect("running baton")
}

fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(bin());
    command.args(args).env_remove("BATON_URL").env_remove("BATON_TOKEN_FILE").env_remove("BATON_TOKEN");
    command.env_remove("BATON_ADMIN_URL").env_remove("BATON_LOG").envs(env.iter().copied());
    command
}

#[test]
fn the_cli_starts_watches_and_promotes_with_the_token() {
    let (_dir, file) = token_file(TOKEN);
    let (_repo, server) = two_versions(&["--admin-token-file", &file]);
    let url = server.base().to_owned();
    let with_token = [("BATON_TOKEN_FILE", file.as_str())];

    let out = baton(&["rollout", "m", "--version", "2", "--url", &url], &[]);
    assert!(!out.status.success(), "a start without the token must fail");
    assert!(text(&out.stderr).contains("--token-file"), "{}", text(&out.stderr));
    let out = baton(&["rollout", "status", "m", "--version", "2", "--url", &url], &[]);
    assert!(text(&out.stderr).contains("unexpected argument '--version'"), "{}", text(&out.stderr));
    // Each action takes only its own flags: following is for a start or a status.
    for flag in ["--follow", "--watch"] {
        let out = baton(&["rollout", "abort", "m", flag, "--url", &url], &with_token);
        assert!(
            !out.status.success() && text(&out.stderr).contains(&format!("unexpected argument '{flag}'")),
            "{out:?}"
        );
    }
    let out = baton(&["rollout", "promote", "m", "--reason", "x", "--url", &url], &with_token);
    assert!(text(&out.stderr).contains("unexpected argument '--reason'"), "{}", text(&out.stderr));
    // The older form starts one too; the subcommand form is `rollout start`.

    let start = [
        "rollout",
        "start",
        "m",
        "--version",
        "2",
        "--steps",
        "1,5,25",
        "--interval",
        "10m",
        "--max-rel-l2",
        "0.05",
        "--watch-for",
        "0s",
    ];
    let out = baton(&[&start[..], &["--url", &url]].concat(), &with_token);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "baton rollout failed: {}\n{stdout}", text(&out.stderr));
    for needle in ["m: canary rollout of version 2 beside version 1: running", "step 1/3: [1%] → 5% → 25%", "started"]
    {
        assert!(stdout.contains(needle), "{needle:?} missing from:\n{stdout}");
    }
    let status = ok(server.get(&rollout_path("")), "status");
    assert_eq!(status["rollout"]["plan"]["interval_ms"], 600_000, "{status}");
    assert_eq!(status["rollout"]["plan"]["guards"]["max_rel_l2"], 0.05, "{status}");

    // Status needs no token.
    let out = baton(&["rollout", "status", "m", "--url", &url], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("candidate share 1%; version 1 serving"), "{stdout}");
    assert!(stdout.contains("failures 0/1") && stdout.contains("next window in"), "{stdout}");

    // --follow follows until the rollout ends, then exits by itself.
    let mut watching = command(&["rollout", "status", "m", "--follow", "--url", &url], &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the watch");
    let mut stdout = watching.stdout.take().expect("piped stdout");
    let reaper = Reaper(Some(watching));
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        let mut buffer = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buffer) {
            if n == 0 {
                break;
            }
            all.push_str(&String::from_utf8_lossy(&buffer[..n]));
            let _ = tx.send(all.clone());
        }
        all
    });
    // Promoted once the watch has shown the running rollout.
    let shown = rx.recv_timeout(PATIENCE).expect("the watch shows the rollout");
    assert!(shown.contains("running"), "{shown}");
    let out = baton(&["rollout", "promote", "m", "--url", &url], &with_token);
    assert!(out.status.success(), "baton rollout promote failed: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("promoted"), "{}", text(&out.stdout));
    let mut reaper = reaper;
    let mut child = reaper.0.take().expect("the watch");
    let status = eventually("the watch to end by itself", || child.try_wait().expect("waiting for the watch"));
    assert!(status.success(), "the watch failed");
    let watched = reader.join().expect("the reader");
    assert!(watched.contains("promoted"), "the watch shows the end: {watched}");
    assert_eq!(server.status("m")["serving"], 2);
    common::assert_no_panic(&server);
}
