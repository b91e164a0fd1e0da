//! Memory budgets and the resource swap policy, black box. A load that
//! would take the model's versions beyond `[policy] memory_budget`, or
//! every model's beyond `--memory-budget`, is refused with 507 over REST
//! and `RESOURCE_EXHAUSTED` over gRPC, kind `memory_budget_exceeded`, at
//! stage `load`, and the old version keeps serving. Under `[policy] swap =
//! "resource"`, REST and gRPC requests sent while versions swap are all
//! answered, never two versions are in memory, and a candidate refused
//! after the pause leaves the old version serving again.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use baton_protocol::grpc::pb;
use baton_testkit::onnx::{encode_mlp, sample_input};
use baton_testkit::repo::{TestRepo, golden_json, mlp_toml};
use baton_testkit::server::metric;
use common::grpc::{assert_status, client, runtime, within};
use common::{SIZES, assert_close, assert_error, infer, mlp, output_f32, request, start, version_of};
use serde_json::json;
use tonic::Code;

const EXPLICIT: [&str; 4] = ["--model-control", "explicit", "--load-model", "m"];

fn load(server: &baton_testkit::server::Server, version: u64) -> baton_testkit::server::Answer {
    server.post_json("/baton/v1/models/m/load", &json!({ "version": version }))
}

#[test]
fn loads_beyond_a_memory_budget_are_refused_and_the_old_version_serves() {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("m", 1, &mlp(1));
    let server = start(&repo, &EXPLICIT);
    server.wait_settled("m", 1);
    repo.add_model("m", &mlp_toml(&mlp(1), "[policy]\nmemory_budget = 1024"));
    repo.publish_mlp("m", 2, &mlp(2));

    let refused = load(&server, 2);
    assert_error(
        &refused,
        507,
        &["memory budget exceeded", "is 1.0 KiB", "[policy] memory_budget"],
        "a load over budget",
    );
    assert_eq!(refused.json()["kind"], "memory_budget_exceeded");
    let status = server.status("m");
    assert_eq!(status["serving"], 1);
    assert_eq!(
        (&status["last_error"]["kind"], &status["last_error"]["stage"]),
        (&json!("memory_budget_exceeded"), &json!("load"))
    );
    let input = sample_input(SIZES[0], 1, 7);
    let (version, output) = infer(&server, "m", &input, 1);
    assert_eq!(version, 1, "the old version keeps serving");
    assert_close(&output, &mlp(1).forward(&input, 1), "version 1");
    let failures = metric(&server.metrics(), r#"baton_load_failures_total{model="m",stage="load"}"#);
    assert_eq!(failures, Some(1.0));

    runtime().block_on(async {
        let mut grpc = client(&server).await;
        let parameters = [(
            "version".to_owned(),
            pb::ModelRepositoryParameter {
                parameter_choice: Some(pb::model_repository_parameter::ParameterChoice::Int64Param(2)),
            },
        )];
        let load = pb::RepositoryModelLoadRequest {
            model_name: "m".into(),
            parameters: parameters.into_iter().collect(),
            ..Default::default()
        };
        let refused = within("load", grpc.repository_model_load(load)).await;
        let kind =
            assert_status(refused, Code::ResourceExhausted, &["memory budget"], "RepositoryModelLoad over budget");
        assert_eq!(kind, "memory_budget_exceeded");
    });

    repo.add_model("m", &mlp_toml(&mlp(1), "[policy]\nmemory_budget = \"4GiB\""));
    let loaded = load(&server, 2);
    assert_eq!(loaded.status, 200, "a load within the budget: {}", String::from_utf8_lossy(&loaded.body));
    assert_eq!(infer(&server, "m", &input, 1).0, 2);
    drop(server);

    // The server's budget: here smaller than any version's files.
    let server = start(&repo, &["--model-control", "explicit", "--memory-budget", "1KiB"]);
    let refused = load(&server, 2);
    assert_error(&refused, 507, &["the server's memory budget is 1.0 KiB"], "a load over the server's budget");
    assert_eq!(server.status("m")["serving"], json!(null));
}

/// A JSON body and a gRPC request for one row of input `seed`.
fn bodies(seed: u64) -> (Vec<f32>, serde_json::Value, pb::ModelInferRequest) {
    let input = sample_input(SIZES[0], 1, seed);
    let grpc = pb::ModelInferRequest {
        model_name: "m".into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![1, SIZES[0] as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![input.iter().flat_map(|v| v.to_le_bytes()).collect()],
        ..Default::default()
    };
    let body = request(&input, 1);
    (input, body, grpc)
}

#[test]
fn requests_sent_while_versions_swap_under_the_resource_policy_are_all_answered() {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), "[policy]\nswap = \"resource\""));
    repo.publish_mlp("m", 1, &mlp(1));
    let server = start(&repo, &EXPLICIT);
    server.wait_settled("m", 1);
    for v in 2..=3 {
        repo.publish_mlp("m", v, &mlp(v));
    }
    // Version 4 passes verify and is refused by its golden set, after the pause.
    let input = sample_input(SIZES[0], 2, 3);
    let (model, _) = encode_mlp(&mlp(4), &Default::default());
    repo.write_files("m", 4, &[("model.onnx", &model), ("golden/a.json", &golden_json(&mlp(1), &input, 2))]);
    repo.seal("m", 4);

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for c in 0..2 {
        let (client, stop, answered) = (server.client(), Arc::clone(&stop), Arc::clone(&answered));
        clients.push(std::thread::spawn(move || {
            let (input, body, _) = bodies(10 + c);
            while !stop.load(Ordering::SeqCst) {
                let answer = client.post_json("/v2/models/m/infer", &body);
                assert_eq!(answer.status, 200, "a REST request failed: {}", answer.error());
                let json = answer.json();
                let version = version_of(&json);
                assert_close(&output_f32(&json, "output"), &mlp(version).forward(&input, 1), "REST");
                answered.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let grpc_address = server.grpc_address().to_owned();
    {
        let (stop, answered) = (Arc::clone(&stop), Arc::clone(&answered));
        clients.push(std::thread::spawn(move || {
            runtime().block_on(async {
                let mut grpc = pb::grpc_inference_service_client::GrpcInferenceServiceClient::new(
                    common::grpc::channel_to(&grpc_address).await,
                );
                let (input, _, request) = bodies(20);
                while !stop.load(Ordering::SeqCst) {
                    let answer = within("ModelInfer", grpc.model_infer(request.clone())).await;
                    let answer = answer.unwrap_or_else(|e| panic!("a gRPC request failed: {e:?}")).into_inner();
                    let version: u64 = answer.model_version.parse().unwrap();
                    let raw = &answer.raw_output_contents[0];
                    let output: Vec<f32> =
                        raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
                    assert_close(&output, &mlp(version).forward(&input, 1), "gRPC");
                    answered.fetch_add(1, Ordering::SeqCst);
                }
            })
        }));
    }
    let most_live = Arc::new(AtomicU64::new(0));
    let monitor = {
        let (client, stop, most_live) = (server.client(), Arc::clone(&stop), Arc::clone(&most_live));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let status = client.get("/baton/v1/models/m/status").json();
                let live = status["live"].as_array().map_or(0, Vec::len) as u64;
                most_live.fetch_max(live, Ordering::SeqCst);
            }
        })
    };

    let mut pauses = Vec::new();
    for v in [2, 3] {
        let answered_before = answered.load(Ordering::SeqCst);
        baton_testkit::server::eventually("requests before the swap", || {
            (answered.load(Ordering::SeqCst) > answered_before + 10).then_some(())
        });
        let report = load(&server, v);
        assert_eq!(report.status, 200, "{}", String::from_utf8_lossy(&report.body));
        let report = report.json();
        assert_eq!(report["replaced"], json!(v - 1), "{report}");
        pauses.push(report["paused_ms"].as_f64().unwrap_or_else(|| panic!("no paused_ms in {report}")));
    }
    let failed = load(&server, 4);
    assert_error(&failed, 422, &["golden"], "a candidate refused after the pause");
    let answered_before = answered.load(Ordering::SeqCst);
    baton_testkit::server::eventually("requests after the failed swap", || {
        (answered.load(Ordering::SeqCst) > answered_before + 10).then_some(())
    });
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.join().expect("a client saw a failure");
    }
    monitor.join().unwrap();

    assert_eq!(most_live.load(Ordering::SeqCst), 1, "never two versions in memory");
    let status = server.status("m");
    assert_eq!((&status["serving"], &status["previous"]), (&json!(3), &json!([])), "version 3 was loaded back");
    let text = server.metrics();
    assert_eq!(metric(&text, r#"baton_swap_pause_seconds_count{model="m"}"#), Some(3.0), "two swaps and a restore");
    assert_eq!(metric(&text, r#"baton_requests_shed_total{model="m",reason="model_paused"}"#), None);
    let rollback = server.post_json("/baton/v1/models/m/rollback", &json!({}));
    assert_error(&rollback, 409, &["no previous version"], "no version is kept under the resource policy");
    eprintln!(
        "resource pauses of the {SIZES:?} MLP: {pauses:?} ms; {} requests answered",
        answered.load(Ordering::SeqCst)
    );
}
