//! Model metadata (KServe V2, `GET /v2/models/{name}`) and Triton's model
//! configuration (`GET /v2/models/{name}/config`), which Triton's
//! perf_analyzer reads before it generates load.
//!
//! What perf_analyzer (`src/model_parser.cc`) takes from where:
//!
//! - metadata: `name`; every input's `name`, `datatype` and `shape` (the
//!   shapes it sends, dropping the first dimension when `max_batch_size` > 0);
//!   every output's `name`, `datatype` and `shape`.
//! - config: `max_batch_size`; `input[].name` (must match the metadata),
//!   `input[].is_shape_tensor`, `input[].optional`; `output[].name` and
//!   `output[].is_shape_tensor`; `model_transaction_policy.decoupled` (read
//!   unconditionally when the object is present); `response_cache.enable`
//!   (likewise); the presence of `sequence_batching` (stateful models) or
//!   `dynamic_batching` (scheduler type); `platform == "ensemble"` with
//!   `ensemble_scheduling.step[]`. Integers are read with a helper that
//!   accepts JSON numbers and numeric strings alike.
//!
//! What Triton itself emits: the protobuf JSON mapping of `ModelConfig` with
//! field names preserved and every primitive field printed, then its int64
//! fields (`dims`, `reshape.shape`, batching delays, ...) rewritten from the
//! mapping's strings to JSON numbers (`ModelConfigToJson` in
//! triton-inference-server/core). So `dims` are numbers here too; enums are
//! their names (`TYPE_FP32`, `KIND_CPU`, `FORMAT_NONE`).

use baton_core::tensors::signature::{Signature, TensorSpec};
use baton_core::tensors::tensor::DataType;
use serde_json::{Value, json};

/// KServe V2 model metadata:
/// `{"name", "versions": ["1", "2"], "platform", "inputs": [{"name",
/// "datatype", "shape"}], "outputs": [...]}`, shapes with `-1` for variable
/// dimensions.
pub fn model_metadata(name: &str, versions: &[u64], platform: &str, signature: &Signature) -> Value {
    let specs = |specs: &[TensorSpec]| -> Value {
        specs.iter().map(|s| json!({"name": s.name, "datatype": s.datatype.as_str(), "shape": s.shape})).collect()
    };
    json!({
        "name": name,
        "versions": versions.iter().map(u64::to_string).collect::<Vec<_>>(),
        "platform": platform,
        "inputs": specs(&signature.inputs),
        "outputs": specs(&signature.outputs),
    })
}

/// Triton's name for a datatype in a model configuration.
pub fn triton_data_type(dt: DataType) -> &'static str {
    match dt {
        DataType::Bool => "TYPE_BOOL",
        DataType::Uint8 => "TYPE_UINT8",
        DataType::Uint16 => "TYPE_UINT16",
        DataType::Uint32 => "TYPE_UINT32",
        DataType::Uint64 => "TYPE_UINT64",
        DataType::Int8 => "TYPE_INT8",
        DataType::Int16 => "TYPE_INT16",
        DataType::Int32 => "TYPE_INT32",
        DataType::Int64 => "TYPE_INT64",
        DataType::Fp16 => "TYPE_FP16",
        DataType::Fp32 => "TYPE_FP32",
        DataType::Fp64 => "TYPE_FP64",
        DataType::Bytes => "TYPE_STRING",
    }
}

/// Whether every input and output has a variable first dimension, so the
/// model batches along it (Triton's `max_batch_size > 0` convention). A
/// model without inputs is not batched.
pub fn is_batched(signature: &Signature) -> bool {
    signature.is_batched()
}

/// Triton's model configuration JSON (`GET /v2/models/{name}/config`),
/// which Triton's perf_analyzer needs.
///
/// With `max_batch_size > 0` the `dims` exclude the batch dimension; a
/// tensor that has only the batch dimension gets Triton's spelling for it,
/// `dims: [1]` with `reshape: {shape: []}`. With 0 the `dims` are the full
/// shapes, `-1` where variable. `max_batch_size` is honoured only when
/// [`is_batched`] holds (there is no batch dimension to drop otherwise);
/// else the config says 0. It is capped at `i32::MAX` (an int32 field).
///
/// The config describes how baton serves: one instance group of kind
/// `KIND_CPU`, requests run as they come (no `dynamic_batching` and no
/// `sequence_batching`), one response per request (`decoupled: false`), no
/// response cache, the latest version served.
pub fn model_config(name: &str, platform: &str, backend: &str, max_batch_size: usize, signature: &Signature) -> Value {
    let batched = max_batch_size > 0 && is_batched(signature);
    let max_batch_size = if batched { max_batch_size.min(i32::MAX as usize) } else { 0 };
    let inputs: Vec<Value> = signature
        .inputs
        .iter()
        .map(|spec| {
            let mut input = json!({
                "name": spec.name,
                "data_type": triton_data_type(spec.datatype),
                "format": "FORMAT_NONE",
                "dims": [],
                "is_shape_tensor": false,
                "allow_ragged_batch": false,
                "optional": false,
                "is_non_linear_format_io": false,
            });
            set_dims(&mut input, &spec.shape, batched);
            input
        })
        .collect();
    let outputs: Vec<Value> = signature
        .outputs
        .iter()
        .map(|spec| {
            let mut output = json!({
                "name": spec.name,
                "data_type": triton_data_type(spec.datatype),
                "dims": [],
                "label_filename": "",
                "is_shape_tensor": false,
                "is_non_linear_format_io": false,
            });
            set_dims(&mut output, &spec.shape, batched);
            output
        })
        .collect();
    json!({
        "name": name,
        "platform": platform,
        "backend": backend,
        "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max_batch_size,
        "input": inputs,
        "output": outputs,
        "batch_input": [],
        "batch_output": [],
        "instance_group": [{
            "name": name,
            "kind": "KIND_CPU",
            "count": 1,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": false,
            "host_policy": "",
        }],
        "default_model_filename": "",
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": {},
        "model_warmup": [],
        "model_transaction_policy": {"decoupled": false},
        "response_cache": {"enable": false},
    })
}

/// Sets `dims` (and `reshape` for a batch-only tensor) on a config entry.
fn set_dims(entry: &mut Value, shape: &[i64], batched: bool) {
    let dims: &[i64] = if batched { shape.get(1..).unwrap_or_default() } else { shape };
    let dims: Vec<i64> = dims.iter().map(|&d| if d < 0 { -1 } else { d }).collect();
    if batched && dims.is_empty() {
        entry["dims"] = json!([1]);
        entry["reshape"] = json!({"shape": []});
    } else {
        entry["dims"] = json!(dims);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, shape: &[i64]) -> TensorSpec {
        TensorSpec { name: name.into(), datatype: DataType::Fp32, shape: shape.to_vec() }
    }

    #[test]
    fn batched_needs_every_tensor_to_lead_with_a_variable_dim() {
        let sig = Signature { inputs: vec![spec("x", &[-1, 3])], outputs: vec![spec("y", &[-1])] };
        assert!(is_batched(&sig));
        let fixed_out = Signature { inputs: vec![spec("x", &[-1, 3])], outputs: vec![spec("y", &[1])] };
        assert!(!is_batched(&fixed_out));
        let scalar = Signature { inputs: vec![spec("x", &[])], outputs: vec![] };
        assert!(!is_batched(&scalar));
        assert!(!is_batched(&Signature::default()));
    }

    #[test]
    fn triton_names() {
        assert_eq!(triton_data_type(DataType::Bytes), "TYPE_STRING");
        assert_eq!(triton_data_type(DataType::Bool), "TYPE_BOOL");
        for d in DataType::ALL {
            if d != DataType::Bytes {
                assert_eq!(triton_data_type(d), format!("TYPE_{}", d.as_str()));
            }
        }
    }
}
