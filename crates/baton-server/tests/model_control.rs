//! `--model-control`, black box. `explicit` loads only the models named by
//! `--load-model` at start, is ready without the others, and the API loads
//! them; a name the repository lacks keeps the server from starting. `none`
//! loads every model and refuses every model operation over REST and gRPC,
//! while reads and inference go on. `poll` picks up a new version and lets
//! the API load.

mod common;

use baton_protocol::grpc::{pb, pb_baton};
use baton_testkit::onnx::sample_input;
use baton_testkit::repo::{TestRepo, mlp_toml};
use common::grpc::{assert_status, clients_at, runtime, within};
use common::{SIZES, assert_close, assert_error, infer, mlp, post_with, refused_start, start};
use serde_json::json;
use tonic::Code;

/// A repository with models `a` and `b` (both required, the default), each
/// with versions 1 and 2.
fn two_models() -> TestRepo {
    let repo = TestRepo::new();
    for name in ["a", "b"] {
        repo.add_model(name, &mlp_toml(&mlp(1), "[policy]\nkeep_previous = 1"));
        for v in [1, 2] {
            repo.publish_mlp(name, v, &mlp(v));
        }
    }
    repo
}

#[test]
fn explicit_loads_only_the_named_models_and_the_api_loads_the_others() {
    let repo = two_models();
    let server = start(&repo, &["--model-control", "explicit", "--load-model", "a"]);
    server.wait_settled("a", 2);
    // Ready although `b`, a required model, is not loaded: readiness waits
    // only for the models named.
    server.wait_ready();
    let rows = common::index(&server, &json!({}));
    let b: Vec<&str> = rows.iter().filter(|r| r.0 == "b").map(|r| r.2.as_str()).collect();
    assert_eq!(b, ["UNAVAILABLE", "UNAVAILABLE"], "b must not be loaded at start: {rows:?}");
    let batch = 2;
    let input = sample_input(SIZES[0], batch, 401);
    let answer = server.post_json("/v2/models/b/infer", &common::request(&input, batch));
    assert_eq!(answer.status, 503, "{}", answer.error());

    let load = post_with(server.base(), "/v2/repository/models/b/load", &json!({}), &[]);
    assert_eq!(load.status, 200, "{}", load.error());
    let (version, output) = infer(&server, "b", &input, batch);
    assert_eq!(version, 2);
    assert_close(&output, &mlp(2).forward(&input, batch), "b loaded by the API");
    let unload = post_with(server.base(), "/v2/repository/models/a/unload", &json!({}), &[]);
    assert_eq!(unload.status, 200, "{}", unload.error());
    assert!(server.status("a")["serving"].is_null(), "the API unloads in explicit mode");
    common::assert_no_panic(&server);

    let (status, stderr) = refused_start(&repo, &["--model-control", "explicit", "--load-model", "nosuch"]);
    assert!(!status.success(), "{status:?}");
    assert!(stderr.contains("--load-model nosuch") && stderr.contains("no such model"), "{stderr}");
}

#[test]
fn explicit_mode_over_an_empty_repository_is_ready_in_each_of_its_spellings() {
    // An empty repository is filled and loaded through the API (a sidecar
    // agent's target): an orchestrator waits for readiness before it loads,
    // so holding such a server not ready would deadlock it.
    for args in
        [&["--no-poll"][..], &["--model-control", "explicit", "--load-model", "*"], &["--model-control", "explicit"]]
    {
        let repo = TestRepo::new();
        let server = start(&repo, args);
        let answer = baton_testkit::server::eventually("readiness to decide", || {
            let answer = server.get("/v2/health/ready");
            (answer.status == 200 || answer.json().get("reason").is_some()).then_some(answer)
        });
        assert_eq!(answer.status, 200, "{args:?} over an empty repository: {}", String::from_utf8_lossy(&answer.body));
        // The model an agent then puts there loads through the API.
        repo.add_model("a", &mlp_toml(&mlp(1), ""));
        repo.publish_mlp("a", 1, &mlp(1));
        let load = post_with(server.base(), "/v2/repository/models/a/load", &json!({}), &[]);
        assert_eq!(load.status, 200, "{args:?}: {}", load.error());
        assert_eq!(server.get("/v2/health/ready").status, 200, "{args:?}: ready once it serves");
    }
}

#[test]
fn none_loads_every_model_and_refuses_every_model_operation() {
    let repo = two_models();
    let server = start(&repo, &["--model-control", "none"]);
    server.wait_ready();
    server.wait_settled("a", 2);
    server.wait_settled("b", 2);
    let before = server.status("a");
    let url = server.base();
    for path in [
        "/v2/repository/models/a/load",
        "/v2/repository/models/a/unload",
        "/baton/v1/models/a/load",
        "/baton/v1/models/a/rollback",
        "/baton/v1/models/a/versions/1/retire",
    ] {
        let answer = post_with(url, path, &json!({}), &[]);
        assert_error(&answer, 403, &["--model-control none"], path);
        assert_eq!(answer.json()["kind"], "model_control_disabled", "{path}");
    }
    runtime().block_on(async {
        let (mut inference, mut management) = clients_at(server.grpc_address()).await;
        let load = pb::RepositoryModelLoadRequest { model_name: "a".into(), ..Default::default() };
        let refused = within("load", inference.repository_model_load(load)).await;
        let kind = assert_status(refused, Code::PermissionDenied, &["--model-control none"], "RepositoryModelLoad");
        assert_eq!(kind, "model_control_disabled");
        let unload = pb::RepositoryModelUnloadRequest { model_name: "a".into(), ..Default::default() };
        let refused = within("unload", inference.repository_model_unload(unload)).await;
        assert_status(refused, Code::PermissionDenied, &["--model-control none"], "RepositoryModelUnload");
        let refused = within("Load", management.load(pb_baton::LoadRequest { model: "a".into(), version: None })).await;
        assert_status(refused, Code::PermissionDenied, &["--model-control none"], "Management.Load");
        let status = within("status", management.status(pb_baton::StatusRequest::default())).await;
        assert!(status.expect("status stays open").into_inner().ready);
    });
    assert_eq!(server.status("a")["last"], before["last"], "nothing refused ran");
    assert_eq!(server.post_json("/v2/repository/index", &json!({})).status, 200, "the index stays open");
    let batch = 2;
    let input = sample_input(SIZES[0], batch, 402);
    assert_eq!(infer(&server, "a", &input, batch).0, 2);
    common::assert_no_panic(&server);
}

#[test]
fn poll_picks_up_a_new_version_and_lets_the_api_load() {
    let repo = common::repo_with("m", &[1], "[policy]\nkeep_previous = 1");
    let server = start(&repo, &["--model-control", "poll"]);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    server.wait_settled("m", 2);
    let batch = 2;
    let input = sample_input(SIZES[0], batch, 403);
    let (version, output) = infer(&server, "m", &input, batch);
    assert_eq!(version, 2);
    assert_close(&output, &mlp(2).forward(&input, batch), "the polled version");
    let load = post_with(server.base(), "/baton/v1/models/m/load", &json!({ "version": 1 }), &[]);
    assert_eq!(load.status, 200, "{}", load.error());
    assert_eq!(infer(&server, "m", &input, batch).0, 1);
    common::assert_no_panic(&server);
}
