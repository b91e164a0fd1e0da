//! Triton's model configuration as a protobuf message, for the ModelConfig
//! RPC. It is built from the very JSON the REST `/config` endpoint serves
//! ([`baton_protocol::model_config`]), so the batch size, dims and reshapes
//! are decided in one place for both protocols.

use serde_json::Value;

use super::pb::model_input::Format;
use super::pb::model_instance_group::Kind;
use super::pb::model_version_policy::{Latest, PolicyChoice};
use super::pb::{
    DataType, ModelConfig, ModelInput, ModelInstanceGroup, ModelOutput, ModelResponseCache, ModelTensorReshape,
    ModelTransactionPolicy, ModelVersionPolicy,
};
use crate::error::{Class, ServeError};

fn text(value: &Value, key: &str) -> String {
    value.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

fn dims(value: Option<&Value>) -> Vec<i64> {
    value.and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_i64).collect()).unwrap_or_default()
}

fn reshape(entry: &Value) -> Option<ModelTensorReshape> {
    entry.get("reshape").map(|r| ModelTensorReshape { shape: dims(r.get("shape")) })
}

fn data_type(entry: &Value) -> Result<i32, ServeError> {
    let name = text(entry, "data_type");
    DataType::from_str_name(&name).map(|d| d as i32).ok_or_else(|| {
        ServeError::new(Class::Internal, "invalid_config", format!("no protobuf data type for '{name}'"))
    })
}

fn entries<'a>(config: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    config.get(key).and_then(Value::as_array).into_iter().flatten()
}

/// Converts the model configuration JSON to the message.
pub fn from_json(config: &Value) -> Result<ModelConfig, ServeError> {
    let input = entries(config, "input")
        .map(|entry| {
            Ok(ModelInput {
                name: text(entry, "name"),
                data_type: data_type(entry)?,
                format: Format::None as i32,
                dims: dims(entry.get("dims")),
                reshape: reshape(entry),
                ..ModelInput::default()
            })
        })
        .collect::<Result<_, ServeError>>()?;
    let output = entries(config, "output")
        .map(|entry| {
            Ok(ModelOutput {
                name: text(entry, "name"),
                data_type: data_type(entry)?,
                dims: dims(entry.get("dims")),
                reshape: reshape(entry),
                ..ModelOutput::default()
            })
        })
        .collect::<Result<_, ServeError>>()?;
    let instance_group = entries(config, "instance_group")
        .map(|group| ModelInstanceGroup {
            name: text(group, "name"),
            kind: Kind::from_str_name(&text(group, "kind")).unwrap_or(Kind::Cpu) as i32,
            count: group.get("count").and_then(Value::as_i64).and_then(|c| i32::try_from(c).ok()).unwrap_or(1),
            ..ModelInstanceGroup::default()
        })
        .collect();
    let max_batch_size = config.get("max_batch_size").and_then(Value::as_i64).unwrap_or(0);
    Ok(ModelConfig {
        name: text(config, "name"),
        platform: text(config, "platform"),
        backend: text(config, "backend"),
        version_policy: Some(ModelVersionPolicy {
            policy_choice: Some(PolicyChoice::Latest(Latest { num_versions: 1 })),
        }),
        max_batch_size: i32::try_from(max_batch_size).unwrap_or(i32::MAX),
        input,
        output,
        instance_group,
        default_model_filename: String::new(),
        model_transaction_policy: Some(ModelTransactionPolicy { decoupled: false }),
        response_cache: Some(ModelResponseCache { enable: false }),
    })
}

#[cfg(test)]
mod tests {
    use baton_core::tensors::signature::{Signature, TensorSpec};
    use baton_core::tensors::tensor::DataType as Dt;

    use super::*;

    fn spec(name: &str, datatype: Dt, shape: &[i64]) -> TensorSpec {
        TensorSpec { name: name.into(), datatype, shape: shape.to_vec() }
    }

    #[test]
    fn batched_config_drops_the_batch_dimension() {
        let signature = Signature {
            inputs: vec![spec("input", Dt::Fp32, &[-1, 8]), spec("ids", Dt::Bytes, &[-1])],
            outputs: vec![spec("output", Dt::Fp32, &[-1, 1])],
        };
        let json = baton_protocol::model_config("ranker", "onnxruntime_onnx", "onnxruntime", 64, &signature);
        let config = from_json(&json).unwrap();
        assert_eq!(config.name, "ranker");
        assert_eq!((config.platform.as_str(), config.backend.as_str()), ("onnxruntime_onnx", "onnxruntime"));
        assert_eq!(config.max_batch_size, 64);
        assert_eq!(config.input[0].dims, vec![8]);
        assert_eq!(config.input[0].data_type, DataType::TypeFp32 as i32);
        assert_eq!(config.input[0].reshape, None);
        assert_eq!(config.input[1].data_type, DataType::TypeString as i32);
        assert_eq!(config.input[1].dims, vec![1]);
        assert_eq!(config.input[1].reshape, Some(ModelTensorReshape { shape: vec![] }));
        assert_eq!(config.output[0].dims, vec![1]);
        assert_eq!(config.instance_group[0].kind, Kind::Cpu as i32);
        assert_eq!(config.instance_group[0].count, 1);
        assert_eq!(config.model_transaction_policy, Some(ModelTransactionPolicy { decoupled: false }));
    }

    #[test]
    fn unbatched_config_keeps_full_shapes() {
        let signature =
            Signature { inputs: vec![spec("x", Dt::Int64, &[3, -1])], outputs: vec![spec("y", Dt::Fp64, &[3])] };
        let json = baton_protocol::model_config("m", "onnxruntime_onnx", "onnxruntime", 0, &signature);
        let config = from_json(&json).unwrap();
        assert_eq!(config.max_batch_size, 0);
        assert_eq!(config.input[0].dims, vec![3, -1]);
        assert_eq!(config.output[0].dims, vec![3]);
        assert_eq!(config.output[0].data_type, DataType::TypeFp64 as i32);
    }
}
