//! Who may manage models, black box. With `--admin-token-file` the model
//! operations (load, unload, rollback, retire) need the token over REST and
//! gRPC, and the CLI sends it, while reads, health and inference stay open
//! and the token never reaches the log. With admin listeners the operations
//! move there and the inference ports refuse them. A server whose
//! management would be open on a non-loopback address refuses to start and
//! says what to do; so does one given an empty or missing token file.
//! Open reads show their details (a fleet's endpoints and errors) only to
//! those management would let in: on a public listener, the token.

mod common;

use std::process::{Command, Output};

use baton_protocol::grpc::{pb, pb_baton};
use baton_testkit::onnx::sample_input;
use baton_testkit::server::{Answer, Server};
use common::grpc::{assert_status, clients_at, runtime, with_token, within};
use common::{
    SIZES, assert_error, bin, infer, listening_address, post_with, refused_start, repo_with, request, start, token_file,
};
use serde_json::json;
use tonic::Code;

const TOKEN: &str = "s3cret-Token_42";

/// Every REST model operation on `m`, with a body it accepts.
const OPERATIONS: [&str; 5] = [
    "/v2/repository/models/m/load",
    "/v2/repository/models/m/unload",
    "/baton/v1/models/m/load",
    "/baton/v1/models/m/rollback",
    "/baton/v1/models/m/versions/1/retire",
];

fn authorization() -> String {
    format!("Bearer {TOKEN}")
}

fn load_version(url: &str, version: u64, headers: &[(&str, &str)]) -> Answer {
    post_with(url, "/v2/repository/models/m/load", &json!({ "parameters": { "version": version } }), headers)
}

/// Asserts the open endpoints answer at `url` without a token.
fn assert_open(url: &str) {
    let client = baton_testkit::server::Client::new(url);
    for path in ["/baton/v1/status", "/baton/v1/models/m/status", "/baton/v1/unloads", "/v2/health/live", "/v2"] {
        let answer = client.get(path);
        assert_eq!(answer.status, 200, "GET {path}: {}", String::from_utf8_lossy(&answer.body));
    }
    assert_eq!(client.post_json("/v2/repository/index", &json!({})).status, 200, "the index is open");
}

fn baton(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(bin());
    command.args(args).env_remove("BATON_URL").env_remove("BATON_LOG").env_remove("BATON_TOKEN_FILE");
    command.env_remove("BATON_TOKEN").env_remove("BATON_ADMIN_URL").envs(env.iter().copied());
    command.output().expect("running baton")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_model_operations_need_the_admin_token_over_rest_and_grpc() {
    let repo = repo_with("m", &[1, 2], "[policy]\nkeep_previous = 1");
    let (_dir, file) = token_file(TOKEN);
    let server = start(&repo, &["--admin-token-file", &file]);
    server.wait_settled("m", 2);
    server.wait_ready();
    let url = server.base();
    let auth = authorization();
    let batch = 2;
    let input = sample_input(SIZES[0], batch, 301);

    let before = server.status("m");
    // Without the token, with another one, or another scheme: 401, and the
    // scheme to use.
    for headers in [vec![], vec![("authorization", "Bearer wrong")], vec![("authorization", "Basic czNjcmV0")]] {
        for path in OPERATIONS {
            let answer = post_with(url, path, &json!({}), &headers);
            assert_error(&answer, 401, &["token"], path);
            assert_eq!(answer.json()["kind"], "unauthorized", "{path}");
            let challenge = answer.header("www-authenticate").unwrap_or_default();
            assert!(challenge.starts_with("Bearer"), "{path}: WWW-Authenticate {challenge:?}");
        }
    }
    assert_eq!(server.status("m")["last"], before["last"], "nothing refused ran");
    assert_eq!(server.status("m")["serving"], 2);

    // Reads, health and inference need nothing.
    assert_open(url);
    assert_eq!(infer(&server, "m", &input, batch).0, 2);

    // With the token the operations run.
    let load = load_version(url, 1, &[("authorization", &auth)]);
    assert_eq!(load.status, 200, "{}", load.error());
    assert_eq!(infer(&server, "m", &input, batch).0, 1);
    server.wait_settled("m", 1);
    let rollback = post_with(url, "/baton/v1/models/m/rollback", &json!({}), &[("authorization", &auth)]);
    assert_eq!(rollback.status, 200, "{}", rollback.error());
    assert_eq!(infer(&server, "m", &input, batch).0, 2);
    server.wait_settled("m", 2);

    runtime().block_on(async {
        let (mut inference, mut management) = clients_at(server.grpc_address()).await;
        let load = pb::RepositoryModelLoadRequest { model_name: "m".into(), ..Default::default() };
        let unload = pb::RepositoryModelUnloadRequest { model_name: "m".into(), ..Default::default() };
        let manage = pb_baton::LoadRequest { model: "m".into(), version: Some(1) };
        let rollback = pb_baton::RollbackRequest { model: "m".into() };

        let refused = within("load", inference.repository_model_load(load.clone())).await;
        let kind = assert_status(refused, Code::Unauthenticated, &["token"], "RepositoryModelLoad without the token");
        assert_eq!(kind, "unauthorized");
        let refused = within("load", inference.repository_model_load(with_token(load.clone(), "wrong"))).await;
        assert_status(refused, Code::Unauthenticated, &["not the server's admin token"], "with a wrong token");
        let refused = within("unload", inference.repository_model_unload(unload)).await;
        assert_status(refused, Code::Unauthenticated, &["token"], "RepositoryModelUnload without the token");
        let refused = within("Load", management.load(manage)).await;
        assert_status(refused, Code::Unauthenticated, &["token"], "Management.Load without the token");
        let refused = within("Rollback", management.rollback(rollback)).await;
        assert_status(refused, Code::Unauthenticated, &["token"], "Management.Rollback without the token");

        // Reads and inference need nothing.
        let status = within("status", management.status(pb_baton::StatusRequest::default())).await;
        assert!(status.expect("Management.Status is open").into_inner().ready);
        let index = within("index", inference.repository_index(pb::RepositoryIndexRequest::default())).await;
        assert!(!index.expect("RepositoryIndex is open").into_inner().models.is_empty());
        let metadata = pb::ModelMetadataRequest { name: "m".into(), version: String::new() };
        let metadata = within("metadata", inference.model_metadata(metadata)).await;
        assert_eq!(metadata.expect("ModelMetadata is open").into_inner().versions, ["2"]);

        // With the token they run.
        let manage = pb_baton::LoadRequest { model: "m".into(), version: Some(1) };
        let report = within("Load", management.load(with_token(manage, TOKEN))).await.expect("Load with the token");
        assert_eq!(report.into_inner().version, Some(1));
        let loaded = within("load", inference.repository_model_load(with_token(load, TOKEN))).await;
        loaded.expect("RepositoryModelLoad with the token");
    });
    assert_eq!(infer(&server, "m", &input, batch).0, 2, "the repository load took the newest version");

    let log = server.log();
    assert!(!log.contains(TOKEN), "the token must never be logged:\n{log}");
    assert!(log.contains("Refused a management request without a valid admin token."), "{log}");
    common::assert_no_panic(&server);
}

#[test]
fn the_cli_sends_the_token_from_a_file() {
    let repo = repo_with("m", &[1, 2], "[policy]\nkeep_previous = 1");
    let (_dir, file) = token_file(TOKEN);
    let server = start(&repo, &["--admin-token-file", &file, "--no-watch"]);
    server.wait_settled("m", 2);
    let url = server.base();

    let out = baton(&["load", "m", "--version", "1", "--url", url], &[]);
    assert!(!out.status.success(), "a load without the token must fail");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("401") && stderr.contains("--token-file"), "{stderr}");
    assert_eq!(server.status("m")["serving"], 2);

    let out = baton(&["load", "m", "--version", "1", "--url", url, "--token-file", &file], &[]);
    assert!(out.status.success(), "baton load --token-file failed: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("load m: version 1 serving (was 2)"), "{}", text(&out.stdout));
    server.wait_settled("m", 1);

    let out = baton(&["rollback", "m", "--url", url], &[("BATON_TOKEN_FILE", &file)]);
    assert!(out.status.success(), "baton rollback with BATON_TOKEN_FILE failed: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("rollback m: version 2 serving (was 1)"), "{}", text(&out.stdout));

    // Status is open: it needs no token.
    let out = baton(&["status", "--url", url], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    common::assert_no_panic(&server);
}

/// Starts a server with admin listeners and returns it with their REST and
/// gRPC addresses.
fn start_with_admin(repo: &baton_testkit::repo::TestRepo) -> (Server, String, String) {
    let mut server = start(repo, &["--admin-http", "127.0.0.1:0", "--admin-grpc", "127.0.0.1:0", "--no-watch"]);
    let admin_http = format!("http://{}", listening_address(&server.next_line()));
    let admin_grpc = listening_address(&server.next_line());
    (server, admin_http, admin_grpc)
}

#[test]
fn admin_listeners_take_the_model_operations_off_the_inference_ports() {
    let repo = repo_with("m", &[1, 2], "[policy]\nkeep_previous = 1");
    let (server, admin, admin_grpc) = start_with_admin(&repo);
    server.wait_settled("m", 2);
    let url = server.base();
    let batch = 2;
    let input = sample_input(SIZES[0], batch, 302);

    // The inference port refuses every operation and says where they are.
    for path in OPERATIONS {
        let answer = post_with(url, path, &json!({}), &[]);
        assert_error(&answer, 403, &["admin listener"], path);
        assert_eq!(answer.json()["kind"], "wrong_listener", "{path}");
    }
    assert_eq!(server.status("m")["serving"], 2, "nothing refused ran");
    assert_open(url);
    assert_eq!(infer(&server, "m", &input, batch).0, 2);

    // The admin listener serves them, and the reads, but not inference.
    let load = load_version(&admin, 1, &[]);
    assert_eq!(load.status, 200, "{}", load.error());
    assert_eq!(infer(&server, "m", &input, batch).0, 1);
    assert_open(&admin);
    let answer = post_with(&admin, "/v2/models/m/infer", &request(&input, batch), &[]);
    assert_error(&answer, 403, &["inference listener"], "inference on the admin listener");
    server.wait_settled("m", 1);

    runtime().block_on(async {
        let (mut inference, mut management) = clients_at(server.grpc_address()).await;
        let load = pb::RepositoryModelLoadRequest { model_name: "m".into(), ..Default::default() };
        let refused = within("load", inference.repository_model_load(load.clone())).await;
        let kind = assert_status(refused, Code::PermissionDenied, &["admin listener"], "RepositoryModelLoad");
        assert_eq!(kind, "wrong_listener");
        let rollback = pb_baton::RollbackRequest { model: "m".into() };
        let refused = within("Rollback", management.rollback(rollback.clone())).await;
        assert_status(refused, Code::PermissionDenied, &["admin listener"], "Management.Rollback");
        let status = within("status", management.status(pb_baton::StatusRequest::default())).await;
        status.expect("Management.Status stays on the inference port");

        let (mut admin_inference, mut admin_management) = clients_at(&admin_grpc).await;
        let report = within("Rollback", admin_management.rollback(rollback)).await.expect("Rollback on the admin port");
        assert_eq!(report.into_inner().version, Some(2));
        let metadata = pb::ModelMetadataRequest { name: "m".into(), version: String::new() };
        let refused = within("metadata", admin_inference.model_metadata(metadata)).await;
        assert_status(refused, Code::PermissionDenied, &["inference listener"], "ModelMetadata on the admin port");
        let status = within("status", admin_management.status(pb_baton::StatusRequest::default())).await;
        status.expect("Management.Status on the admin port");
    });
    assert_eq!(infer(&server, "m", &input, batch).0, 2, "rolled back over the admin gRPC port");
    server.wait_settled("m", 2);

    // The CLI reads from --url and manages through --admin-url.
    let out = baton(&["load", "m", "--version", "1", "--url", url], &[]);
    assert!(!out.status.success(), "a load on the inference port must fail");
    assert!(text(&out.stderr).contains("--admin-url"), "{}", text(&out.stderr));
    let out = baton(&["load", "m", "--version", "1", "--url", url], &[("BATON_ADMIN_URL", &admin)]);
    assert!(out.status.success(), "baton load with BATON_ADMIN_URL failed: {}", text(&out.stderr));
    assert_eq!(infer(&server, "m", &input, batch).0, 1);
    common::assert_no_panic(&server);
}

#[test]
fn management_open_on_a_public_address_refuses_to_start_unless_protected() {
    let repo = repo_with("m", &[1], "");
    for args in [&["--http", "0.0.0.0:0"][..], &["--grpc", "0.0.0.0:0"], &["--admin-http", "0.0.0.0:0"]] {
        let (status, stderr) = refused_start(&repo, args);
        assert!(!status.success(), "{args:?}: {status:?}");
        for needle in ["not a loopback address", "--admin-token-file", "--insecure-management", "0.0.0.0:0"] {
            assert!(stderr.contains(needle), "{args:?}: the error should mention {needle:?}: {stderr}");
        }
    }
    let (status, stderr) = refused_start(&repo, &["--admin-token-file", "/nonexistent/token"]);
    assert!(!status.success() && stderr.contains("/nonexistent/token"), "{stderr}");
    let (_dir, empty) = token_file("");
    let (status, stderr) = refused_start(&repo, &["--admin-token-file", &empty]);
    assert!(!status.success() && stderr.contains("is empty"), "{stderr}");

    // Each way out starts: a token, a loopback admin listener, the opt-out.
    let (_dir, file) = token_file(TOKEN);
    let public = ["--http", "0.0.0.0:0", "--grpc", "0.0.0.0:0"];
    let token: Vec<&str> = public.iter().copied().chain(["--admin-token-file", file.as_str()]).collect();
    let loopback_admin = [&public[..], &["--admin-http", "127.0.0.1:0", "--admin-grpc", "127.0.0.1:0"]].concat();
    let insecure = [&public[..], &["--insecure-management"]].concat();
    for args in [token, loopback_admin, insecure] {
        // Started means it printed its addresses; nothing connects to the
        // public ones.
        let mut server = start(&repo, &args);
        assert!(server.base().starts_with("http://0.0.0.0:"), "{args:?}: {}", server.base());
        assert!(server.terminate().success(), "{args:?}");
    }
}

#[test]
fn status_on_a_public_listener_without_a_token_shows_no_details() {
    let etcd = baton_testkit::etcd::Etcd::start();
    let repo = repo_with("m", &[1], "");
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let fleet = ["--cluster", cluster.as_str(), "--replica-id", "r1"];
    let public = ["--http", "0.0.0.0:0", "--grpc", "0.0.0.0:0", "--model-control", "none"];
    let server = start(&repo, &[&fleet[..], &public[..]].concat());
    server.wait_ready();
    let open = json!({ "connected": true });
    let status = server.get("/baton/v1/status").json();
    assert_eq!(status["cluster"], open, "REST: {status}");
    runtime().block_on(async {
        let (_, mut management) = clients_at(server.grpc_address()).await;
        let status = within("status", management.status(pb_baton::StatusRequest::default())).await;
        let json: serde_json::Value =
            serde_json::from_str(&status.expect("Management.Status is open").into_inner().json).expect("JSON");
        assert_eq!(json["cluster"], open, "gRPC: {json}");
    });
    // The same server on loopback shows its fleet's details to anyone on
    // the machine.
    drop(server);
    let server = start(&repo, &fleet);
    server.wait_ready();
    let status = server.get("/baton/v1/status").json();
    assert!(status["cluster"].get("endpoint").is_some(), "loopback: {status}");
}
