//! Valid inputs of every decoder, for the fuzz tests to damage and for the
//! AFL++ targets in `fuzz/` to start from ([`write_corpus`]).

use std::path::Path;

use baton_core::files::manifest::{self, Entry, Manifest};
use baton_core::tensors::tensor::{DataType, Tensor, TensorData};
use baton_onnx::mlp::{Mlp, OnnxOptions, encode_identity, encode_mlp};
use baton_onnx::proto::elem;
use baton_onnx::writer::{Attr, Dim, GraphWriter};
use baton_protocol::grpc::convert::encode_response;
use baton_protocol::grpc::pb::ModelInferRequest;
use baton_protocol::grpc::pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use baton_protocol::{RequestedOutput, encode_request};
use prost::Message;

/// A `model.toml` that sets every section.
pub const MODEL_TOML: &str = include_str!("model.toml");

/// A warmup sample file of two inputs, flat and nested.
pub const SAMPLE: &str = r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[[0.5,1],[2,-3]]},
    {"name":"s","datatype":"BYTES","shape":[1],"data":["a\u00e9"]}]}"#;

/// Tensors of several datatypes: FP32, BYTES, INT64, BOOL, and an empty
/// FP16 (left out with `fp16` false: gRPC has no typed field for it).
pub fn tensors(fp16: bool) -> Vec<Tensor> {
    let tensor = |name: &str, datatype, shape: Vec<i64>, data| Tensor { name: name.into(), datatype, shape, data };
    let mut tensors = vec![
        Tensor::from_f32("x", vec![2, 3], &[0.5, -1.0, 2.0, 3.25, 1e-3, 7.0]),
        tensor("s", DataType::Bytes, vec![2], TensorData::Bytes(vec![b"ab".to_vec(), Vec::new()])),
        tensor("i", DataType::Int64, vec![1, 2], TensorData::Raw([7i64.to_le_bytes(), (-3i64).to_le_bytes()].concat())),
        tensor("b", DataType::Bool, vec![1, 1], TensorData::Raw(vec![1])),
    ];
    if fp16 {
        tensors.push(tensor("e", DataType::Fp16, vec![0, 4], TensorData::Raw(Vec::new())));
    }
    tensors
}

/// REST bodies with their header lengths: JSON, binary, and JSON and
/// binary mixed.
pub fn rest() -> Vec<(Vec<u8>, Option<usize>)> {
    let mixed = concat!(
        r#"{"inputs":[{"name":"u","datatype":"INT16","shape":[1,2],"data":[3,-4]},"#,
        r#"{"name":"t","datatype":"BYTES","shape":[2],"parameters":{"binary_data_size":9}}],"#,
        r#""outputs":[{"name":"y","parameters":{"binary_data":false}}]}"#
    );
    let mixed_body = [mixed.as_bytes(), &[1, 0, 0, 0, b'z', 0, 0, 0, 0]].concat();
    let mut seeds = vec![(mixed_body, Some(mixed.len()))];
    for binary in [false, true] {
        let encoded = encode_request(&tensors(true), binary, &[RequestedOutput::new("y")], Some("r"));
        seeds.push((encoded.body, encoded.header_length));
    }
    seeds
}

/// A gRPC request carrying `tensors` as raw contents, or as typed contents
/// (taken from a response encoding them; FP16 has no typed field).
pub fn grpc_request(tensors: &[Tensor], raw: bool) -> ModelInferRequest {
    let encoded = encode_response("m", 1, String::new(), tensors.to_vec(), &[], raw).expect("consistent tensors");
    let input = |o: baton_protocol::grpc::pb::model_infer_response::InferOutputTensor| InferInputTensor {
        name: o.name,
        datatype: o.datatype,
        shape: o.shape,
        contents: o.contents,
        ..Default::default()
    };
    ModelInferRequest {
        model_name: "m".into(),
        id: "id".into(),
        inputs: encoded.outputs.into_iter().map(input).collect(),
        outputs: vec![InferRequestedOutputTensor { name: "y".into(), ..Default::default() }],
        raw_input_contents: encoded.raw_output_contents,
        ..Default::default()
    }
}

/// Encoded gRPC requests: raw and typed contents.
pub fn grpc() -> Vec<Vec<u8>> {
    [true, false].map(|raw| grpc_request(&tensors(false), raw).encode_to_vec()).to_vec()
}

/// ONNX models: an MLP with raw weights, one with external data, an
/// identity of INT64, and one with a Constant node and attributes.
pub fn onnx() -> Vec<Vec<u8>> {
    let mlp = Mlp::new(&[3, 2, 1], 7);
    let external = OnnxOptions { external_data: Some("weights.bin".into()), ..OnnxOptions::default() };
    let mut graph = GraphWriter::new("g");
    let table = graph.constant("table", elem::FLOAT, &[4, 2], &[0; 32]);
    graph.node("Gather", &[&table, "ids"], &["rows"], &[Attr::Int("axis", 0)]);
    graph.node("Transpose", &["rows"], &["y"], &[Attr::Ints("perm", &[1, 0]), Attr::Float("alpha", 0.5)]);
    graph.initializer_i64("shape", &[2], &[-1, 1 << 40]);
    graph.input("ids", elem::INT64, &[Dim::Named("batch")]);
    graph.output("y", elem::FLOAT, &[Dim::Fixed(2), Dim::Named("batch")]);
    vec![
        encode_mlp(&mlp, &OnnxOptions::default()).0,
        encode_mlp(&mlp, &external).0,
        encode_identity(elem::INT64, 3),
        graph.model(13),
    ]
}

/// A MANIFEST of two files.
pub fn manifest() -> Vec<u8> {
    let entry = |path: &str, size| Entry { path: path.into(), size, sha256: "0a".repeat(32) };
    let entries = vec![entry("model.onnx", 1 << 20), entry("warmup/b1.json", 4096)];
    manifest::render(&Manifest { entries, ..Manifest::default() }).into_bytes()
}

/// A REST body in the form the AFL++ `rest` target reads: the header
/// length in front, as one byte 0 for none, or 1 and the length as two
/// little-endian bytes.
pub fn rest_input(body: &[u8], header_length: Option<usize>) -> Vec<u8> {
    let prefix = match header_length {
        None => vec![0],
        Some(n) => [&[1u8][..], &u16::try_from(n).unwrap_or(u16::MAX).to_le_bytes()].concat(),
    };
    [prefix, body.to_vec()].concat()
}

/// Writes every seed into `dir/<target>/` for the AFL++ targets of
/// `fuzz/`: `rest`, `grpc`, `onnx`, `manifest`, `spec`, `sample`.
pub fn write_corpus(dir: &Path) -> std::io::Result<()> {
    let rest = rest().into_iter().map(|(body, n)| rest_input(&body, n)).collect();
    let texts = |text: &str| vec![text.as_bytes().to_vec()];
    let targets = [
        ("rest", rest),
        ("grpc", grpc()),
        ("onnx", onnx()),
        ("manifest", vec![manifest()]),
        ("spec", texts(MODEL_TOML)),
        ("sample", texts(SAMPLE)),
    ];
    for (target, seeds) in targets {
        let to = dir.join(target);
        std::fs::create_dir_all(&to)?;
        for (i, seed) in seeds.iter().enumerate() {
            std::fs::write(to.join(format!("seed{i}")), seed)?;
        }
    }
    Ok(())
}
