//! Model metadata and Triton's model configuration, as perf_analyzer reads
//! them.

use baton_core::tensors::signature::{Signature, TensorSpec};
use baton_core::tensors::tensor::DataType;
use baton_protocol::{is_batched, model_config, model_metadata};
use serde_json::{Value, json};

fn spec(name: &str, datatype: DataType, shape: &[i64]) -> TensorSpec {
    TensorSpec { name: name.into(), datatype, shape: shape.to_vec() }
}

fn batched_signature() -> Signature {
    Signature {
        inputs: vec![spec("features", DataType::Fp32, &[-1, 16]), spec("ids", DataType::Int64, &[-1])],
        outputs: vec![spec("score", DataType::Fp32, &[-1, 1]), spec("label", DataType::Bytes, &[-1, -1])],
    }
}

fn fixed_signature() -> Signature {
    Signature {
        inputs: vec![spec("image", DataType::Uint8, &[1, 3, 224, 224]), spec("mask", DataType::Bool, &[-1, 7])],
        outputs: vec![spec("probs", DataType::Fp16, &[1, 1000])],
    }
}

fn field<'a>(config: &'a Value, list: &str, index: usize) -> &'a Value {
    &config[list][index]
}

#[test]
fn metadata_lists_versions_and_full_shapes() {
    let m = model_metadata("ranker", &[1, 2], "onnxruntime_onnx", &batched_signature());
    assert_eq!(
        m,
        json!({
            "name": "ranker",
            "versions": ["1", "2"],
            "platform": "onnxruntime_onnx",
            "inputs": [
                {"name": "features", "datatype": "FP32", "shape": [-1, 16]},
                {"name": "ids", "datatype": "INT64", "shape": [-1]}],
            "outputs": [
                {"name": "score", "datatype": "FP32", "shape": [-1, 1]},
                {"name": "label", "datatype": "BYTES", "shape": [-1, -1]}],
        })
    );
}

#[test]
fn batched_config_drops_the_batch_dimension() {
    let sig = batched_signature();
    assert!(is_batched(&sig));
    let c = model_config("ranker", "onnxruntime_onnx", "onnxruntime", 64, &sig);
    assert_eq!(c["max_batch_size"], 64);
    assert_eq!(field(&c, "input", 0)["dims"], json!([16]));
    assert_eq!(field(&c, "input", 0)["data_type"], "TYPE_FP32");
    assert!(field(&c, "input", 0).get("reshape").is_none());
    // A tensor that is only the batch dimension: Triton's dims [1] + empty reshape.
    assert_eq!(field(&c, "input", 1)["dims"], json!([1]));
    assert_eq!(field(&c, "input", 1)["reshape"], json!({"shape": []}));
    assert_eq!(field(&c, "output", 0)["dims"], json!([1]));
    assert_eq!(field(&c, "output", 1)["dims"], json!([-1]));
    assert_eq!(field(&c, "output", 1)["data_type"], "TYPE_STRING");
}

#[test]
fn unbatched_config_keeps_full_shapes() {
    let sig = fixed_signature();
    assert!(!is_batched(&sig));
    for asked in [0, 8] {
        let c = model_config("vision", "onnxruntime_onnx", "onnxruntime", asked, &sig);
        assert_eq!(c["max_batch_size"], 0, "no batch dimension to drop when asked for {asked}");
        assert_eq!(field(&c, "input", 0)["dims"], json!([1, 3, 224, 224]));
        assert_eq!(field(&c, "input", 1)["dims"], json!([-1, 7]));
        assert_eq!(field(&c, "input", 1)["data_type"], "TYPE_BOOL");
        assert_eq!(field(&c, "output", 0)["dims"], json!([1, 1000]));
        assert_eq!(field(&c, "output", 0)["data_type"], "TYPE_FP16");
    }
    let batched_but_zero = model_config("ranker", "onnxruntime_onnx", "onnxruntime", 0, &batched_signature());
    assert_eq!(batched_but_zero["max_batch_size"], 0);
    assert_eq!(field(&batched_but_zero, "input", 0)["dims"], json!([-1, 16]));
}

#[test]
fn config_has_every_field_perf_analyzer_reads() {
    let sig = batched_signature();
    let c = model_config("ranker", "onnxruntime_onnx", "onnxruntime", usize::MAX, &sig);
    assert_eq!(c["name"], "ranker");
    assert_eq!(c["platform"], "onnxruntime_onnx");
    assert_eq!(c["backend"], "onnxruntime");
    assert_eq!(c["max_batch_size"], i64::from(i32::MAX), "int32 field");
    assert!(c["max_batch_size"].is_i64());
    assert_eq!(c["model_transaction_policy"], json!({"decoupled": false}));
    assert_eq!(c["response_cache"], json!({"enable": false}));
    for absent in ["sequence_batching", "dynamic_batching", "ensemble_scheduling"] {
        assert!(c.get(absent).is_none(), "{absent}");
    }
    assert_eq!(c["instance_group"][0]["kind"], "KIND_CPU");
    assert_eq!(c["instance_group"][0]["count"], 1);
    let metadata = model_metadata("ranker", &[1], "onnxruntime_onnx", &sig);
    for (list, meta) in [("input", "inputs"), ("output", "outputs")] {
        let entries = c[list].as_array().unwrap();
        assert_eq!(entries.len(), metadata[meta].as_array().unwrap().len());
        for (entry, m) in entries.iter().zip(metadata[meta].as_array().unwrap()) {
            assert_eq!(entry["name"], m["name"], "config and metadata name the same tensors");
            assert_eq!(entry["is_shape_tensor"], false);
            assert!(entry["dims"].as_array().unwrap().iter().all(Value::is_i64), "dims are JSON numbers");
            if list == "input" {
                assert_eq!(entry["optional"], false);
                assert_eq!(entry["format"], "FORMAT_NONE");
            }
        }
    }
}
