//! Inference over HTTP, end to end through the real binary: JSON requests
//! with flat and nested data, the request `id` echoed and `model_version`
//! naming the version that answered; the binary tensor data extension in
//! both directions (binary inputs, binary outputs asked for per output or
//! for the whole request, and every mix of JSON and binary); a subset of
//! outputs asked for by name; and inference on a named kept version while
//! another one is stable. Every output equals `Mlp::forward` of the version
//! that answered.

mod common;

use baton_core::tensors::tensor::Tensor;
use baton_protocol::{RequestedOutput, decode_response};
use baton_testkit::onnx::{Mlp, OnnxOptions, encode_mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::Answer;
use common::{SIZES, assert_close, binary_request, infer, infer_at, mlp, output_f32, repo_with, start, version_of};
use serde_json::{Value, json};

const BINARY: &str = "inference-header-content-length";

/// Decodes a response, binary or JSON, checking the headers agree with the body.
fn decoded(answer: &Answer) -> baton_protocol::InferResponse {
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    let length = answer.header(BINARY).map(|v| v.parse::<usize>().expect("a numeric header length"));
    let content_type = answer.header("content-type").unwrap_or_default();
    match length {
        Some(_) => assert_eq!(content_type, "application/octet-stream"),
        None => assert_eq!(content_type, "application/json"),
    }
    decode_response(&answer.body, length).unwrap_or_else(|e| panic!("undecodable response: {e}"))
}

/// The JSON header of a response (the whole body when it has no binary part).
fn header_json(answer: &Answer) -> Value {
    let end = answer.header(BINARY).map_or(answer.body.len(), |v| v.parse().expect("a numeric header length"));
    serde_json::from_slice(&answer.body[..end]).expect("a JSON header")
}

fn output_of(response: &baton_protocol::InferResponse, name: &str) -> Vec<f32> {
    let tensor = response.outputs.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no output {name}"));
    tensor.to_f32().expect("FP32 output")
}

#[test]
fn json_requests_flat_and_nested_echo_the_id_and_name_the_version() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &[]);
    server.wait_ready();
    let batch = 3;
    let input = sample_input(SIZES[0], batch, 11);
    let want = mlp(1).forward(&input, batch);

    let mut body = common::request(&input, batch);
    body["id"] = json!("request-42");
    let answer = server.post_json("/v2/models/m/infer", &body);
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header(BINARY), None, "a JSON answer has no binary part");
    let flat = answer.json();
    assert_eq!(flat["id"], "request-42", "{flat}");
    assert_eq!(flat["model_name"], "m");
    assert_eq!(version_of(&flat), 1);
    let output = &flat["outputs"][0];
    assert_eq!((output["name"].as_str(), output["datatype"].as_str()), (Some("output"), Some("FP32")));
    assert_eq!(output["shape"], json!([batch, SIZES[2]]));
    assert_close(&output_f32(&flat, "output"), &want, "flat JSON data");

    // The same rows as nested arrays, and no id: none is echoed.
    let rows: Vec<Vec<f32>> = input.chunks(SIZES[0]).map(<[f32]>::to_vec).collect();
    let nested =
        json!({ "inputs": [{ "name": "input", "datatype": "FP32", "shape": [batch, SIZES[0]], "data": rows }] });
    let answer = server.post_json("/v2/models/m/infer", &nested);
    let nested = answer.json();
    assert_eq!(answer.status, 200, "{nested}");
    assert!(nested.get("id").is_none(), "no id was sent, none is echoed: {nested}");
    assert_eq!(version_of(&nested), 1);
    assert_close(&output_f32(&nested, "output"), &want, "nested JSON data");

    // Triton's clients send an empty id; it is echoed as is.
    body["id"] = json!("");
    assert_eq!(server.post_json("/v2/models/m/infer", &body).json()["id"], "");
}

#[test]
fn binary_tensor_data_in_both_directions_and_every_mix() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &[]);
    server.wait_ready();
    let batch = 4;
    let input = sample_input(SIZES[0], batch, 12);
    let want = mlp(1).forward(&input, batch);
    let tensor = Tensor::from_f32("input", vec![batch as i64, SIZES[0] as i64], &input);
    let output_bytes = (batch * SIZES[2] * 4) as u64;

    // Binary in, binary out (the request-level binary_data_output the encoder sets).
    let (body, length) = binary_request(std::slice::from_ref(&tensor), &[]);
    let header: Value = serde_json::from_slice(&body[..length.parse::<usize>().unwrap()]).unwrap();
    assert_eq!(header["inputs"][0]["parameters"]["binary_data_size"], batch * SIZES[0] * 4);
    assert_eq!(header["parameters"]["binary_data_output"], true);
    let answer = server.post_raw("/v2/models/m/infer", &body, &[(BINARY, &length)]);
    let json_part = header_json(&answer);
    assert_eq!(json_part["outputs"][0]["parameters"]["binary_data_size"], output_bytes, "{json_part}");
    assert!(json_part["outputs"][0].get("data").is_none(), "binary outputs carry no JSON data: {json_part}");
    let length: usize = answer.header(BINARY).expect("binary output needs the header length").parse().unwrap();
    assert_eq!(answer.body.len() - length, output_bytes as usize, "exactly the output's bytes follow the JSON");
    let response = decoded(&answer);
    assert_eq!((response.model_name.as_str(), response.model_version.as_str()), ("m", "1"));
    assert_close(&output_of(&response, "output"), &want, "binary in, binary out");

    // Binary in, JSON out: the output's own binary_data=false overrides the request.
    let (body, length) =
        binary_request(std::slice::from_ref(&tensor), &[RequestedOutput::with_binary("output", false)]);
    let answer = server.post_raw("/v2/models/m/infer", &body, &[(BINARY, &length)]);
    assert_eq!(answer.header(BINARY), None, "a JSON-only answer has no header length");
    assert_close(&output_f32(&answer.json(), "output"), &want, "binary in, JSON out");

    // JSON in, binary out, asked for on the output.
    let mut request = common::request(&input, batch);
    request["outputs"] = json!([{ "name": "output", "parameters": { "binary_data": true } }]);
    let answer = server.post_json("/v2/models/m/infer", &request);
    assert_close(&output_of(&decoded(&answer), "output"), &want, "JSON in, binary out (per output)");
    assert!(answer.header(BINARY).is_some());

    // JSON in, binary out, asked for on the whole request.
    let mut request = common::request(&input, batch);
    request["parameters"] = json!({ "binary_data_output": true });
    let answer = server.post_json("/v2/models/m/infer", &request);
    assert!(answer.header(BINARY).is_some(), "binary_data_output asks for binary outputs");
    assert_close(&output_of(&decoded(&answer), "output"), &want, "JSON in, binary out (request level)");

    // JSON in with binary_data_output, but the output says false: JSON wins for it.
    request["outputs"] = json!([{ "name": "output", "parameters": { "binary_data": false } }]);
    let answer = server.post_json("/v2/models/m/infer", &request);
    assert_eq!(answer.header(BINARY), None);
    assert_close(&output_f32(&answer.json(), "output"), &want, "request binary, output JSON");

    // A binary request whose JSON asks for JSON outputs by not saying
    // anything: hand-written header, binary input, no binary_data_output.
    let header = json!({ "id": "mixed", "inputs": [{ "name": "input", "datatype": "FP32", "shape": [batch, SIZES[0]],
        "parameters": { "binary_data_size": batch * SIZES[0] * 4 } }] })
    .to_string();
    let mut body = header.clone().into_bytes();
    body.extend(input.iter().flat_map(|v| v.to_le_bytes()));
    let answer = server.post_raw("/v2/models/m/infer", &body, &[(BINARY, &header.len().to_string())]);
    let json = answer.json();
    assert_eq!(json["id"], "mixed");
    assert_close(&output_f32(&json, "output"), &want, "hand-framed binary input");
}

/// Appends a second graph output to an encoded MLP: the hidden layer after
/// its ReLU (`relu0`, `[batch, width]`). Protobuf merges repeated occurrences
/// of an embedded message field, so a second `graph` field holding only the
/// new output extends the graph.
fn with_hidden_output(model: &mut Vec<u8>, width: usize) {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn field(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
        varint(out, u64::from(number) << 3 | 2);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }
    fn int_field(out: &mut Vec<u8>, number: u32, v: u64) {
        varint(out, u64::from(number) << 3);
        varint(out, v);
    }
    let mut batch_dim = Vec::new();
    field(&mut batch_dim, 2, b"batch");
    let mut width_dim = Vec::new();
    int_field(&mut width_dim, 1, width as u64);
    let mut shape = Vec::new();
    field(&mut shape, 1, &batch_dim);
    field(&mut shape, 1, &width_dim);
    let mut tensor_type = Vec::new();
    int_field(&mut tensor_type, 1, 1); // FLOAT
    field(&mut tensor_type, 2, &shape);
    let mut type_proto = Vec::new();
    field(&mut type_proto, 1, &tensor_type);
    let mut value_info = Vec::new();
    field(&mut value_info, 1, b"relu0");
    field(&mut value_info, 2, &type_proto);
    let mut graph = Vec::new();
    field(&mut graph, 12, &value_info);
    field(model, 7, &graph);
}

#[test]
fn requested_outputs_select_a_subset_in_request_order() {
    let net = Mlp::new(&SIZES, 77);
    let repo = TestRepo::new();
    let extra = format!(
        "outputs = [{{ name = \"output\", datatype = \"FP32\", shape = [-1, {}] }}, \
         {{ name = \"relu0\", datatype = \"FP32\", shape = [-1, {}] }}]",
        SIZES[2], SIZES[1]
    );
    let toml = mlp_toml(&net, "").lines().filter(|l| !l.starts_with("outputs")).collect::<Vec<_>>().join("\n");
    repo.add_model("two", &format!("{toml}\n{extra}\n"));
    let (mut model, _) = encode_mlp(&net, &OnnxOptions::default());
    with_hidden_output(&mut model, SIZES[1]);
    repo.write_files("two", 1, &[("model.onnx", &model)]);
    repo.seal("two", 1);
    let server = start(&repo, &[]);
    server.wait_ready();

    let batch = 2;
    let input = sample_input(SIZES[0], batch, 13);
    let want_output = net.forward(&input, batch);
    let first = Mlp { sizes: SIZES[..2].to_vec(), layers: vec![net.layers[0].clone()] };
    let want_hidden: Vec<f32> = first.forward(&input, batch).into_iter().map(|v| v.max(0.0)).collect();

    // No outputs named: both, in model order.
    let all = server.post_json("/v2/models/two/infer", &common::request(&input, batch)).json();
    let names: Vec<&str> = all["outputs"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["output", "relu0"], "{all}");
    assert_close(&output_f32(&all, "output"), &want_output, "output");
    assert_close(&output_f32(&all, "relu0"), &want_hidden, "relu0");

    // One named: only that one.
    for (name, want) in [("relu0", &want_hidden), ("output", &want_output)] {
        let mut request = common::request(&input, batch);
        request["outputs"] = json!([{ "name": name }]);
        let body = server.post_json("/v2/models/two/infer", &request).json();
        assert_eq!(body["outputs"].as_array().map(Vec::len), Some(1), "only {name} was asked for: {body}");
        assert_close(&output_f32(&body, name), want, name);
    }

    // Both named, reversed: request order, one binary and one JSON.
    let tensor = Tensor::from_f32("input", vec![batch as i64, SIZES[0] as i64], &input);
    let wanted = [RequestedOutput::with_binary("relu0", false), RequestedOutput::with_binary("output", true)];
    let (body, length) = binary_request(&[tensor], &wanted);
    let answer = server.post_raw("/v2/models/two/infer", &body, &[(BINARY, &length)]);
    let header = header_json(&answer);
    assert_eq!(header["outputs"][0]["name"], "relu0");
    assert!(header["outputs"][0]["data"].is_array(), "relu0 asked for as JSON: {header}");
    assert_eq!(header["outputs"][1]["parameters"]["binary_data_size"], batch * SIZES[2] * 4);
    let response = decoded(&answer);
    let names: Vec<&str> = response.outputs.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["relu0", "output"]);
    assert_close(&output_of(&response, "relu0"), &want_hidden, "relu0 (JSON)");
    assert_close(&output_of(&response, "output"), &want_output, "output (binary)");
}

#[test]
fn a_named_version_answers_while_another_is_stable() {
    let repo = repo_with("m", &[1], "[policy]\nkeep_previous = 1");
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    server.wait_serving("m", 2);
    assert_eq!(server.status("m")["previous"], json!([1]), "version 1 is kept");

    let batch = 2;
    let input = sample_input(SIZES[0], batch, 14);
    let (v1, v2) = (mlp(1).forward(&input, batch), mlp(2).forward(&input, batch));
    assert!(baton_testkit::max_diff(&v1, &v2) > 1e-3, "the versions must be told apart by their outputs");

    let (version, output) = infer(&server, "m", &input, batch);
    assert_eq!(version, 2, "the stable version answers requests that name none");
    assert_close(&output, &v2, "stable");
    let (version, output) = infer_at(&server, "/v2/models/m/versions/1/infer", &input, batch);
    assert_eq!(version, 1, "the named kept version answers");
    assert_close(&output, &v1, "version 1");
    let (version, output) = infer_at(&server, "/v2/models/m/versions/2/infer", &input, batch);
    assert_eq!(version, 2);
    assert_close(&output, &v2, "version 2");

    // Binary on a named version too.
    let tensor = Tensor::from_f32("input", vec![batch as i64, SIZES[0] as i64], &input);
    let (body, length) = binary_request(&[tensor], &[]);
    let response = decoded(&server.post_raw("/v2/models/m/versions/1/infer", &body, &[(BINARY, &length)]));
    assert_eq!(response.model_version, "1");
    assert_close(&output_of(&response, "output"), &v1, "binary on version 1");
}
