//! Shutdown for rolling restarts, black box. With `--shutdown-delay` the
//! server reports not ready at once after SIGTERM but keeps serving and
//! accepting (REST and gRPC) until the delay is over, then exits by itself.
//! A second signal exits at once, non-zero, while a load holds shutdown
//! back. A load still running when `--shutdown-timeout` runs out does not
//! keep the process alive.
//!
//! "A load is held" means a model whose warmup would run for minutes at the
//! loader's low priority: the tests stop the server long before it ends, and
//! check in the log that it never finished.

mod common;

use baton_protocol::grpc::pb;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::{Client, Server, eventually};
use common::grpc::{clients_at, runtime, within};
use common::{SIZES, assert_close, mlp, output_f32, plain_log, repo_with, request, start, version_of};

/// Adds model `slow` (not required): its warmup runs 64 batches of 8192
/// rows through a 16-1024-1024-1 MLP, some 35 GFLOP each.
fn add_slow(repo: &TestRepo) {
    let slow = Mlp::new(&[16, 1024, 1024, 1], 91);
    let toml = format!(
        "required = false\nmax_batch_size = 8192\n[warmup]\nbatch_sizes = {:?}\nmax_latency_ms = 600000",
        [8192; 64]
    );
    repo.add_model("slow", &mlp_toml(&slow, &toml));
    repo.publish_mlp("slow", 1, &slow);
}

/// Waits until `slow` is warming up: its load is in progress and far from
/// done.
fn wait_warming(server: &Server) {
    eventually("slow to be warming up", || {
        let status = server.get("/baton/v1/models/slow/status");
        (status.status == 200 && status.json()["state"] == "WARMING").then_some(())
    });
}

/// Whether the log says `slow`'s load finished.
fn slow_finished(log: &str) -> bool {
    log.contains("Model operation finished. model=slow")
}

#[test]
fn the_shutdown_delay_keeps_serving_while_reporting_not_ready() {
    let repo = repo_with("m", &[1], "");
    let mut server = start(&repo, &["--shutdown-delay", "10"]);
    server.wait_ready();
    let base = server.base().to_owned();
    let batch = 2;
    let input = sample_input(SIZES[0], batch, 501);

    server.signal_terminate();
    // Each check on a connection of its own: the listener still accepts.
    let ready = eventually("readiness to turn 503", || {
        let answer = Client::new(&base).try_get("/v2/health/ready").ok()?;
        (answer.status == 503).then_some(answer)
    });
    assert_eq!(ready.json()["draining"], true);
    let answer = Client::new(&base).post_json("/v2/models/m/infer", &request(&input, batch));
    assert_eq!(answer.status, 200, "inference during the delay: {}", answer.error());
    assert_eq!(version_of(&answer.json()), 1);
    assert_close(&output_f32(&answer.json(), "output"), &mlp(1).forward(&input, batch), "during the delay");
    runtime().block_on(async {
        let (mut inference, _) = clients_at(server.grpc_address()).await;
        let ready = within("ready", inference.server_ready(pb::ServerReadyRequest {})).await;
        assert!(!ready.expect("ServerReady during the delay").into_inner().ready);
        let metadata = pb::ModelMetadataRequest { name: "m".into(), version: String::new() };
        let metadata = within("metadata", inference.model_metadata(metadata)).await;
        assert_eq!(metadata.expect("ModelMetadata during the delay").into_inner().versions, ["1"]);
    });

    // Then it stops accepting and exits by itself.
    let status = server.wait_exit();
    assert_eq!(status.code(), Some(0), "{status:?}");
    let log = plain_log(&server);
    let began = log.find("Shutting down: not ready from now on").expect("the shutdown line");
    let over = log.find("The shutdown delay is over").expect("the line ending the delay");
    assert!(began < over, "{log}");
    assert!(Client::new(&base).try_get("/v2/health/live").is_err(), "a connection after exit must be refused");
}

#[test]
fn a_second_signal_exits_at_once_while_a_load_holds_shutdown() {
    let repo = repo_with("m", &[1], "");
    add_slow(&repo);
    let args = ["--model-control", "explicit", "--load-model", "m", "--shutdown-timeout", "600"];
    let mut server = start(&repo, &args);
    server.wait_ready();
    // A load request in flight: shutdown would wait for it.
    let client = server.client();
    let load = std::thread::spawn(move || client.try_post_raw("/v2/repository/models/slow/load", b"{}", &[]));
    wait_warming(&server);

    server.signal_terminate();
    eventually("shutdown to begin", || plain_log(&server).contains("Shutting down").then_some(()));
    server.signal("INT");
    let status = server.wait_exit();
    let log = plain_log(&server);
    assert_eq!(status.code(), Some(130), "128 + SIGINT: {status:?}\n{log}");
    assert!(log.contains("A second signal: exiting at once"), "{log}");
    assert!(!slow_finished(&log), "the process waited for the load:\n{log}");
    let answer = load.join().expect("the load thread");
    assert!(answer.is_err(), "the load in flight got no answer: {answer:?}");
}

#[test]
fn shutdown_does_not_wait_for_a_load_past_its_timeout() {
    let repo = TestRepo::new();
    add_slow(&repo);
    // The repository watcher loads `slow` at start and waits for the load.
    let mut server = start(&repo, &["--shutdown-timeout", "1"]);
    wait_warming(&server);

    server.signal_terminate();
    let status = server.wait_exit();
    let log = plain_log(&server);
    assert_eq!(status.code(), Some(0), "{status:?}\n{log}");
    assert!(log.contains("Shutdown timed out with a model operation still running"), "{log}");
    assert!(!slow_finished(&log), "the process waited for the load:\n{log}");
    assert!(log.contains("baton stopped."), "{log}");
}
