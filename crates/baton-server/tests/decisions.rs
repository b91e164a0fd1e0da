//! Operators' decisions survive a restart, black box. A rollback or an
//! unload is written to the state file and restored by the next server; a
//! version published afterwards supersedes it and leaves the file. A pin
//! holds against newer versions, across a restart, until unpinned; pin and
//! unpin need the admin token. A state file that cannot be parsed keeps
//! baton from starting; `--state-dir` keeps the file out of the repository,
//! and a file that cannot be written is reported with `state_write_failed`.
//! Explicit model control restores decisions too, drops one whose version
//! is gone, and the event stream tells of decisions that end.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use baton_protocol::grpc::pb_baton;
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Answer, Client, Server, eventually};
use common::grpc::{assert_status, clients_at, runtime, with_token, within};
use common::{bin, mlp, plain_log, post_with, refused_start, repo_with, start, token_file};
use serde_json::{Value, json};
use tonic::Code;

const KEEP: &str = "[policy]\nkeep_previous = 1";
const TOKEN: &str = "pin-Token_7";

/// The state file in the repository root, parsed; it must be pretty JSON
/// of format 1.
fn state_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(text.contains("\n  \"models\""), "not pretty-printed for an operator: {text}");
    let state: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    assert_eq!(state["version"], 1, "{state}");
    state
}

fn in_repository(repo: &TestRepo) -> std::path::PathBuf {
    repo.root().join(".baton-state.json")
}

/// Sends `method` with a JSON body and optional headers.
fn send(url: &str, method: &str, path: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut request = ureq::http::Request::builder().method(method).uri(format!("{url}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.header("content-type", "application/json").body(body.to_string()).unwrap();
    let mut response = agent.run(request).unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_vec().expect("a body");
    Answer { status, headers: Vec::new(), body }
}

fn baton(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(bin());
    command.args(args).env_remove("BATON_URL").env_remove("BATON_TOKEN_FILE").env_remove("BATON_TOKEN");
    command.env_remove("BATON_ADMIN_URL").env_remove("BATON_LOG").envs(env.iter().copied());
    command.output().expect("running baton")
}

/// Waits until the server's log has a line containing every one of `needles`.
fn wait_logged(server: &Server, needles: &[&str]) {
    eventually(&format!("a log line with {needles:?}"), || {
        plain_log(server).lines().any(|line| needles.iter().all(|n| line.contains(n))).then_some(())
    });
}

#[test]
fn a_rollback_survives_a_restart_until_a_newer_version_is_published() {
    let repo = repo_with("m", &[1], KEEP);
    let mut server = start(&repo, &[]);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    server.wait_settled("m", 2);
    let rollback = server.post_json("/baton/v1/models/m/rollback", &json!({}));
    assert_eq!(rollback.status, 200, "{}", rollback.error());
    // Answered only once the decision is on disk.
    let state = state_file(&in_repository(&repo));
    let decision = &state["models"]["m"];
    assert_eq!(
        (&decision["kind"], &decision["version"], &decision["yields_to"]),
        (&json!("rollback"), &json!(1), &json!(2))
    );
    assert!(decision["at"].as_u64().is_some_and(|at| at > 1_600_000_000), "{decision}");
    assert!(server.terminate().success());

    let server = start(&repo, &[]);
    server.wait_settled("m", 1);
    let status = server.status("m");
    assert_eq!(status["decision"]["kind"], "rollback", "{status}");
    assert_eq!(status["decision"]["holds"], "until a version newer than 2 is published", "{status}");
    let all = common::server_status(&server);
    assert_eq!(all["models"][0]["decision"]["version"], 1, "{all}");

    repo.publish_mlp("m", 3, &mlp(3));
    server.wait_settled("m", 3);
    wait_logged(&server, &["version 3 is newer, so it takes over"]);
    assert!(server.status("m")["decision"].is_null());
    let state = state_file(&in_repository(&repo));
    assert_eq!(state["models"], json!({}), "the superseded decision left the file");
    common::assert_no_panic(&server);
}

#[test]
fn an_unload_survives_a_restart_and_readiness_does_not_wait_for_it() {
    let repo = TestRepo::new();
    for name in ["a", "b"] {
        repo.add_model(name, &baton_testkit::repo::mlp_toml(&mlp(1), KEEP));
        repo.publish_mlp(name, 1, &mlp(1));
    }
    let mut server = start(&repo, &[]);
    server.wait_settled("a", 1);
    server.wait_settled("b", 1);
    let unload = post_with(server.base(), "/v2/repository/models/a/unload", &json!({}), &[]);
    assert_eq!(unload.status, 200, "{}", unload.error());
    let state = state_file(&in_repository(&repo));
    assert_eq!(state["models"]["a"]["kind"], "unload", "{state}");
    assert_eq!(state["models"]["a"]["yields_to"], 1, "{state}");
    assert!(server.terminate().success());

    let server = start(&repo, &[]);
    // `a` comes before `b` in the first pass, which loads `b` before the
    // server is ready.
    server.wait_ready();
    server.wait_settled("b", 1);
    wait_logged(&server, &["stays unloaded"]);
    let status = server.status("a");
    assert!(status["serving"].is_null(), "a must stay unloaded: {status}");
    assert_eq!(status["decision"]["kind"], "unload", "{status}");
    common::assert_no_panic(&server);
}

#[test]
fn a_pin_holds_against_newer_versions_and_restarts_until_unpinned_with_the_token() {
    let repo = repo_with("m", &[1, 2], KEEP);
    let (_dir, file) = token_file(TOKEN);
    let auth = format!("Bearer {TOKEN}");
    let mut server = start(&repo, &["--admin-token-file", &file]);
    server.wait_settled("m", 2);
    let url = server.base().to_owned();

    let refused = send(&url, "PUT", "/baton/v1/models/m/pin", &json!({ "version": 1 }), &[]);
    assert_eq!((refused.status, refused.json()["kind"].clone()), (401, json!("unauthorized")));
    let refused = send(&url, "DELETE", "/baton/v1/models/m/pin", &json!({}), &[]);
    assert_eq!(refused.status, 401, "unpin without the token");
    let missing = send(&url, "PUT", "/baton/v1/models/m/pin", &json!({ "version": 9 }), &[("authorization", &auth)]);
    assert_eq!(
        (missing.status, missing.json()["kind"].clone()),
        (404, json!("version_not_found")),
        "{}",
        missing.error()
    );
    runtime().block_on(async {
        let (_, mut management) = clients_at(server.grpc_address()).await;
        let pin = pb_baton::PinRequest { model: "m".into(), version: 1 };
        let refused = within("Pin", management.pin(pin.clone())).await;
        assert_status(refused, Code::Unauthenticated, &["token"], "Management.Pin without the token");
        let refused = within("Unpin", management.unpin(pb_baton::UnpinRequest { model: "m".into() })).await;
        assert_status(refused, Code::Unauthenticated, &["token"], "Management.Unpin without the token");
        let missing = pb_baton::PinRequest { model: "m".into(), version: 9 };
        let refused = within("Pin", management.pin(with_token(missing, TOKEN))).await;
        let kind = assert_status(refused, Code::NotFound, &["version 9"], "Management.Pin of a missing version");
        assert_eq!(kind, "version_not_found");
    });
    assert_eq!(server.status("m")["serving"], 2, "nothing refused ran");

    // The CLI sends the token from --token-file; the version is loaded.
    let pinned = baton(&["pin", "m", "1", "--url", &url, "--token-file", &file], &[]);
    assert!(pinned.status.success(), "{}", String::from_utf8_lossy(&pinned.stderr));
    assert!(String::from_utf8_lossy(&pinned.stdout).contains("until unpinned"));
    server.wait_settled("m", 1);
    let state = state_file(&in_repository(&repo));
    assert_eq!(state["models"]["m"], json!({ "kind": "pin", "version": 1, "at": state["models"]["m"]["at"] }));
    // Another operation on a pinned model is refused until it is unpinned.
    let load = post_with(&url, "/baton/v1/models/m/load", &json!({}), &[("authorization", &auth)]);
    assert_eq!((load.status, load.json()["kind"].clone()), (409, json!("model_pinned")), "{}", load.error());

    repo.publish_mlp("m", 3, &mlp(3));
    wait_logged(&server, &["decision holds", "version=3"]);
    assert_eq!(server.status("m")["serving"], 1, "the pin holds against a newer version");
    assert!(server.terminate().success());

    let mut server = start(&repo, &["--admin-token-file", &file]);
    server.wait_settled("m", 1);
    assert_eq!(server.status("m")["decision"]["kind"], "pin");
    let url = server.base().to_owned();
    let refused = baton(&["unpin", "m", "--url", &url], &[]);
    assert!(!refused.status.success(), "unpin without the token succeeded");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--token-file"));
    let unpinned = baton(&["unpin", "m", "--url", &url], &[("BATON_TOKEN", TOKEN)]);
    assert!(unpinned.status.success(), "{}", String::from_utf8_lossy(&unpinned.stderr));
    server.wait_settled("m", 3);
    assert_eq!(state_file(&in_repository(&repo))["models"], json!({}));
    assert!(server.status("m")["decision"].is_null());
    assert!(server.terminate().success());
}

#[test]
fn a_state_file_that_cannot_be_parsed_keeps_baton_from_starting() {
    let repo = repo_with("m", &[1], KEEP);
    std::fs::write(in_repository(&repo), "{ \"version\": 1, \"models\": ").unwrap();
    let (status, stderr) = refused_start(&repo, &[]);
    assert!(!status.success(), "{status:?}");
    assert!(stderr.contains(".baton-state.json") && stderr.contains("state file"), "{stderr}");
}

#[test]
fn a_state_dir_keeps_the_file_out_of_the_repository_and_a_failed_write_is_reported() {
    let repo = repo_with("m", &[1, 2], KEEP);
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("baton");
    let listing = |root: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        names
    };
    let before = listing(repo.root());
    // Read-only for anyone but root; as root, the listing below shows that
    // nothing was written there.
    set_read_only(repo.root(), true);
    let server = start(&repo, &["--state-dir", dir.to_str().unwrap()]);
    server.wait_settled("m", 2);
    let load = server.post_json("/baton/v1/models/m/load", &json!({ "version": 1 }));
    assert_eq!(load.status, 200, "{}", load.error());
    let state_json = state_file(&dir.join("state.json"));
    assert_eq!(state_json["models"]["m"]["kind"], "load");
    assert_eq!(listing(repo.root()), before, "nothing written into the repository");
    drop(server);
    set_read_only(repo.root(), false);

    // A directory no one can create files in, not even root.
    let server = start(&repo, &["--state-dir", "/proc/self"]);
    server.wait_settled("m", 2);
    let rollback = Client::new(server.base()).post_json("/baton/v1/models/m/load", &json!({ "version": 1 }));
    assert_eq!((rollback.status, rollback.json()["kind"].clone()), (500, json!("state_write_failed")));
    assert!(rollback.error().contains("state file"), "{}", rollback.error());
    assert_eq!(server.status("m")["serving"], 1, "serving keeps what was chosen");
    wait_logged(&server, &["Could not write the state file"]);
}

fn set_read_only(dir: &Path, read_only: bool) {
    use std::os::unix::fs::PermissionsExt;
    let mode = if read_only { 0o555 } else { 0o755 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn explicit_mode_restores_decisions_and_drops_one_whose_version_is_gone() {
    let repo = TestRepo::new();
    for name in ["m", "n"] {
        repo.add_model(name, &baton_testkit::repo::mlp_toml(&mlp(1), KEEP));
        for v in [1, 2] {
            repo.publish_mlp(name, v, &mlp(v));
        }
    }
    // As an operator (or an earlier server) would have written it.
    let state = json!({ "version": 1, "models": {
        "m": { "kind": "rollback", "version": 1, "at": 1_767_312_000, "yields_to": 2 },
        "n": { "kind": "load", "version": 7, "at": 1_767_312_000, "yields_to": 7 },
    }});
    std::fs::write(in_repository(&repo), serde_json::to_string_pretty(&state).unwrap()).unwrap();
    let server = start(&repo, &["--model-control", "explicit"]);
    // Neither is named with --load-model; both load, as their decisions say.
    server.wait_settled("m", 1);
    server.wait_settled("n", 2);
    wait_logged(&server, &["cannot be restored", "version 7 is not in the repository"]);
    let file = state_file(&in_repository(&repo));
    assert_eq!(file["models"].as_object().map(|m| m.keys().cloned().collect::<Vec<_>>()), Some(vec!["m".into()]));

    // Loading the newest version returns the model to the normal choice,
    // and says so on the event stream.
    runtime().block_on(async {
        let (_, mut management) = clients_at(server.grpc_address()).await;
        let events = within("Events", management.events(pb_baton::EventsRequest { model: "m".into() })).await;
        let mut events = events.expect("Events").into_inner();
        let load = post_with(server.base(), "/baton/v1/models/m/load", &json!({}), &[]);
        assert_eq!(load.status, 200, "{}", load.error());
        loop {
            let event = within("a decision event", events.message()).await.expect("the stream").expect("an event");
            if event.kind == "decision" {
                let json: Value = serde_json::from_str(&event.json).unwrap();
                assert_eq!((&json["change"], &json["decision"]), (&json!("removed"), &json!("rollback")), "{json}");
                break;
            }
        }
    });
    assert_eq!(state_file(&in_repository(&repo))["models"], json!({}));
    common::assert_no_panic(&server);
}
