//! Tensor elements as JSON values, in both forms the KServe V2 protocol
//! allows: a flat array in row-major order, or arrays nested by dimension.
//! Used for warmup sample files, and by the REST front end, which decodes
//! request data straight from the body's text ([`elements_from_json`]).

mod elements;

use serde_json::Value;

pub use self::elements::{
    ElementsError, NullFloats, check_json_count, elements_from_json, elements_from_value, max_json_elements,
};
use crate::tensors::tensor::{DataType, Tensor, TensorData, element_count};

/// Builds a tensor from JSON `data`, checking every element against the
/// datatype and the element count against the shape. Messages name the
/// tensor and say what was expected.
pub fn tensor_from_json(name: &str, datatype: DataType, shape: Vec<i64>, data: &Value) -> Result<Tensor, String> {
    tensor_from_json_with(name, datatype, shape, data, NullFloats::Reject)
}

/// [`tensor_from_json`], with `null` elements of a floating-point tensor
/// taken as `nulls` says.
pub fn tensor_from_json_with(
    name: &str,
    datatype: DataType,
    shape: Vec<i64>,
    data: &Value,
    nulls: NullFloats,
) -> Result<Tensor, String> {
    let count = element_count(&shape).ok_or_else(|| format!("tensor '{name}': invalid shape {shape:?}"))?;
    let data = elements_from_value(data, datatype, count, nulls).map_err(|e| match e {
        ElementsError::Count { found } => {
            format!("tensor '{name}': shape {shape:?} needs {count} elements, got {found}")
        }
        ElementsError::Element { index, found } => {
            format!("tensor '{name}': element {index} ({found}) is not a valid {datatype}")
        }
        ElementsError::Json(e) => format!("tensor '{name}': {e}"),
    })?;
    Ok(Tensor { name: name.to_owned(), datatype, shape, data })
}

/// Converts `f32` to IEEE half-precision bits, rounding to nearest even.
pub fn f32_to_f16(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mut frac = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if frac != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        frac |= 0x80_0000;
        let shift = (14 - e) as u32;
        let half = frac >> shift;
        let rest = frac & ((1 << shift) - 1);
        let midpoint = 1 << (shift - 1);
        let round = u32::from(rest > midpoint || (rest == midpoint && half & 1 == 1));
        return sign | (half + round) as u16;
    }
    let half = ((e as u32) << 10) | (frac >> 13);
    let rest = frac & 0x1fff;
    let round = u32::from(rest > 0x1000 || (rest == 0x1000 && half & 1 == 1));
    sign | (half + round) as u16
}

/// The tensor's elements as a flat JSON array.
pub fn tensor_to_json(tensor: &Tensor) -> Value {
    match &tensor.data {
        TensorData::Bytes(items) => {
            Value::Array(items.iter().map(|b| Value::String(String::from_utf8_lossy(b).into_owned())).collect())
        }
        TensorData::Raw(bytes) => {
            let size = tensor.datatype.size().unwrap_or(1);
            Value::Array(bytes.chunks_exact(size).map(|c| decode(tensor.datatype, c)).collect())
        }
    }
}

fn decode(datatype: DataType, b: &[u8]) -> Value {
    let num = |f: f64| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number);
    match datatype {
        DataType::Bool => Value::Bool(b[0] != 0),
        DataType::Uint8 => b[0].into(),
        DataType::Int8 => (b[0] as i8).into(),
        DataType::Uint16 => u16::from_le_bytes([b[0], b[1]]).into(),
        DataType::Int16 => i16::from_le_bytes([b[0], b[1]]).into(),
        DataType::Uint32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]).into(),
        DataType::Int32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]).into(),
        DataType::Uint64 => u64::from_le_bytes(b.try_into().unwrap_or_default()).into(),
        DataType::Int64 => i64::from_le_bytes(b.try_into().unwrap_or_default()).into(),
        DataType::Fp16 => num(f64::from(crate::tensors::tensor::f16_to_f32(u16::from_le_bytes([b[0], b[1]])))),
        DataType::Fp32 => num(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        DataType::Fp64 => num(f64::from_le_bytes(b.try_into().unwrap_or_default())),
        DataType::Bytes => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn flat_and_nested_forms_agree() {
        let flat = tensor_from_json("x", DataType::Fp32, vec![2, 2], &json!([1, 2, 3, 4])).unwrap();
        let nested = tensor_from_json("x", DataType::Fp32, vec![2, 2], &json!([[1, 2], [3, 4]])).unwrap();
        assert_eq!(flat, nested);
        assert_eq!(flat.to_f32().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(tensor_to_json(&flat), json!([1.0, 2.0, 3.0, 4.0]));
    }

    #[test]
    fn every_datatype_round_trips() {
        for datatype in DataType::ALL {
            let data = match datatype {
                DataType::Bool => json!([true, false]),
                DataType::Bytes => json!(["a", "bc"]),
                d if d.is_float() => json!([1.5, -2.0]),
                DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => {
                    json!([7, 0])
                }
                _ => json!([-7, 5]),
            };
            let t = tensor_from_json("t", datatype, vec![2], &data).unwrap();
            t.check_consistent().unwrap();
            assert_eq!(tensor_to_json(&t), data, "{datatype}");
        }
    }

    #[test]
    fn bad_elements_and_counts_are_named() {
        let e = tensor_from_json("x", DataType::Uint8, vec![2], &json!([1, 300])).unwrap_err();
        assert!(e.contains("element 1 (300) is not a valid UINT8"), "{e}");
        let e = tensor_from_json("x", DataType::Fp32, vec![3], &json!([1, 2])).unwrap_err();
        assert!(e.contains("needs 3 elements, got 2"), "{e}");
        assert!(tensor_from_json("x", DataType::Int32, vec![1], &json!(["a"])).is_err());
    }

    #[test]
    fn f16_round_trip_is_exact_for_representable_values() {
        for v in [0.0f32, 1.0, -2.5, 65504.0, 0.000061035156, 1e-7] {
            let back = crate::tensors::tensor::f16_to_f32(f32_to_f16(v));
            assert!((back - v).abs() <= v.abs() * 1e-3 + 6e-8, "{v} -> {back}");
        }
        assert!(crate::tensors::tensor::f16_to_f32(f32_to_f16(1e6)).is_infinite());
    }
}
