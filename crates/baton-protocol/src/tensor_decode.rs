//! Turns the tensors of a JSON header (with their binary data, when they
//! have some) into [`Tensor`]s, checking every field and saying which tensor
//! is wrong and how. Shared by request decoding (server side) and response
//! decoding (client side).

use baton_core::tensor::{DataType, Tensor, TensorData, element_count, split_framed};
use baton_core::tensor_json::{f32_to_f16, tensor_from_json};
use serde_json::Value;

use crate::error::CodecError;
use crate::framing::{BinaryCursor, brief};
use crate::wire_json::{Checked, TensorJson};

/// What a JSON `null` element of a floating-point tensor means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NullFloats {
    /// An error: requests must carry numbers.
    Reject,
    /// NaN: baton (like serde_json) writes NaN and ±Inf as `null`.
    AsNan,
}

/// Decodes tensors in order, taking binary data from `cursor` for those
/// that carry `parameters.binary_data_size`. `role` is `input` or `output`.
pub(crate) fn decode_tensors(
    entries: Vec<TensorJson>,
    cursor: &mut BinaryCursor<'_>,
    role: &'static str,
    nulls: NullFloats,
) -> Result<Vec<Tensor>, CodecError> {
    let mut tensors: Vec<Tensor> = Vec::with_capacity(entries.len());
    for (index, entry) in entries.into_iter().enumerate() {
        let tensor = decode_tensor(index, entry, &tensors, cursor, role, nulls)?;
        tensors.push(tensor);
    }
    Ok(tensors)
}

fn decode_tensor(
    index: usize,
    entry: TensorJson,
    earlier: &[Tensor],
    cursor: &mut BinaryCursor<'_>,
    role: &'static str,
    nulls: NullFloats,
) -> Result<Tensor, CodecError> {
    let bad = |message: String| CodecError::InvalidTensor(message);
    let name = match entry.name {
        None => return Err(bad(format!("{role} {index} has no 'name'"))),
        Some(Checked::Invalid(v)) => {
            return Err(bad(format!("{role} {index}: 'name' must be a string, got {}", brief(&v))));
        }
        Some(Checked::Valid(name)) => name,
    };
    if earlier.iter().any(|t| t.name == name) {
        return Err(CodecError::InvalidRequest(format!("{role} '{name}' appears more than once")));
    }
    let datatype = match entry.datatype {
        None => return Err(bad(format!("{role} '{name}' has no 'datatype'"))),
        Some(Checked::Invalid(v)) => {
            return Err(bad(format!("{role} '{name}': 'datatype' must be a string, got {}", brief(&v))));
        }
        Some(Checked::Valid(text)) => DataType::parse(&text).ok_or_else(|| {
            let valid: Vec<&str> = DataType::ALL.iter().map(|d| d.as_str()).collect();
            bad(format!("{role} '{name}': unknown datatype '{text}'; valid datatypes are {}", valid.join(", ")))
        })?,
    };
    let shape = match entry.shape {
        None => return Err(bad(format!("{role} '{name}' has no 'shape'"))),
        Some(Checked::Invalid(v)) => {
            return Err(bad(format!("{role} '{name}': 'shape' must be an array of integers, got {}", brief(&v))));
        }
        Some(Checked::Valid(shape)) => shape,
    };
    if shape.iter().any(|&d| d < 0) {
        return Err(bad(format!(
            "{role} '{name}': shape {shape:?} has a negative dimension; every size must be concrete (0 or more)"
        )));
    }
    let count = element_count(&shape)
        .ok_or_else(|| bad(format!("{role} '{name}': shape {shape:?} holds more elements than can be addressed")))?;
    let binary_size = binary_data_size(role, &name, entry.parameters)?;
    match (entry.data, binary_size) {
        (Some(_), Some(_)) => {
            Err(bad(format!("{role} '{name}' has both 'data' and parameters.binary_data_size; give one or the other")))
        }
        (None, None) => Err(bad(format!("{role} '{name}' has neither 'data' nor parameters.binary_data_size"))),
        (Some(data), None) => from_json(role, name, datatype, shape, count, &data, nulls),
        (None, Some(size)) => from_binary(role, name, datatype, shape, count, size, cursor),
    }
}

/// `parameters.binary_data_size`, when given; other parameters are ignored.
fn binary_data_size(
    role: &str,
    name: &str,
    parameters: Option<Checked<crate::wire_json::Parameters>>,
) -> Result<Option<usize>, CodecError> {
    let parameters = match parameters {
        None => return Ok(None),
        Some(Checked::Invalid(v)) => {
            return Err(CodecError::InvalidTensor(format!(
                "{role} '{name}': 'parameters' must be an object, got {}",
                brief(&v)
            )));
        }
        Some(Checked::Valid(p)) => p,
    };
    let Some(value) = parameters.get("binary_data_size") else { return Ok(None) };
    let size = value.as_u64().ok_or_else(|| {
        CodecError::InvalidTensor(format!(
            "{role} '{name}': parameters.binary_data_size must be a non-negative integer, got {}",
            brief(value)
        ))
    })?;
    usize::try_from(size).map(Some).map_err(|_| {
        CodecError::InvalidBinary(format!("{role} '{name}': binary_data_size {size} is larger than can be addressed"))
    })
}

fn from_json(
    role: &str,
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    count: usize,
    data: &Value,
    nulls: NullFloats,
) -> Result<Tensor, CodecError> {
    // Count first: the conversion reserves room for `count` elements, which
    // a hostile shape could make enormous.
    let found = count_elements(data);
    if found != count {
        return Err(CodecError::InvalidTensor(format!(
            "{role} '{name}': shape {shape:?} needs {count} elements, 'data' has {found}"
        )));
    }
    if nulls == NullFloats::AsNan && datatype.is_float() {
        return floats_from_json(role, name, datatype, shape, count, data);
    }
    tensor_from_json(&name, datatype, shape, data).map_err(|e| {
        // baton-core says "tensor 'x': ..."; say which side it is on.
        CodecError::InvalidTensor(format!("{role} {}", e.strip_prefix("tensor ").unwrap_or(&e)))
    })
}

/// Elements in a flat or nested JSON array (a non-array is one element).
fn count_elements(value: &Value) -> usize {
    match value {
        Value::Array(items) => items.iter().map(count_elements).sum(),
        _ => 1,
    }
}

/// Floating-point JSON data where `null` stands for NaN.
fn floats_from_json(
    role: &str,
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    count: usize,
    data: &Value,
) -> Result<Tensor, CodecError> {
    fn walk(value: &Value, index: &mut usize, out: &mut Vec<f64>) -> Result<(), (usize, String)> {
        match value {
            Value::Array(items) => items.iter().try_for_each(|v| walk(v, index, out)),
            Value::Null => {
                out.push(f64::NAN);
                *index += 1;
                Ok(())
            }
            other => {
                out.push(other.as_f64().ok_or_else(|| (*index, brief(other)))?);
                *index += 1;
                Ok(())
            }
        }
    }
    let mut values = Vec::with_capacity(count);
    walk(data, &mut 0, &mut values).map_err(|(i, v)| {
        CodecError::InvalidTensor(format!("{role} '{name}': element {i} ({v}) is not a valid {datatype}"))
    })?;
    let bytes = match datatype {
        DataType::Fp16 => values.iter().flat_map(|&v| f32_to_f16(v as f32).to_le_bytes()).collect(),
        DataType::Fp32 => values.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    Ok(Tensor { name, datatype, shape, data: TensorData::Raw(bytes) })
}

fn from_binary(
    role: &str,
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    count: usize,
    size: usize,
    cursor: &mut BinaryCursor<'_>,
) -> Result<Tensor, CodecError> {
    let bad = |message: String| CodecError::InvalidBinary(message);
    let data = match datatype.size() {
        Some(element) => {
            let expected = count.checked_mul(element);
            if expected != Some(size) {
                let expected = expected.map_or_else(|| "more".to_owned(), |n| n.to_string());
                return Err(bad(format!(
                    "{role} '{name}': shape {shape:?} of {datatype} needs {expected} bytes, binary_data_size is {size}"
                )));
            }
            let bytes = cursor.take(&name, size)?;
            if datatype == DataType::Bool
                && let Some(i) = bytes.iter().position(|&b| b > 1)
            {
                return Err(bad(format!(
                    "{role} '{name}': BOOL element {i} is {}; binary BOOL elements must be 0 or 1",
                    bytes[i]
                )));
            }
            TensorData::Raw(bytes.to_vec())
        }
        None => {
            let bytes = cursor.take(&name, size)?;
            let items = split_framed(bytes).map_err(|e| bad(format!("{role} '{name}': binary {e}")))?;
            if items.len() != count {
                return Err(bad(format!(
                    "{role} '{name}': binary BYTES data holds {} elements, shape {shape:?} needs {count}",
                    items.len()
                )));
            }
            TensorData::Bytes(items)
        }
    };
    Ok(Tensor { name, datatype, shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_counts() {
        assert_eq!(count_elements(&serde_json::json!([[1, 2], [3, [4, 5]]])), 5);
        assert_eq!(count_elements(&serde_json::json!(7)), 1);
        assert_eq!(count_elements(&serde_json::json!([])), 0);
    }
}
