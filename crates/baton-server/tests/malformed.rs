//! Every way a request can be wrong gets the right 4xx status and an
//! `error` message that says what is wrong — which tensor, what was
//! expected and what was found: malformed bodies and tensors, binary sizes
//! and header lengths that do not add up, inputs and outputs the model does
//! not have, batches over `max_batch_size`, bad version numbers (400);
//! unknown models and versions (404); models in the repository that do not
//! serve (503); bodies over `--max-request-bytes` (413); a second load while
//! one runs (409). Unknown names leave no registry entry and no metric
//! series. Bad requests never affect the others: a valid request
//! still gets the right answer afterwards and the server never panics.

mod common;

use baton_core::tensors::tensor::Tensor;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{Damage, TestRepo, mlp_toml};
use baton_testkit::server::{Client, Server, eventually, metric};
use common::{SIZES, assert_close, assert_error, assert_no_panic, binary_request, infer, mlp, start};
use serde_json::{Value, json};

const BINARY: &str = "inference-header-content-length";

/// One bad request and what the answer must say.
struct Case {
    what: &'static str,
    path: String,
    body: Vec<u8>,
    header_length: Option<String>,
    status: u16,
    needles: Vec<String>,
}

fn case(what: &'static str, status: u16, body: &Value, needles: &[&str]) -> Case {
    Case {
        what,
        path: "/v2/models/m/infer".into(),
        body: body.to_string().into_bytes(),
        header_length: None,
        status,
        needles: needles.iter().map(|n| (*n).to_owned()).collect(),
    }
}

fn at(mut case: Case, path: &str) -> Case {
    case.path = path.to_owned();
    case
}

fn raw(what: &'static str, body: &[u8], header_length: Option<&str>, needles: &[&str]) -> Case {
    Case {
        what,
        path: "/v2/models/m/infer".into(),
        body: body.to_vec(),
        header_length: header_length.map(str::to_owned),
        status: 400,
        needles: needles.iter().map(|n| (*n).to_owned()).collect(),
    }
}

fn tensor(shape: Value, datatype: &str, data: Value) -> Value {
    json!({ "name": "input", "datatype": datatype, "shape": shape, "data": data })
}

/// A JSON header with one binary FP32 input of `shape` claiming `size` bytes,
/// followed by `bytes` bytes of data.
fn binary_body(shape: &[usize], size: usize, bytes: usize) -> (Vec<u8>, String) {
    let header = json!({ "inputs": [{ "name": "input", "datatype": "FP32", "shape": shape,
        "parameters": { "binary_data_size": size } }] })
    .to_string();
    let mut body = header.clone().into_bytes();
    body.extend((0..bytes).map(|i| (i % 7) as u8));
    (body, header.len().to_string())
}

fn send(server: &Server, case: &Case) -> baton_testkit::server::Answer {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(length) = &case.header_length {
        headers.push((BINARY, length.as_str()));
    }
    server.post_raw(&case.path, &case.body, &headers)
}

#[test]
fn every_bad_request_is_refused_with_a_precise_message_and_harms_nothing() {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), "max_batch_size = 4"));
    repo.publish_mlp("m", 1, &mlp(1));
    let broken = Mlp::new(&SIZES, 5);
    repo.add_model("broken", &mlp_toml(&broken, "required = false"));
    repo.publish_damaged("broken", 1, &broken, Damage::FlipByte);
    repo.add_model("spare", &mlp_toml(&mlp(1), "required = false"));
    repo.publish_mlp("spare", 1, &mlp(1));
    let server = start(&repo, &[]);
    server.wait_ready();
    server.wait_settled("spare", 1);
    eventually("the broken model to be refused", || server.status("broken")["failed_versions"].get("1").map(|_| ()));
    let unload = server.post_json("/v2/repository/models/spare/unload", &json!({}));
    assert_eq!(unload.status, 200, "{}", String::from_utf8_lossy(&unload.body));

    let good = sample_input(SIZES[0], 2, 31);
    let row = |n: usize| json!(good[..n]);
    let inputs = |t: Value| json!({ "inputs": [t] });
    let ok_tensor = tensor(json!([2, 8]), "FP32", row(16));
    let (short_size, short_len) = binary_body(&[2, 8], 60, 60);
    let (short_data, short_data_len) = binary_body(&[2, 8], 64, 10);
    let (left_over, left_over_len) = binary_body(&[2, 8], 64, 68);
    let (no_header, _) = binary_body(&[2, 8], 64, 64);
    let (fine, _) = binary_body(&[2, 8], 64, 64);

    let cases = vec![
        raw("invalid JSON", b"{\"inputs\": [", None, &["invalid JSON", "EOF"]),
        raw("not JSON at all", b"hello", None, &["invalid JSON"]),
        case("no inputs array", 400, &json!({ "id": "x" }), &["no 'inputs'"]),
        case("empty inputs", 400, &json!({ "inputs": [] }), &["missing input 'input'"]),
        case("id not a string", 400, &json!({ "id": 5, "inputs": [ok_tensor] }), &["'id' must be a string", "5"]),
        case(
            "unknown datatype",
            400,
            &inputs(tensor(json!([2, 8]), "FP33", row(16))),
            &["input 'input'", "unknown datatype 'FP33'", "FP32"],
        ),
        case(
            "wrong datatype for the model",
            400,
            &inputs(tensor(json!([2, 8]), "INT32", json!(vec![1; 16]))),
            &["input 'input'", "expected datatype FP32, got INT32"],
        ),
        case(
            "wrong shape",
            400,
            &inputs(tensor(json!([2, 7]), "FP32", row(14))),
            &["input 'input'", "expected shape [-1, 8], got [2, 7]"],
        ),
        case(
            "wrong rank",
            400,
            &inputs(tensor(json!([16]), "FP32", row(16))),
            &["input 'input'", "expected shape [-1, 8], got [16]"],
        ),
        case(
            "wrong element count",
            400,
            &inputs(tensor(json!([2, 8]), "FP32", row(15))),
            &["input 'input'", "shape [2, 8] needs 16 elements", "has 15"],
        ),
        case(
            "element not a number",
            400,
            &inputs(tensor(json!([1, 8]), "FP32", json!([0.1, 0.2, "x", 0.4, 0.5, 0.6, 0.7, 0.8]))),
            &["input 'input'", "element 2", "\"x\"", "FP32"],
        ),
        case(
            "null element",
            400,
            &inputs(tensor(json!([1, 8]), "FP32", json!([0.1, null, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]))),
            &["input 'input'", "element 1", "null"],
        ),
        case(
            "huge shape, little data",
            400,
            &inputs(tensor(json!([100_000_000_000u64, 8]), "FP32", row(16))),
            &["input 'input'", "needs 800000000000 elements", "has 16"],
        ),
        case(
            "BYTES for an FP32 model",
            400,
            &inputs(tensor(json!([1, 8]), "BYTES", json!(["a", "b", "c", "d", "e", "f", "g", "h"]))),
            &["input 'input'", "expected datatype FP32, got BYTES"],
        ),
        case(
            "negative dimension",
            400,
            &inputs(tensor(json!([-1, 8]), "FP32", row(8))),
            &["input 'input'", "shape [-1, 8] has a negative dimension"],
        ),
        case(
            "neither data nor binary size",
            400,
            &json!({ "inputs": [{ "name": "input", "datatype": "FP32", "shape": [1, 8] }] }),
            &["input 'input'", "neither 'data' nor parameters.binary_data_size"],
        ),
        raw(
            "binary size disagrees with the shape",
            &short_size,
            Some(&short_len),
            &["input 'input'", "shape [2, 8] of FP32 needs 64 bytes, binary_data_size is 60"],
        ),
        raw(
            "binary data shorter than its size",
            &short_data,
            Some(&short_data_len),
            &["input 'input'", "binary_data_size is 64 but only 10 bytes"],
        ),
        raw(
            "binary data left over",
            &left_over,
            Some(&left_over_len),
            &["4 bytes of binary data are left over", "'input'"],
        ),
        raw("binary data without the header length", &no_header, None, &["Inference-Header-Content-Length"]),
        raw(
            "header length not a number",
            &fine,
            Some("abc"),
            &["Inference-Header-Content-Length", "not a length", "abc"],
        ),
        raw("header length negative", &fine, Some("-5"), &["Inference-Header-Content-Length", "not a length"]),
        raw(
            "header length past the body",
            &fine,
            Some("100000"),
            &["Inference-Header-Content-Length is 100000", &format!("only {} bytes", fine.len())],
        ),
        raw("header length cutting the JSON", &fine, Some("10"), &["invalid JSON"]),
        case(
            "unknown input name",
            400,
            &json!({ "inputs": [ok_tensor, { "name": "extra", "datatype": "FP32", "shape": [1], "data": [1.0] }] }),
            &["unexpected input 'extra'", "\"input\""],
        ),
        case(
            "only a wrongly named input",
            400,
            &json!({ "inputs": [{ "name": "features", "datatype": "FP32", "shape": [2, 8], "data": row(16) }] }),
            &["missing input 'input'"],
        ),
        case(
            "input given twice",
            400,
            &json!({ "inputs": [ok_tensor, ok_tensor] }),
            &["input 'input'", "more than once"],
        ),
        case(
            "unknown requested output",
            400,
            &json!({ "inputs": [ok_tensor], "outputs": [{ "name": "scores" }] }),
            &["unknown output 'scores'", "\"output\""],
        ),
        case(
            "batch over max_batch_size",
            400,
            &inputs(tensor(json!([5, 8]), "FP32", json!(sample_input(8, 5, 1)))),
            &["input 'input'", "batch size 5", "max_batch_size 4"],
        ),
        at(
            case("non-numeric version", 400, &inputs(ok_tensor.clone()), &["'abc' is not a version number"]),
            "/v2/models/m/versions/abc/infer",
        ),
        at(
            case("negative version", 400, &inputs(ok_tensor.clone()), &["'-1' is not a version number"]),
            "/v2/models/m/versions/-1/infer",
        ),
        at(case("unknown model", 404, &inputs(ok_tensor.clone()), &["unknown model 'nope'"]), "/v2/models/nope/infer"),
        at(
            case("unknown version", 404, &inputs(ok_tensor.clone()), &["model 'm' has no loaded version 9"]),
            "/v2/models/m/versions/9/infer",
        ),
        at(
            case("unknown endpoint", 404, &inputs(ok_tensor.clone()), &["no such endpoint", "/v2/models/m/predict"]),
            "/v2/models/m/predict",
        ),
        at(
            case("only version corrupt", 503, &inputs(ok_tensor.clone()), &["model 'broken' is not ready"]),
            "/v2/models/broken/infer",
        ),
        at(
            case("unloaded model", 503, &inputs(ok_tensor.clone()), &["model 'spare' is not ready"]),
            "/v2/models/spare/infer",
        ),
    ];
    for case in &cases {
        let answer = send(&server, case);
        let needles: Vec<&str> = case.needles.iter().map(String::as_str).collect();
        assert_error(&answer, case.status, &needles, case.what);
    }

    // Metadata endpoints refuse bad versions the same way.
    for path in ["/v2/models/m/versions/x/ready", "/v2/models/m/versions/1.5/config", "/v2/models/m/versions/-/"] {
        let answer = server.get(path.trim_end_matches('/'));
        assert_error(&answer, 400, &["is not a version number"], path);
    }

    // None of that touched the model: a valid request gets the right answer.
    let (version, output) = infer(&server, "m", &good, 2);
    assert_eq!(version, 1);
    assert_close(&output, &mlp(1).forward(&good, 2), "after the bad requests");
    let tensor = Tensor::from_f32("input", vec![2, 8], &good);
    let (body, length) = binary_request(&[tensor], &[]);
    assert_eq!(server.post_raw("/v2/models/m/infer", &body, &[(BINARY, &length)]).status, 200);
    assert_eq!(server.get("/v2/health/ready").status, 200);
    assert_no_panic(&server);
}

#[test]
fn bodies_over_the_limit_are_413_and_smaller_ones_still_work() {
    let repo = common::repo_with("m", &[1], "");
    let server = start(&repo, &["--max-request-bytes", "4096"]);
    server.wait_ready();
    let small = sample_input(SIZES[0], 2, 41);
    assert_eq!(infer(&server, "m", &small, 2).0, 1, "a small request fits");

    // The server may close a connection whose body it refused to read
    // (it cannot know where the next request starts), so each request
    // after a refusal goes out on a fresh connection.
    let fresh = || Client::new(server.base());
    let batch = 64;
    let big = sample_input(SIZES[0], batch, 42);
    let body = common::request(&big, batch).to_string();
    assert!(body.len() > 4096, "the request must be over the limit");
    let answer = fresh().post_raw("/v2/models/m/infer", body.as_bytes(), &[("content-type", "application/json")]);
    assert_error(&answer, 413, &["limit"], "JSON body over --max-request-bytes");
    assert_eq!(answer.json()["kind"], "too_large");

    let batch = 200;
    let big = sample_input(SIZES[0], batch, 43);
    let tensor = Tensor::from_f32("input", vec![batch as i64, SIZES[0] as i64], &big);
    let (body, length) = binary_request(&[tensor], &[]);
    assert!(body.len() > 4096);
    let answer = fresh().post_raw("/v2/models/m/infer", &body, &[(BINARY, &length)]);
    assert_error(&answer, 413, &["limit"], "binary body over --max-request-bytes");

    let answer = fresh().post_json("/v2/models/m/infer", &common::request(&small, 2));
    assert_eq!(answer.status, 200, "{}", answer.error());
    let json = answer.json();
    assert_eq!(common::version_of(&json), 1);
    assert_close(&common::output_f32(&json, "output"), &mlp(1).forward(&small, 2), "after the refused bodies");
    assert_no_panic(&server);
}

/// Layer sizes of a model whose load takes long enough to overlap with a
/// second one (about 34 MB of weights: verifying and validating them takes
/// a while in a debug build, and certainly longer than two HTTP requests).
const BIG: [usize; 4] = [1024, 4096, 1024, 1];

#[test]
fn a_second_load_while_one_runs_is_409() {
    let big = Mlp::new(&BIG, 9);
    let repo = TestRepo::new();
    let policy = "required = false\n[warmup]\nbatch_sizes = [1]\nmax_latency_ms = 60000";
    repo.add_model("big", &mlp_toml(&big, policy));
    repo.publish_mlp("big", 1, &big);
    // No watching: the only loads are the start-up one and the test's.
    let server = start(&repo, &["--no-watch"]);
    let client = server.client();

    let mut attempts = 0;
    let (conflict, in_progress) = loop {
        attempts += 1;
        assert!(attempts <= 4, "never managed to overlap two loads");
        // The start-up load is the first slow load; later attempts start one.
        let first = (attempts > 1).then(|| {
            let client = client.clone();
            std::thread::spawn(move || client.post_json("/v2/repository/models/big/load", &json!({})))
        });
        let running = eventually("a load of big to be running, or over", || {
            let status = server.get("/baton/v1/models/big/status");
            let status = (status.status == 200).then(|| status.json());
            if status.as_ref().is_some_and(|s| s["busy"] == true) {
                return Some(true);
            }
            let over = match &first {
                None => status.is_some_and(|s| s["serving"] == 1),
                Some(thread) => thread.is_finished(),
            };
            over.then_some(false)
        });
        if !running {
            // The load ended before it was seen running; start another.
            if let Some(first) = first {
                assert_eq!(first.join().expect("the first load's thread").status, 200);
            }
            continue;
        }
        let in_progress = metric(&server.metrics(), "baton_model_load_in_progress{model=\"big\"}");
        let second = server.post_json("/v2/repository/models/big/load", &json!({}));
        let rollback = server.post_json("/baton/v1/models/big/rollback", &json!({}));
        if let Some(first) = first {
            assert_eq!(first.join().expect("the first load's thread").status, 200, "the first load goes through");
        }
        if second.status == 409 {
            assert_error(&rollback, 409, &["in progress"], "a rollback during a load");
            break (second, in_progress);
        }
        // The first load finished before the second was sent: the second ran
        // a whole load instead. Not what this test is after; try again.
        assert_eq!(second.status, 200, "{}", String::from_utf8_lossy(&second.body));
        eventually("big to be idle", || (server.status("big")["busy"] == false).then_some(()));
    };
    assert_error(&conflict, 409, &["a load is already in progress for model 'big'"], "second load");
    assert_eq!(conflict.json()["kind"], "load_in_progress");
    assert_eq!(in_progress, Some(1.0), "/metrics said a load was in progress while it was");

    // The first load was neither disturbed nor run twice.
    server.wait_serving("big", 1);
    eventually("big to be idle", || (server.status("big")["busy"] == false).then_some(()));
    let status = server.status("big");
    assert_eq!(status["state"], "READY");
    assert!(status["last_error"].is_null(), "the refused load is not a failed load: {status}");
    assert_eq!(metric(&server.metrics(), "baton_model_load_in_progress{model=\"big\"}"), Some(0.0));
    let input = sample_input(BIG[0], 1, 3);
    let (version, output) = infer(&server, "big", &input, 1);
    assert_eq!(version, 1);
    let want = big.forward(&input, 1);
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    assert!(baton_testkit::max_diff(&output, &want) < common::TOLERANCE * scale, "{output:?} vs {want:?}");
    assert_no_panic(&server);
}

/// Requests, loads and management calls that name models the repository
/// does not have are 404, every time, and leave nothing behind: no
/// registry entry (status stays 404), no metric series named after them.
#[test]
fn unknown_names_leave_no_state() {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("m", 1, &mlp(1));
    let server = start(&repo, &["--no-watch"]);
    server.wait_serving("m", 1);
    let input = sample_input(SIZES[0], 1, 4);
    let body = common::request(&input, 1);
    let names: Vec<String> = (0..20).map(|i| format!("ghost{i}")).collect();
    for round in 0..2 {
        for name in &names {
            let what = format!("round {round}, {name}");
            let infer = server.post_json(&format!("/v2/models/{name}/infer"), &body);
            assert_error(&infer, 404, &[&format!("unknown model '{name}'")], &what);
            let load = server.post_json(&format!("/v2/repository/models/{name}/load"), &json!({}));
            assert_error(&load, 404, &[name.as_str()], &what);
            for op in ["load", "rollback"] {
                let answer = server.post_json(&format!("/baton/v1/models/{name}/{op}"), &json!({}));
                assert_eq!(answer.status, 404, "{what}, {op}: {}", String::from_utf8_lossy(&answer.body));
            }
            assert_eq!(server.get(&format!("/baton/v1/models/{name}/status")).status, 404, "{what}: status");
        }
    }
    let status = server.get("/baton/v1/status").json();
    let listed = status.to_string();
    assert!(!listed.contains("ghost"), "the server's status lists no unknown model: {listed}");
    let text = server.metrics();
    assert!(!text.contains("ghost"), "no series is named after an unknown model");
    let refused = "baton_inference_errors_total{model=\"\",version=\"\",role=\"\",kind=\"model_not_found\"}";
    assert_eq!(metric(&text, refused), Some(names.len() as f64 * 2.0), "they are counted, under model=\"\"");
    // The known model is untouched and still counted under its own name.
    assert_eq!(infer(&server, "m", &input, 1).0, 1);
    let text = server.metrics();
    assert_eq!(metric(&text, "baton_inference_requests_total{model=\"m\",version=\"1\",role=\"stable\"}"), Some(1.0));
    assert_no_panic(&server);
}
