//! Admission control, deadlines and engine panics, on the real server run
//! in-process on the test kit's fake backend, whose inferences can be held
//! at a gate: real HTTP and gRPC on loopback ports, real session threads,
//! real queues. (The binary has only the ONNX backend, whose inferences
//! cannot be held; the rest of the server's behaviour is tested black-box.)
//!
//! The server runs on two async workers, as many as the test machine has
//! cores: with inferences held on them, nothing else would be answered.
//! Models whose inferences are held run none inline (`inline_us = 0`): the
//! fake's inferences are estimated cheap and a held one is not, and the
//! estimate is what the inline fast path must be able to trust.

use std::sync::Arc;
use std::time::Duration;

use baton_server::{InProcess, ServeArgs};
use baton_testkit::fake::{FAKE_TOML, FakeBackend, Gate};
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Answer, Client, PATIENCE, eventually, metric};
use serde_json::{Value, json};
use tonic::transport::Channel;
use tonic::{Code, Status};

use baton_protocol::grpc::pb;
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use pb::infer_parameter::ParameterChoice;
use pb::model_infer_request::InferInputTensor;
use pb::*;

type Grpc = GrpcInferenceServiceClient<Channel>;

/// A server in this process on a fake backend gated by `gate`. The gate is
/// open while the models load (so warmup passes) and closed once they
/// serve.
struct Fixture {
    server: InProcess,
    rest: Client,
    gate: Gate,
    calls: Arc<std::sync::Mutex<Vec<usize>>>,
    runtime: tokio::runtime::Runtime,
    _repo: TestRepo,
}

/// A fake model: its name, extra `model.toml` lines, and extra files of
/// its version 1.
type Model<'a> = (&'a str, &'a str, &'a [(&'a str, &'a [u8])]);

const FREE: Model = ("free", "", &[]);

fn fixture(models: &[Model], options: &[&str]) -> Fixture {
    let repo = TestRepo::new();
    for (name, extra, files) in models {
        repo.add_model(name, &format!("{FAKE_TOML}{extra}"));
        let mut all: Vec<(&str, &[u8])> = vec![("fake.txt", b"2")];
        all.extend_from_slice(files);
        repo.write_files(name, 1, &all);
        repo.seal(name, 1);
    }
    let gate = Gate::closed();
    gate.open();
    let backend = FakeBackend::gated(gate.clone());
    let calls = backend.calls();
    let root = repo.root().to_str().expect("a UTF-8 path").to_owned();
    let mut all = vec!["--repo", &root, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--no-watch"];
    all.extend_from_slice(options);
    let args = ServeArgs::from_options(all).expect("valid options");
    let server = InProcess::start(args, vec![Arc::new(backend)], 2).expect("starting the server in-process");
    let rest = Client::new(&format!("http://{}", server.http));
    eventually("the server to become ready", || (rest.get("/v2/health/ready").status == 200).then_some(()));
    for (name, ..) in models {
        eventually(&format!("{name}'s first load to finish"), || {
            let status = rest.get(&format!("/baton/v1/models/{name}/status")).json();
            (status["busy"] == false && status["serving"] == 1).then_some(())
        });
    }
    gate.close();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    Fixture { server, rest, gate, calls, runtime, _repo: repo }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Whatever a failed test left held is let go, so the server stops.
        self.gate.open();
    }
}

impl Fixture {
    fn grpc(&self) -> Grpc {
        let endpoint = Channel::from_shared(format!("http://{}", self.server.grpc)).expect("a valid URL");
        let channel = self.runtime.block_on(within("connecting", endpoint.connect())).expect("connecting over gRPC");
        GrpcInferenceServiceClient::new(channel)
    }

    fn metrics(&self) -> String {
        let answer = self.rest.get("/metrics");
        assert_eq!(answer.status, 200, "GET /metrics");
        String::from_utf8(answer.body).expect("UTF-8 metrics")
    }

    fn metric(&self, series: &str) -> f64 {
        metric(&self.metrics(), series).unwrap_or(0.0)
    }

    /// Waits until `model` holds `n` requests in its queue.
    fn until_queued(&self, model: &str, n: usize) {
        let series = format!("baton_queue_depth{{model=\"{model}\",version=\"1\",twin=\"false\"}}");
        eventually(&format!("{n} requests queued for {model}"), || (self.metric(&series) == n as f64).then_some(()));
    }

    /// The rows of the inferences the engine ran since `from`.
    fn ran_since(&self, from: usize) -> Vec<usize> {
        self.calls.lock().unwrap()[from..].to_vec()
    }
}

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, f).await.unwrap_or_else(|_| panic!("{what}: no answer within {PATIENCE:?}"))
}

/// A request of `rows` rows, each `[v, v, v, v]`, for the fake model.
fn body(rows: usize, v: f32) -> Value {
    json!({ "inputs": [{ "name": "x", "datatype": "FP32", "shape": [rows, 4], "data": vec![v; rows * 4] }] })
}

fn grpc_request(model: &str, rows: usize, v: f32) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![rows as i64, 4],
            contents: Some(InferTensorContents { fp32_contents: vec![v; rows * 4], ..Default::default() }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn infer_path(model: &str) -> String {
    format!("/v2/models/{model}/infer")
}

/// Sends a REST inference from another thread; its answer comes when the
/// gate lets it through.
fn rest_in_background(rest: &Client, model: &str, rows: usize) -> std::thread::JoinHandle<Answer> {
    let (rest, path) = (rest.clone(), infer_path(model));
    std::thread::spawn(move || rest.post_json(&path, &body(rows, 1.0)))
}

fn kind_of(status: &Status) -> &str {
    status.metadata().get("baton-error-kind").and_then(|v| v.to_str().ok()).unwrap_or_default()
}

#[test]
fn a_gated_model_sheds_at_once_while_everything_else_answers() {
    let gated: Model = ("gated", "[admission]\nmax_queue = 2\ninline_us = 0\n", &[("hold-every-infer", b"")]);
    let f = fixture(&[gated, FREE], &[]);
    let mut grpc = f.grpc();

    // The one session of `gated` is held, and its queue of two is full:
    // one request over REST, one over gRPC.
    let running = rest_in_background(&f.rest, "gated", 1);
    f.gate.wait_for_waiters(1);
    let queued_rest = rest_in_background(&f.rest, "gated", 2);
    let queued_grpc = {
        let mut grpc = grpc.clone();
        f.runtime.spawn(async move { grpc.model_infer(grpc_request("gated", 3, 1.0)).await })
    };
    f.until_queued("gated", 2);

    // More requests to it are refused at once, over both protocols…
    let shed = f.rest.post_json(&infer_path("gated"), &body(1, 1.0));
    assert_eq!(shed.status, 503, "{}", String::from_utf8_lossy(&shed.body));
    assert_eq!(shed.json()["kind"], "overloaded");
    assert_eq!(shed.header("retry-after"), Some("1"));
    let status = f.runtime.block_on(within("a shed gRPC request", grpc.model_infer(grpc_request("gated", 1, 1.0))));
    let status = status.expect_err("a request to a full version was accepted");
    assert_eq!((status.code(), kind_of(&status)), (Code::Unavailable, "overloaded"), "{status:?}");

    // …and everything else answers meanwhile: health, readiness, metrics,
    // status, the management API, and inference on another model.
    assert_eq!(f.rest.get("/v2/health/live").status, 200);
    assert_eq!(f.rest.get("/v2/health/ready").status, 200);
    // REST is refused before its body is read, gRPC when it is queued.
    assert_eq!(f.metric(r#"baton_requests_shed_total{model="gated",reason="version_full"}"#), 1.0);
    assert_eq!(f.metric(r#"baton_requests_shed_total{model="gated",reason="queue_full"}"#), 1.0);
    assert_eq!(f.metric(r#"baton_version_in_flight{model="gated",version="1",twin="false"}"#), 3.0);
    assert_eq!(f.rest.get("/baton/v1/status").status, 200);
    assert_eq!(f.rest.get("/baton/v1/models/gated/status").json()["serving"], 1);
    assert_eq!(f.rest.post_json("/v2/repository/index", &json!({})).status, 200);
    assert_eq!(f.rest.get("/baton/v1/unloads").status, 200);
    let other = f.rest.post_json(&infer_path("free"), &body(2, 3.0));
    assert_eq!(other.status, 200, "{}", String::from_utf8_lossy(&other.body));
    assert_eq!(other.json()["outputs"][0]["data"][0], 6.0);
    f.runtime.block_on(async {
        assert!(within("ServerReady", grpc.server_ready(ServerReadyRequest {})).await.unwrap().into_inner().ready);
        let answer = within("gRPC inference on another model", grpc.model_infer(grpc_request("free", 1, 2.0))).await;
        assert_eq!(answer.expect("free answers").into_inner().outputs[0].shape, [1, 4]);
    });

    // When the gate opens, what was admitted completes.
    f.gate.open();
    for (request, rows) in [(running, 1), (queued_rest, 2)] {
        let answer = request.join().expect("a client thread");
        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.json()["outputs"][0]["shape"], json!([rows, 4]));
    }
    let answer = f.runtime.block_on(within("the queued gRPC request", queued_grpc)).expect("a client task");
    assert_eq!(answer.expect("the queued gRPC request succeeds").into_inner().outputs[0].shape, [3, 4]);
    f.until_queued("gated", 0);
}

#[test]
fn a_request_whose_deadline_passes_while_queued_is_answered_then_and_never_runs() {
    let slow: Model = ("slow", "[admission]\ninline_us = 0\n", &[("hold-every-infer", b"")]);
    let f = fixture(&[slow], &[]);
    let mut grpc = f.grpc();
    let from = f.calls.lock().unwrap().len();
    let running = rest_in_background(&f.rest, "slow", 1);
    f.gate.wait_for_waiters(1);

    // Requests queue behind it with short deadlines, one per way of saying
    // so: the REST header, Triton's parameter over REST and over gRPC, and
    // gRPC's grpc-timeout.
    let header = {
        let rest = f.rest.clone();
        std::thread::spawn(move || {
            let payload = body(2, 1.0).to_string();
            let headers = [("content-type", "application/json"), ("baton-timeout-ms", "200")];
            rest.post_raw(&infer_path("slow"), payload.as_bytes(), &headers)
        })
    };
    let parameter = {
        let rest = f.rest.clone();
        let mut request = body(3, 1.0);
        request["parameters"] = json!({ "timeout": 200_000 });
        std::thread::spawn(move || rest.post_json(&infer_path("slow"), &request))
    };
    let mut with_parameter = grpc_request("slow", 4, 1.0);
    let timeout = InferParameter { parameter_choice: Some(ParameterChoice::Int64Param(200_000)) };
    with_parameter.parameters.insert("timeout".into(), timeout);
    let status = f.runtime.block_on(within("a gRPC request with a timeout", grpc.model_infer(with_parameter)));
    let status = status.expect_err("a request past its deadline succeeded");
    assert_eq!((status.code(), kind_of(&status)), (Code::DeadlineExceeded, "deadline_exceeded"), "{status:?}");
    // tonic's client keeps the deadline it sends in grpc-timeout itself and
    // gives up then (CANCELLED); the server drops the request by then too.
    let mut timed = tonic::Request::new(grpc_request("slow", 5, 1.0));
    timed.set_timeout(Duration::from_millis(200));
    let status = f.runtime.block_on(within("a gRPC request with a deadline", grpc.model_infer(timed)));
    let status = status.expect_err("a request past its deadline succeeded");
    assert!([Code::DeadlineExceeded, Code::Cancelled].contains(&status.code()), "{status:?}");
    for answer in [header.join().unwrap(), parameter.join().unwrap()] {
        assert_eq!(answer.status, 504, "{}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.json()["kind"], "deadline_exceeded");
    }

    // They left the queue when they were answered, while the engine was
    // still held, and the engine never ran them.
    f.until_queued("slow", 0);
    assert!(f.metric(r#"baton_deadline_exceeded_total{model="slow",stage="queued"}"#) >= 3.0);
    f.gate.open();
    assert_eq!(running.join().unwrap().status, 200);
    assert_eq!(f.ran_since(from), [1], "only the request without a deadline ran");
}

#[test]
fn an_engine_panic_fails_its_request_and_the_session_serves_the_next() {
    let fragile: Model = ("fragile", "", &[("panic-on", b"666")]);
    let f = fixture(&[fragile], &[]);
    f.gate.open();
    let mut grpc = f.grpc();
    let failed = f.rest.post_json(&infer_path("fragile"), &body(1, 666.0));
    assert_eq!(failed.status, 500, "{}", String::from_utf8_lossy(&failed.body));
    assert_eq!(failed.json()["kind"], "engine_panicked");
    // The fake model has one instance: the same session thread and
    // session answer the next requests.
    let next = f.rest.post_json(&infer_path("fragile"), &body(1, 1.5));
    assert_eq!(next.status, 200, "{}", String::from_utf8_lossy(&next.body));
    assert_eq!(next.json()["outputs"][0]["data"], json!([3.0, 3.0, 3.0, 3.0]));
    f.runtime.block_on(async {
        let status = within("a panicking gRPC request", grpc.model_infer(grpc_request("fragile", 1, 666.0))).await;
        let status = status.expect_err("a panicking request succeeded");
        assert_eq!((status.code(), kind_of(&status)), (Code::Internal, "engine_panicked"), "{status:?}");
        let answer = within("the next gRPC request", grpc.model_infer(grpc_request("fragile", 2, 1.0))).await;
        assert_eq!(answer.expect("the session serves on").into_inner().outputs[0].shape, [2, 4]);
    });
    assert_eq!(
        f.metric(r#"baton_inference_errors_total{model="fragile",version="1",role="stable",kind="engine_panicked"}"#),
        2.0
    );
    assert_eq!(f.rest.get("/v2/health/ready").status, 200);
}
