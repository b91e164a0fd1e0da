//! The budget of request bytes in flight, black box: the real binary, real
//! ONNX Runtime, a model wide enough that one request carries 16 MiB.
//!
//! - Uploads that have announced their length hold its room in the budget
//!   before their first byte is read; while they do, a large request is
//!   refused at once (503 over REST, UNAVAILABLE over gRPC) and small ones
//!   pass.
//! - Many large requests at once, binary or JSON, keep the process's peak
//!   memory within the budget plus a stated slack, whatever their number.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;

use baton_core::tensors::tensor::Tensor;
use baton_protocol::grpc::pb;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::{Answer, Client, PATIENCE, Server, eventually, metric};
use common::{binary_request, start};
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use pb::model_infer_request::InferInputTensor;

/// Inputs per row: a row is 64 KiB of FP32.
const WIDTH: usize = 16 * 1024;
/// Rows of a large request: 256 rows are 16 MiB.
const LARGE_ROWS: usize = 256;
const MIB: u64 = 1 << 20;

/// A repository with `wide`, a one-layer MLP of [`WIDTH`] inputs.
fn wide_repo() -> TestRepo {
    let repo = TestRepo::new();
    let mlp = Mlp::new(&[WIDTH, 2], 7);
    repo.add_model("wide", &mlp_toml(&mlp, "[warmup]\nbatch_sizes = [1, 8]\n[engine]\nsessions = 2"));
    repo.publish_mlp("wide", 1, &mlp);
    repo
}

/// A binary-data request of `rows` rows: the body and its header length.
fn request(rows: usize) -> (Vec<u8>, String) {
    let input = Tensor::from_f32("input", vec![rows as i64, WIDTH as i64], &sample_input(WIDTH, rows, rows as u64));
    binary_request(&[input], &[])
}

fn post(client: &Client, rows: usize) -> Answer {
    let (body, length) = request(rows);
    let headers = [("content-type", "application/octet-stream"), ("inference-header-content-length", &length)];
    client.post_raw("/v2/models/wide/infer", &body, &headers)
}

/// Opens a connection and sends the head of an inference request that
/// announces `length` bytes of body (plus `extra` header lines), and `sent`
/// of them.
fn announce(server: &Server, length: usize, extra: &str, sent: usize) -> TcpStream {
    let address = server.base().trim_start_matches("http://").to_owned();
    let mut stream = TcpStream::connect(address).expect("connecting to baton");
    let head = format!(
        "POST /v2/models/wide/infer HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {length}\r\n{extra}\r\n"
    );
    stream.write_all(head.as_bytes()).expect("writing a request head");
    stream.write_all(&vec![b' '; sent]).expect("writing part of a body");
    stream
}

/// Reads an answer's head from a raw connection: the status and the head.
fn answer_head(stream: &mut TcpStream) -> (u16, String) {
    stream.set_read_timeout(Some(PATIENCE)).expect("a read timeout");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).expect("reading an answer"), 1, "closed before answering");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).expect("an ASCII head").to_ascii_lowercase();
    (head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("a status"), head)
}

fn memory_used(server: &Server) -> f64 {
    metric(&server.metrics(), "baton_request_memory_bytes").expect("the request memory gauge")
}

fn grpc_request(rows: usize) -> pb::ModelInferRequest {
    let input = sample_input(WIDTH, rows, 3);
    pb::ModelInferRequest {
        model_name: "wide".into(),
        inputs: vec![InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![rows as i64, WIDTH as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![input.iter().flat_map(|v| v.to_le_bytes()).collect()],
        ..Default::default()
    }
}

#[test]
fn while_uploads_hold_the_budget_large_requests_are_refused_and_small_ones_pass() {
    let repo = wide_repo();
    let server = start(&repo, &["--request-memory-budget", "40MiB", "--max-request-bytes", "32MiB"]);
    server.wait_ready();
    let large = request(LARGE_ROWS).0.len();

    // Two uploads announce 16 MiB each and send almost nothing: their room
    // is held before a byte of it is read.
    let held: Vec<TcpStream> = (0..2).map(|_| announce(&server, large, "", 10)).collect();
    eventually("the two uploads to hold their room", || (memory_used(&server) >= (2 * large) as f64).then_some(()));

    // A third, waiting to be told to send its body, is refused instead.
    let mut third = announce(&server, large, "expect: 100-continue\r\n", 0);
    let (status, head) = answer_head(&mut third);
    assert_eq!(status, 503, "{head}");
    assert!(head.contains("retry-after: 1") && head.contains("connection: close"), "{head}");

    // A small request still passes, and so does a small one over gRPC,
    // while a large gRPC message is refused as its frames arrive.
    let small = post(&server.client(), 4);
    assert_eq!(small.status, 200, "{}", String::from_utf8_lossy(&small.body));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let channel = tonic::transport::Channel::from_shared(server.grpc_url()).unwrap().connect().await.unwrap();
        let mut grpc = GrpcInferenceServiceClient::new(channel).max_encoding_message_size(64 << 20);
        let answer = tokio::time::timeout(PATIENCE, grpc.model_infer(grpc_request(4))).await.expect("an answer");
        assert_eq!(answer.expect("a small gRPC request passes").into_inner().outputs[0].shape, [4, 2]);
        let refused = tokio::time::timeout(PATIENCE, grpc.model_infer(grpc_request(LARGE_ROWS))).await.unwrap();
        let status = refused.expect_err("a large gRPC request fit in a full budget");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert_eq!(status.metadata().get("baton-error-kind").and_then(|v| v.to_str().ok()), Some("overloaded"));
    });
    let metrics = server.metrics();
    let shed = metric(&metrics, r#"baton_requests_shed_total{model="wide",reason="memory_budget"}"#);
    assert_eq!(shed, Some(1.0), "the REST refusal is counted");
    // The gRPC call was refused while its frames arrived, before its model
    // was known, not after tonic had buffered and decoded the message.
    let shed = metric(&metrics, r#"baton_requests_shed_total{model="",reason="memory_budget"}"#);
    assert_eq!(shed, Some(1.0), "the gRPC refusal came from its frames");

    // When the uploads give up, their room comes back.
    drop(held);
    eventually("the uploads' room to come back", || (memory_used(&server) == 0.0).then_some(()));
    let answer = post(&server.client(), LARGE_ROWS);
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    common::assert_no_panic(&server);
}

/// `VmRSS` or `VmHWM` of a process, in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading /proc/PID/status");
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field} in {status}"));
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).expect("a size in kB") * 1024
}

/// A large request as a body and its headers.
struct Large {
    body: Vec<u8>,
    headers: Vec<(&'static str, String)>,
}

/// [`LARGE_ROWS`] rows in the binary extension.
fn large_binary() -> Large {
    let (body, length) = request(LARGE_ROWS);
    let headers =
        vec![("content-type", "application/octet-stream".to_owned()), ("inference-header-content-length", length)];
    Large { body, headers }
}

/// `rows` rows as JSON numbers.
fn large_json(rows: usize) -> Large {
    let body = common::request(&sample_input(WIDTH, rows, 5), rows).to_string().into_bytes();
    Large { body, headers: vec![("content-type", "application/json".to_owned())] }
}

/// The peak memory of a server while `clients` threads each send `each`
/// copies of `large` at once, above its memory just before; and how many
/// were answered 200 and 503.
fn peak_under_flood(server: &Server, large: Large, clients: usize, each: usize) -> (u64, usize, usize) {
    let pid = server.pid();
    // Resets the peak (VmHWM) to the present resident size.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("resetting VmHWM");
    let before = status_bytes(pid, "VmRSS");
    let large = std::sync::Arc::new(large);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (client, large) = (server.client(), std::sync::Arc::clone(&large));
            std::thread::spawn(move || {
                let headers: Vec<(&str, &str)> = large.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                (0..each)
                    .map(|_| client.post_raw("/v2/models/wide/infer", &large.body, &headers).status)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let statuses: Vec<u16> = threads.into_iter().flat_map(|t| t.join().expect("a client thread")).collect();
    let unexpected: Vec<&u16> = statuses.iter().filter(|s| **s != 200 && **s != 503).collect();
    assert!(unexpected.is_empty(), "answers other than 200 and 503: {unexpected:?}");
    let peak = status_bytes(pid, "VmHWM");
    let count = |code| statuses.iter().filter(|s| **s == code).count();
    (peak.saturating_sub(before), count(200), count(503))
}

#[test]
fn many_large_requests_at_once_stay_within_the_budget() {
    let repo = wide_repo();
    let budget = 64 * MIB;
    let server = start(&repo, &["--request-memory-budget", "64MiB", "--max-request-bytes", "32MiB"]);
    server.wait_ready();
    let request_bytes = request(LARGE_ROWS).0.len() as u64;
    let (rise, ok, shed) = peak_under_flood(&server, large_binary(), 12, 3);
    // What the budget does not count, at most: ONNX Runtime's own copy of
    // the input of each inference running (one per session, two
    // sessions), and 16 MiB for the rest (connection buffers, thread
    // stacks, allocator slack).
    let slack = 2 * request_bytes + 16 * MIB;
    assert_within(&server, (rise, ok, shed), budget, slack);
    // The server still answers.
    assert_eq!(post(&server.client(), 1).status, 200);
}

/// Checks a flood's outcome: some large requests passed, the peak rose at
/// most the budget plus `slack`, and every request gave its room back.
fn assert_within(server: &Server, (rise, ok, shed): (u64, usize, usize), budget: u64, slack: u64) {
    eprintln!(
        "Peak memory rose {:.1} MiB with a {} MiB budget and {:.1} MiB of slack; {ok} answered, {shed} shed.",
        rise as f64 / MIB as f64,
        budget / MIB,
        slack as f64 / MIB as f64
    );
    assert!(ok > 0, "no large request passed");
    assert!(rise <= budget + slack, "peak memory rose {rise} bytes, over the budget {budget} + slack {slack}");
    assert_eq!(memory_used(server), 0.0, "every request gave its room back");
}

/// JSON bodies are checked and their tensors' room reserved before their
/// data is decoded, straight into the tensors: a flood of them stays within
/// the budget with the same slack as binary ones. A decoder that built a
/// tree of the values first would hold several times each body meanwhile.
#[test]
fn many_large_json_requests_at_once_stay_within_the_budget() {
    let repo = wide_repo();
    let budget = 64 * MIB;
    let server = start(&repo, &["--request-memory-budget", "64MiB", "--max-request-bytes", "32MiB"]);
    server.wait_ready();
    let rows = 64;
    let large = large_json(rows);
    let tensor_bytes = (rows * WIDTH * 4) as u64;
    eprintln!(
        "Each JSON request is {:.1} MiB for {:.1} MiB of tensor.",
        large.body.len() as f64 / MIB as f64,
        tensor_bytes as f64 / MIB as f64
    );
    let (rise, ok, shed) = peak_under_flood(&server, large, 12, 2);
    // As for binary requests: ONNX Runtime's copy of each running input,
    // and 16 MiB for the rest.
    let slack = 2 * tensor_bytes + 16 * MIB;
    assert_within(&server, (rise, ok, shed), budget, slack);
}
