//! The gRPC front end, black box: the real binary with `--grpc 127.0.0.1:0`
//! and the client generated from baton's own `.proto` files. Health,
//! metadata, Triton's model configuration, inference with typed and raw
//! contents (checked against `Mlp::forward`), requested outputs, error codes
//! and messages, streaming inference across a swap, the repository
//! extension, statistics, the event stream, and shutdown.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use baton_testkit::onnx::sample_input;
use baton_testkit::repo::{Damage, TestRepo};
use baton_testkit::server::{Server, eventually};
use common::grpc::{assert_status, channel, client, runtime, within};
use common::{SIZES, assert_close, mlp, repo_with, start};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Channel;

use baton_protocol::grpc::{pb, pb_baton};

use pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use pb::model_repository_parameter::ParameterChoice;
use pb::*;
use pb_baton::management_client::ManagementClient;

/// Starts the server and waits until it is ready and the model's first
/// load has finished entirely: the server turns ready at the commit, while
/// the load still drains, and another load started then would be refused
/// as `load_in_progress`.
fn start_settled(repo: &TestRepo, model: &str, args: &[&str]) -> Server {
    let server = start(repo, args);
    server.wait_ready();
    eventually(&format!("{model}'s first load to finish"), || {
        let status = server.status(model);
        (status["busy"] == false && status["last"]["operation"] == "load").then_some(())
    });
    server
}

fn fp32_input(name: &str, input: &[f32], batch: usize) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: "FP32".into(),
        shape: vec![batch as i64, (input.len() / batch) as i64],
        contents: Some(InferTensorContents { fp32_contents: input.to_vec(), ..Default::default() }),
        ..Default::default()
    }
}

/// A typed-contents request for `model` with one FP32 input named `input`.
fn typed_request(model: &str, input: &[f32], batch: usize) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        id: "typed".into(),
        inputs: vec![fp32_input("input", input, batch)],
        ..Default::default()
    }
}

/// The same request with raw contents.
fn raw_request(model: &str, input: &[f32], batch: usize) -> ModelInferRequest {
    let mut request = typed_request(model, input, batch);
    request.id = "raw".into();
    request.inputs[0].contents = None;
    request.raw_input_contents = vec![input.iter().flat_map(|v| v.to_le_bytes()).collect()];
    request
}

/// The `output` tensor of a response, from typed or raw contents.
fn output(response: &ModelInferResponse) -> Vec<f32> {
    let index = response.outputs.iter().position(|o| o.name == "output").expect("an output named 'output'");
    match response.raw_output_contents.get(index) {
        Some(raw) => raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        None => response.outputs[index].contents.as_ref().expect("typed contents").fp32_contents.clone(),
    }
}

fn version_param(version: i64) -> HashMap<String, ModelRepositoryParameter> {
    HashMap::from([(
        "version".to_owned(),
        ModelRepositoryParameter { parameter_choice: Some(ParameterChoice::Int64Param(version)) },
    )])
}

fn load_request(model: &str, version: Option<i64>) -> RepositoryModelLoadRequest {
    RepositoryModelLoadRequest {
        model_name: model.into(),
        parameters: version.map(version_param).unwrap_or_default(),
        ..Default::default()
    }
}

#[test]
fn health_metadata_and_model_config() {
    let repo = repo_with("ranker", &[1], "max_batch_size = 16\n[warmup]\nbatch_sizes = [1]");
    let server = start(&repo, &["--grpc", "127.0.0.1:0"]);
    assert!(server.grpc_address().starts_with("127.0.0.1:"), "{}", server.grpc_address());
    server.wait_ready();
    runtime().block_on(async {
        let mut c = client(&server).await;
        assert!(within("live", c.server_live(ServerLiveRequest {})).await.unwrap().into_inner().live);
        assert!(within("ready", c.server_ready(ServerReadyRequest {})).await.unwrap().into_inner().ready);

        let meta = within("server metadata", c.server_metadata(ServerMetadataRequest {})).await.unwrap().into_inner();
        assert_eq!(meta.name, "baton");
        assert!(!meta.version.is_empty());
        for extension in ["model_repository", "model_configuration", "statistics"] {
            assert!(meta.extensions.iter().any(|e| e == extension), "{extension} missing from {meta:?}");
        }

        let ready = |name: &str, version: &str| ModelReadyRequest { name: name.into(), version: version.into() };
        assert!(within("model ready", c.model_ready(ready("ranker", ""))).await.unwrap().into_inner().ready);
        assert!(within("v1 ready", c.model_ready(ready("ranker", "1"))).await.unwrap().into_inner().ready);
        assert!(!within("v7 ready", c.model_ready(ready("ranker", "7"))).await.unwrap().into_inner().ready);
        // Unknown is not ready (tritonclient's is_model_ready expects a bool).
        assert!(!within("unknown ready", c.model_ready(ready("nope", ""))).await.unwrap().into_inner().ready);
        let bad = within("bad version", c.model_ready(ready("ranker", "x"))).await;
        assert_status(bad, Code::InvalidArgument, &["'x' is not a version number"], "ModelReady of a bad version");

        let request = ModelMetadataRequest { name: "ranker".into(), version: String::new() };
        let meta = within("model metadata", c.model_metadata(request)).await.unwrap().into_inner();
        assert_eq!(meta.name, "ranker");
        assert_eq!(meta.versions, ["1"]);
        assert_eq!(meta.platform, "onnxruntime_onnx");
        assert_eq!(meta.inputs.len(), 1);
        assert_eq!((meta.inputs[0].name.as_str(), meta.inputs[0].datatype.as_str()), ("input", "FP32"));
        assert_eq!(meta.inputs[0].shape, [-1, SIZES[0] as i64]);
        assert_eq!((meta.outputs[0].name.as_str(), meta.outputs[0].shape.clone()), ("output", vec![-1, 2]));

        let request = ModelConfigRequest { name: "ranker".into(), version: String::new() };
        let config = within("model config", c.model_config(request)).await.unwrap().into_inner();
        let config = config.config.expect("a config");
        assert_eq!(config.name, "ranker");
        assert_eq!(config.max_batch_size, 16);
        assert_eq!((config.platform.as_str(), config.backend.as_str()), ("onnxruntime_onnx", "onnxruntime"));
        assert_eq!(config.input.len(), 1);
        assert_eq!(config.input[0].name, "input");
        assert_eq!(config.input[0].data_type, DataType::TypeFp32 as i32);
        assert_eq!(config.input[0].dims, [SIZES[0] as i64], "dims leave out the batch dimension");
        assert_eq!(config.output[0].dims, [2]);
        assert_eq!(config.model_transaction_policy.map(|p| p.decoupled), Some(false));
        assert_eq!(config.instance_group.len(), 1);

        let request = ModelConfigRequest { name: "nope".into(), version: String::new() };
        assert_status(within("config", c.model_config(request)).await, Code::NotFound, &["'nope'"], "config");
    });
}

#[test]
fn typed_and_raw_inference_match_the_model() {
    let repo = repo_with("ranker", &[1], "[warmup]\nbatch_sizes = [1]");
    let server = start(&repo, &["--grpc", "127.0.0.1:0"]);
    server.wait_ready();
    let batch = 3;
    let input = sample_input(SIZES[0], batch, 11);
    let want = mlp(1).forward(&input, batch);
    runtime().block_on(async {
        let mut c = client(&server).await;

        let typed = within("typed", c.model_infer(typed_request("ranker", &input, batch))).await.unwrap().into_inner();
        assert_eq!(
            (typed.model_name.as_str(), typed.model_version.as_str(), typed.id.as_str()),
            ("ranker", "1", "typed")
        );
        assert!(typed.raw_output_contents.is_empty(), "a typed request gets typed contents");
        assert_eq!(typed.outputs[0].datatype, "FP32");
        assert_eq!(typed.outputs[0].shape, [batch as i64, 2]);
        assert_close(&output(&typed), &want, "typed contents");

        let raw = within("raw", c.model_infer(raw_request("ranker", &input, batch))).await.unwrap().into_inner();
        assert_eq!(raw.id, "raw");
        assert_eq!(raw.raw_output_contents.len(), 1, "a raw request gets raw_output_contents");
        assert!(raw.outputs[0].contents.is_none(), "no typed contents beside raw ones");
        assert_close(&output(&raw), &want, "raw contents");

        // A named version answers too.
        let mut named = raw_request("ranker", &input, batch);
        named.model_version = "1".into();
        let named = within("v1", c.model_infer(named)).await.unwrap().into_inner();
        assert_close(&output(&named), &want, "version 1 by name");

        // Requested outputs: the named one, and a clear error for an unknown one.
        let mut wanted = typed_request("ranker", &input, batch);
        wanted.outputs = vec![InferRequestedOutputTensor { name: "output".into(), ..Default::default() }];
        let selected = within("selected", c.model_infer(wanted.clone())).await.unwrap().into_inner();
        assert_eq!(selected.outputs.len(), 1);
        assert_close(&output(&selected), &want, "requested output");
        wanted.outputs.insert(0, InferRequestedOutputTensor { name: "scores".into(), ..Default::default() });
        let result = within("unknown output", c.model_infer(wanted)).await;
        let kind = assert_status(
            result,
            Code::InvalidArgument,
            &["unknown output 'scores'", "\"output\""],
            "an unknown requested output",
        );
        assert_eq!(kind, "unknown_output");
    });
}

#[test]
fn errors_have_the_right_codes_and_say_what_was_wrong() {
    let repo = repo_with("ranker", &[1], "max_batch_size = 4\n[warmup]\nbatch_sizes = [1]");
    let server = start(&repo, &["--grpc", "127.0.0.1:0"]);
    server.wait_ready();
    let input = sample_input(SIZES[0], 1, 3);
    runtime().block_on(async {
        let mut c = client(&server).await;

        let result = within("unknown model", c.model_infer(typed_request("nope", &input, 1))).await;
        let kind = assert_status(result, Code::NotFound, &["unknown model 'nope'"], "unknown model");
        assert_eq!(kind, "model_not_found");

        let mut version = typed_request("ranker", &input, 1);
        version.model_version = "9".into();
        let result = within("unknown version", c.model_infer(version.clone())).await;
        assert_status(result, Code::NotFound, &["9"], "a version that is not loaded");
        version.model_version = "latest".into();
        let result = within("bad version", c.model_infer(version)).await;
        assert_status(result, Code::InvalidArgument, &["'latest' is not a version number"], "a bad version");

        // Wrong shape: 9 features where the model takes 8.
        let wide = sample_input(SIZES[0] + 1, 1, 4);
        let result = within("wrong shape", c.model_infer(typed_request("ranker", &wide, 1))).await;
        assert_status(
            result,
            Code::InvalidArgument,
            &["input 'input'", "expected shape [-1, 8], got [1, 9]"],
            "wrong shape",
        );

        // Element count that disagrees with the shape, typed and raw.
        let mut short = typed_request("ranker", &input, 1);
        short.inputs[0].shape = vec![2, SIZES[0] as i64];
        let result = within("short typed", c.model_infer(short)).await;
        assert_status(
            result,
            Code::InvalidArgument,
            &["input 'input'", "needs 16 FP32 elements, fp32_contents holds 8"],
            "too few typed elements",
        );
        let mut short = raw_request("ranker", &input, 1);
        short.raw_input_contents[0].pop();
        let result = within("short raw", c.model_infer(short)).await;
        assert_status(result, Code::InvalidArgument, &["input 'input'", "needs 32 bytes", "31"], "short raw");

        // Wrong datatype, wrong field, unknown input name, batch too large.
        let mut wrong = typed_request("ranker", &input, 1);
        wrong.inputs[0].datatype = "FP64".into();
        let result = within("wrong field", c.model_infer(wrong)).await;
        assert_status(
            result,
            Code::InvalidArgument,
            &["input 'input'", "fp64_contents"],
            "contents in the wrong field",
        );
        let mut renamed = typed_request("ranker", &input, 1);
        renamed.inputs[0].name = "features".into();
        let result = within("renamed", c.model_infer(renamed)).await;
        assert_status(result, Code::InvalidArgument, &["missing input 'input'"], "unknown input");
        let big = sample_input(SIZES[0], 5, 5);
        let result = within("batch", c.model_infer(typed_request("ranker", &big, 5))).await;
        assert_status(result, Code::InvalidArgument, &["batch size 5", "max_batch_size 4"], "batch too large");

        // Metadata of an unknown model.
        let request = ModelMetadataRequest { name: "nope".into(), version: String::new() };
        assert_status(within("metadata", c.model_metadata(request)).await, Code::NotFound, &["'nope'"], "metadata");
    });
}

#[test]
fn oversized_requests_are_resource_exhausted() {
    let repo = repo_with("ranker", &[1], "[warmup]\nbatch_sizes = [1]");
    let server = start(&repo, &["--grpc", "127.0.0.1:0", "--max-request-bytes", "4096"]);
    server.wait_ready();
    let batch = 256; // 8 KiB of features
    let input = sample_input(SIZES[0], batch, 6);
    runtime().block_on(async {
        let mut c = client(&server).await;
        let result = within("too large", c.model_infer(raw_request("ranker", &input, batch))).await;
        let kind = assert_status(result, Code::ResourceExhausted, &["4096"], "a request over --max-request-bytes");
        assert_eq!(kind, "too_large");
        // Small requests still pass.
        let small = sample_input(SIZES[0], 2, 6);
        let answer = within("small", c.model_infer(raw_request("ranker", &small, 2))).await.unwrap().into_inner();
        assert_close(&output(&answer), &mlp(1).forward(&small, 2), "a small request");

        // On a stream, too: the stream ends with the same code.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut responses = within("stream", c.model_stream_infer(ReceiverStream::new(rx))).await.unwrap().into_inner();
        tx.send(raw_request("ranker", &input, batch)).await.unwrap();
        let result = within("stream answer", responses.message()).await;
        assert_status(result, Code::ResourceExhausted, &["4096"], "an oversized message on a stream");

        // Under the limit, but 2,000 empty inputs would decode to far more
        // memory than their 4,000 bytes: refused before prost builds them.
        let empty = ModelInferRequest {
            model_name: "ranker".into(),
            inputs: vec![InferInputTensor::default(); 2000],
            ..ModelInferRequest::default()
        };
        let result = within("empty inputs", c.model_infer(empty)).await;
        let kind = assert_status(result, Code::ResourceExhausted, &["more than 64 times its size"], "empty inputs");
        assert_eq!(kind, "too_large");
    });
}

/// A stream stays open across a swap: the first request is answered by
/// version 1; version 2 is published and loaded through the RPC; the second
/// request on the same stream is answered by version 2, because each request
/// pins the routing snapshot of the moment it arrives.
#[test]
fn streaming_inference_pins_each_request_when_it_arrives() {
    let repo = repo_with("ranker", &[1], "[warmup]\nbatch_sizes = [1]");
    // No watching: the RPC, not the watcher, loads version 2.
    let server = start_settled(&repo, "ranker", &["--grpc", "127.0.0.1:0", "--no-watch"]);
    let batch = 2;
    let input = sample_input(SIZES[0], batch, 21);
    runtime().block_on(async {
        let mut c = client(&server).await;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut responses = within("stream", c.model_stream_infer(ReceiverStream::new(rx))).await.unwrap().into_inner();

        tx.send(raw_request("ranker", &input, batch)).await.unwrap();
        let first = within("first answer", responses.message()).await.unwrap().expect("a first answer");
        assert_eq!(first.error_message, "");
        let first = first.infer_response.expect("a response");
        assert_eq!(first.model_version, "1");
        assert_close(&output(&first), &mlp(1).forward(&input, batch), "first answer, version 1");

        repo.publish_mlp("ranker", 2, &mlp(2));
        within("load", c.repository_model_load(load_request("ranker", None))).await.expect("loading version 2");

        tx.send(typed_request("ranker", &input, batch)).await.unwrap();
        let second = within("second answer", responses.message()).await.unwrap().expect("a second answer");
        assert_eq!(second.error_message, "");
        let second = second.infer_response.expect("a response");
        assert_eq!(second.model_version, "2", "the request after the swap pins version 2");
        assert_close(&output(&second), &mlp(2).forward(&input, batch), "second answer, version 2");

        // An error answers that request and the stream goes on.
        tx.send(typed_request("nope", &input, batch)).await.unwrap();
        let failed = within("error answer", responses.message()).await.unwrap().expect("an error answer");
        assert!(failed.error_message.contains("unknown model 'nope'"), "{failed:?}");
        tx.send(typed_request("ranker", &input, batch)).await.unwrap();
        let third = within("third answer", responses.message()).await.unwrap().expect("a third answer");
        assert_eq!(third.infer_response.expect("a response").model_version, "2");

        drop(tx);
        assert!(within("end", responses.message()).await.unwrap().is_none(), "the stream ends with the requests");
    });
}

#[test]
fn repository_index_load_and_unload() {
    let repo = repo_with("ranker", &[1], "[warmup]\nbatch_sizes = [1]");
    let server = start_settled(&repo, "ranker", &["--grpc", "127.0.0.1:0", "--no-watch"]);
    let rows = |index: RepositoryIndexResponse| -> Vec<(String, String, String)> {
        index.models.into_iter().map(|m| (m.name, m.version, m.state)).collect()
    };
    let row = |v: &str, state: &str| ("ranker".to_owned(), v.to_owned(), state.to_owned());
    runtime().block_on(async {
        let mut c = client(&server).await;
        let index = |ready| RepositoryIndexRequest { repository_name: String::new(), ready };
        let all = within("index", c.repository_index(index(false))).await.unwrap().into_inner();
        assert_eq!(rows(all), [row("1", "READY")]);

        repo.publish_mlp("ranker", 2, &mlp(2));
        repo.publish_mlp("ranker", 3, &mlp(3));
        let all = within("index", c.repository_index(index(false))).await.unwrap().into_inner();
        assert_eq!(rows(all), [row("1", "READY"), row("2", "UNAVAILABLE"), row("3", "UNAVAILABLE")]);

        within("load v2", c.repository_model_load(load_request("ranker", Some(2)))).await.expect("loading v2");
        let ready = within("index", c.repository_index(index(true))).await.unwrap().into_inner();
        assert_eq!(rows(ready), [row("1", "READY"), row("2", "READY")], "v1 kept for rollback, v2 serving");
        let input = sample_input(SIZES[0], 1, 2);
        let answer = within("infer", c.model_infer(raw_request("ranker", &input, 1))).await.unwrap().into_inner();
        assert_eq!(answer.model_version, "2");

        // A damaged version is refused by a stage; version 2 keeps serving.
        repo.damage("ranker", 3, Damage::FlipByte);
        let result = within("load v3", c.repository_model_load(load_request("ranker", Some(3)))).await;
        let kind = assert_status(result, Code::FailedPrecondition, &["SHA-256"], "a damaged version");
        assert_eq!(kind, "verify_failed");
        let all = within("index", c.repository_index(index(false))).await.unwrap().into_inner();
        let states = rows(all);
        assert!(states.contains(&row("3", "FAILED")) && states.contains(&row("2", "READY")), "{states:?}");

        let result = within("load unknown", c.repository_model_load(load_request("nope", None))).await;
        assert_status(result, Code::NotFound, &["nope"], "loading an unknown model");
        let mut bad = load_request("ranker", None);
        bad.parameters.insert("config".into(), ModelRepositoryParameter::default());
        let result = within("bad parameter", c.repository_model_load(bad)).await;
        assert_status(result, Code::InvalidArgument, &["'config'"], "an unsupported load parameter");

        let unload = RepositoryModelUnloadRequest { model_name: "ranker".into(), ..Default::default() };
        within("unload", c.repository_model_unload(unload.clone())).await.expect("unloading");
        let request = ModelReadyRequest { name: "ranker".into(), version: String::new() };
        assert!(!within("ready", c.model_ready(request)).await.unwrap().into_inner().ready);
        let result = within("infer unloaded", c.model_infer(raw_request("ranker", &input, 1))).await;
        assert_status(result, Code::Unavailable, &["not ready"], "inference on an unloaded model");
        assert!(!within("server ready", c.server_ready(ServerReadyRequest {})).await.unwrap().into_inner().ready);
        within("unload again", c.repository_model_unload(unload)).await.expect("unloading twice is fine");
        let ready = within("index", c.repository_index(index(true))).await.unwrap().into_inner();
        assert!(ready.models.is_empty(), "{ready:?}");
    });
}

#[test]
fn statistics_count_requests_from_both_front_ends() {
    let repo = repo_with("ranker", &[1], "[warmup]\nbatch_sizes = [1]");
    let server = start_settled(&repo, "ranker", &["--grpc", "127.0.0.1:0", "--no-watch"]);
    let input = sample_input(SIZES[0], 2, 8);
    // One request over REST, batch 2.
    let (version, _) = common::infer(&server, "ranker", &input, 2);
    assert_eq!(version, 1);
    runtime().block_on(async {
        let mut c = client(&server).await;
        let request = |name: &str| ModelStatisticsRequest { name: name.into(), version: String::new() };
        let before = within("stats", c.model_statistics(request("ranker"))).await.unwrap().into_inner();
        assert_eq!(before.model_stats.len(), 1);
        assert_eq!(before.model_stats[0].inference_stats.as_ref().unwrap().success.unwrap().count, 1);

        for _ in 0..3 {
            within("infer", c.model_infer(raw_request("ranker", &input, 2))).await.expect("an inference");
        }
        let wide = sample_input(SIZES[0] + 1, 1, 4);
        within("failing", c.model_infer(typed_request("ranker", &wide, 1))).await.expect_err("a wrong shape");

        let stats = within("stats", c.model_statistics(request("ranker"))).await.unwrap().into_inner();
        let s = &stats.model_stats[0];
        assert_eq!((s.name.as_str(), s.version.as_str()), ("ranker", "1"));
        let infer = s.inference_stats.expect("inference stats");
        let success = infer.success.expect("success");
        assert_eq!(success.count, 4, "one REST and three gRPC requests");
        assert!(success.ns > 0);
        assert_eq!(infer.fail.expect("fail").count, 1);
        assert_eq!(s.inference_count, 8, "each element of a batch counts");
        assert_eq!(s.execution_count, 4);
        assert!(s.last_inference > 0);
        assert_eq!(infer.compute_infer.expect("compute_infer").count, 4);
        assert!(s.memory_usage.iter().all(|m| m.r#type == "CPU"), "{:?}", s.memory_usage);

        let all = within("all stats", c.model_statistics(request(""))).await.unwrap().into_inner();
        assert_eq!(all.model_stats.len(), 1);
        let result = within("unknown", c.model_statistics(request("nope"))).await;
        assert_status(result, Code::NotFound, &["'nope'"], "statistics of an unknown model");
    });
}

#[test]
fn the_event_stream_shows_a_load_and_management_reports_it() {
    let repo = repo_with("ranker", &[1], "[warmup]\nbatch_sizes = [1]");
    let server = start_settled(&repo, "ranker", &["--grpc", "127.0.0.1:0", "--no-watch"]);
    runtime().block_on(async {
        let mut m = ManagementClient::new(channel(&server).await);
        // The subscription is in place once the call has returned.
        let request = pb_baton::EventsRequest { model: "ranker".into() };
        let mut events = within("events", m.events(request)).await.unwrap().into_inner();

        repo.publish_mlp("ranker", 2, &mlp(2));
        let load = pb_baton::LoadRequest { model: "ranker".into(), version: None };
        let report = within("load", m.load(load)).await.expect("loading version 2").into_inner();
        assert_eq!((report.operation.as_str(), report.version, report.replaced), ("load", Some(2), Some(1)));
        let json: serde_json::Value = serde_json::from_str(&report.json).expect("report JSON");
        assert!(json["stages"].as_array().is_some_and(|s| s.len() >= 6), "{json}");

        // The tail of version 1's load (its drain and `finished`) may still
        // come first: the server turns ready at the commit. Version 2's load
        // starts with the first transition to LOADING.
        let mut states: Vec<String> = Vec::new();
        loop {
            let event = within("an event", events.message()).await.expect("the stream").expect("an event");
            assert_eq!(event.model, "ranker");
            assert!(event.at > 1.0e9, "a Unix timestamp: {}", event.at);
            let json: serde_json::Value = serde_json::from_str(&event.json).expect("event JSON");
            assert_eq!(json["event"], event.kind.as_str());
            if event.kind == "transition" && (!states.is_empty() || json["to"] == "LOADING") {
                states.push(json["to"].as_str().expect("a state").to_owned());
            }
            if event.kind == "finished" && event.version == Some(2) {
                break;
            }
        }
        for state in ["LOADING", "WARMING", "SWAPPING", "DRAINING", "READY"] {
            assert!(states.iter().any(|s| s == state), "no transition to {state} in {states:?}");
        }

        let status = pb_baton::StatusRequest { model: "ranker".into() };
        let status = within("status", m.status(status)).await.unwrap().into_inner();
        assert!(status.ready && !status.draining);
        let json: serde_json::Value = serde_json::from_str(&status.json).expect("status JSON");
        assert_eq!(json["serving"], 2);

        let report = within("rollback", m.rollback(pb_baton::RollbackRequest { model: "ranker".into() }))
            .await
            .expect("rolling back")
            .into_inner();
        assert_eq!((report.operation.as_str(), report.version), ("rollback", Some(1)));
        let result = within("rollback again", m.rollback(pb_baton::RollbackRequest { model: "ranker".into() })).await;
        assert_status(result, Code::Aborted, &[], "a rollback with nothing to roll back to");
        let result = within("status", m.status(pb_baton::StatusRequest { model: "nope".into() })).await;
        assert_status(result, Code::NotFound, &["'nope'"], "status of an unknown model");
    });
}

/// SIGTERM: open streams end (events cleanly, inference with UNAVAILABLE),
/// and the process exits 0.
#[test]
fn shutdown_ends_streams_and_exits_zero() {
    let repo = repo_with("ranker", &[1], "[warmup]\nbatch_sizes = [1]");
    let mut server =
        start_settled(&repo, "ranker", &["--grpc", "127.0.0.1:0", "--no-watch", "--shutdown-timeout", "60"]);
    let input = sample_input(SIZES[0], 1, 9);
    let rt = runtime();
    let (mut events, mut responses, tx) = rt.block_on(async {
        let mut m = ManagementClient::new(channel(&server).await);
        let events = within("events", m.events(pb_baton::EventsRequest::default())).await.unwrap().into_inner();
        let mut c = client(&server).await;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut responses = within("stream", c.model_stream_infer(ReceiverStream::new(rx))).await.unwrap().into_inner();
        tx.send(raw_request("ranker", &input, 1)).await.unwrap();
        let first = within("answer", responses.message()).await.unwrap().expect("an answer");
        assert_eq!(first.infer_response.expect("a response").model_version, "1");
        (events, responses, tx)
    });

    server.signal_terminate();
    rt.block_on(async {
        loop {
            match within("the event stream to end", events.message()).await {
                Ok(None) => break,
                Ok(Some(_)) => continue,
                Err(status) => panic!("the event stream should end cleanly: {status:?}"),
            }
        }
        let result = within("the inference stream to end", responses.message()).await;
        assert_status(result, Code::Unavailable, &["shutting down"], "an open inference stream at shutdown");
    });
    drop(tx);
    let status = server.wait_exit();
    assert!(status.success(), "baton exited with {status}");
    // Nothing listens any more.
    let refused = rt.block_on(async {
        let endpoint = Channel::from_shared(server.grpc_url()).unwrap().connect_timeout(Duration::from_secs(5));
        endpoint.connect().await
    });
    assert!(refused.is_err(), "the gRPC port still accepts connections");
}

/// `Server::start` also works without `--grpc`: it picks a free port itself.
#[test]
fn the_grpc_address_is_the_second_stdout_line_even_by_default() {
    let repo = TestRepo::new();
    let server = start(&repo, &[]);
    let (rest, grpc) = (server.base().trim_start_matches("http://").to_owned(), server.grpc_address().to_owned());
    assert_ne!(rest, grpc);
    runtime().block_on(async {
        let mut c = client(&server).await;
        assert!(within("live", c.server_live(ServerLiveRequest {})).await.unwrap().into_inner().live);
    });
}
