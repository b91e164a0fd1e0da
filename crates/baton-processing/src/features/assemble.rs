//! From the features' columns to the graph's input tensors: the features
//! of one graph input side by side, in file order, one row per request row.

use baton_core::tensor::{DataType, Tensor, TensorData};

use super::transform::Value;
use super::{FeatureSpec, GraphInput};

/// The graph's inputs, in the order the file first names them.
pub(crate) fn assemble(spec: &FeatureSpec, rows: usize, columns: &[Vec<Value>]) -> Vec<Tensor> {
    spec.graph_inputs.iter().map(|input| tensor(input, rows, columns)).collect()
}

/// One graph input: `[rows, width]` (or `[rows]` at rank 1), row-major.
fn tensor(input: &GraphInput, rows: usize, columns: &[Vec<Value>]) -> Tensor {
    let width = input.features.len();
    let size = input.datatype.size().unwrap_or(0);
    let mut data = Vec::with_capacity(rows.saturating_mul(width).saturating_mul(size));
    for row in 0..rows {
        for &feature in &input.features {
            let value = columns[feature].get(row).copied().unwrap_or(Value::Float(0.0));
            push(input.datatype, value, &mut data);
        }
    }
    let rows = i64::try_from(rows).unwrap_or(i64::MAX);
    let shape = if input.rank == 1 { vec![rows] } else { vec![rows, i64::try_from(width).unwrap_or(i64::MAX)] };
    Tensor { name: input.name.clone(), datatype: input.datatype, shape, data: TensorData::Raw(data) }
}

/// Appends one element. Floats round to nearest (`f64` to `f32`); ids are
/// within the datatype by validation. A float never meets an integer
/// input (validation keeps them apart); the conversions exist only so
/// that no value panics.
fn push(datatype: DataType, value: Value, out: &mut Vec<u8>) {
    let (float, id) = match value {
        Value::Float(x) => (x, x as i64),
        Value::Id(i) => (i as f64, i),
    };
    match datatype {
        DataType::Fp64 => out.extend_from_slice(&float.to_le_bytes()),
        DataType::Int64 => out.extend_from_slice(&id.to_le_bytes()),
        DataType::Int32 => out.extend_from_slice(&i32::try_from(id).unwrap_or(i32::MAX).to_le_bytes()),
        _ => out.extend_from_slice(&(float as f32).to_le_bytes()),
    }
}
