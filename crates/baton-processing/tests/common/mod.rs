//! Raw feature tensors and readers of the graph's tensors, for the tests.

#![allow(dead_code)]

use baton_core::tensor::{DataType, Tensor, TensorData};
use baton_processing::features::FeatureSpec;

/// The worked example of docs/features.md.
pub const CTR: &str = include_str!("../data/ctr.features.toml");

/// The worked example, parsed.
pub fn ctr() -> FeatureSpec {
    FeatureSpec::parse(CTR).expect("the worked example is valid")
}

/// A `[N]` tensor of fixed-size elements.
fn raw(name: &str, datatype: DataType, bytes: Vec<u8>, rows: usize) -> Tensor {
    Tensor { name: name.into(), datatype, shape: vec![rows as i64], data: TensorData::Raw(bytes) }
}

/// A `[N]` FP32 feature.
pub fn f32s(name: &str, values: &[f32]) -> Tensor {
    raw(name, DataType::Fp32, values.iter().flat_map(|v| v.to_le_bytes()).collect(), values.len())
}

/// A `[N]` FP64 feature.
pub fn f64s(name: &str, values: &[f64]) -> Tensor {
    raw(name, DataType::Fp64, values.iter().flat_map(|v| v.to_le_bytes()).collect(), values.len())
}

/// A `[N]` INT64 feature.
pub fn i64s(name: &str, values: &[i64]) -> Tensor {
    raw(name, DataType::Int64, values.iter().flat_map(|v| v.to_le_bytes()).collect(), values.len())
}

/// A `[N]` BYTES feature.
pub fn texts(name: &str, values: &[&str]) -> Tensor {
    Tensor {
        name: name.into(),
        datatype: DataType::Bytes,
        shape: vec![values.len() as i64],
        data: TensorData::Bytes(values.iter().map(|v| v.as_bytes().to_vec()).collect()),
    }
}

/// An INT64 tensor's elements.
pub fn ids(tensor: &Tensor) -> Vec<i64> {
    assert_eq!(tensor.datatype, DataType::Int64, "{}", tensor.name);
    let TensorData::Raw(bytes) = &tensor.data else { panic!("{} holds byte strings", tensor.name) };
    bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
}
