//! Writes the starting corpus of every target into `corpus/<target>/`:
//! valid inputs of each kind, made by baton's own encoders.

use std::path::Path;

use baton_core::tensor::{DataType, Tensor, TensorData};
use baton_protocol::grpc::convert::encode_response;
use baton_protocol::grpc::pb::ModelInferRequest;
use baton_protocol::grpc::pb::model_infer_request::InferInputTensor;
use baton_protocol::{RequestedOutput, encode_request};
use prost::Message;

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("the corpus directory can be created");
    std::fs::write(dir.join(name), bytes).expect("the seed can be written");
}

fn main() {
    let tensors = vec![
        Tensor::from_f32("x", vec![2, 2], &[0.5, -1.0, 2.0, 3.0]),
        Tensor {
            name: "s".into(),
            datatype: DataType::Bytes,
            shape: vec![2],
            data: TensorData::Bytes(vec![b"ab".to_vec(), Vec::new()]),
        },
        Tensor {
            name: "i".into(),
            datatype: DataType::Int64,
            shape: vec![1],
            data: TensorData::Raw(7i64.to_le_bytes().to_vec()),
        },
        Tensor { name: "b".into(), datatype: DataType::Bool, shape: vec![1, 1], data: TensorData::Raw(vec![1]) },
    ];
    for (name, binary) in [("json", false), ("binary", true)] {
        let e = encode_request(&tensors, binary, &[RequestedOutput::new("y")], Some("id"));
        write("rest", name, &baton_fuzz::rest_input(&e.body, e.header_length));
    }
    for (name, raw) in [("raw", true), ("typed", false)] {
        let r = encode_response("m", 1, "id".into(), tensors.clone(), &[], raw).expect("consistent tensors");
        let inputs = r
            .outputs
            .into_iter()
            .map(|o| InferInputTensor {
                name: o.name,
                datatype: o.datatype,
                shape: o.shape,
                contents: o.contents,
                ..Default::default()
            })
            .collect();
        let request = ModelInferRequest { inputs, raw_input_contents: r.raw_output_contents, ..Default::default() };
        write("grpc", name, &request.encode_to_vec());
    }
    let mlp = baton_onnx::mlp::Mlp::new(&[3, 2, 1], 7);
    write("onnx", "mlp", &baton_onnx::mlp::encode_mlp(&mlp, &Default::default()).0);
    write("onnx", "identity", &baton_onnx::mlp::encode_identity(7, 3));
    let entry = |path: &str| baton_core::manifest::Entry { path: path.into(), size: 4096, sha256: "0a".repeat(32) };
    let manifest = baton_core::manifest::Manifest { entries: vec![entry("model.onnx"), entry("warmup/a.json")] };
    write("manifest", "two", baton_core::manifest::render(&manifest).as_bytes());
    write("spec", "full", include_str!("../../seeds/model.toml").as_bytes());
    write("sample", "two", br#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[[0.5,1],[2,-3]]},{"name":"s","datatype":"BYTES","shape":[1],"data":["a"]}]}"#);
}
