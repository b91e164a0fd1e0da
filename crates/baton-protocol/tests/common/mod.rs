//! Sample tensors and helpers shared by the integration tests.

#![allow(dead_code)]

use baton_core::tensors::tensor::{DataType, Tensor, TensorData};
use baton_core::tensors::tensor_json::f32_to_f16;

/// A [2, 3] tensor of `datatype` holding that type's awkward values:
/// extremes, negative zero, subnormals, big integers JSON doubles cannot
/// hold, quotes and non-ASCII text.
pub fn sample(name: &str, datatype: DataType) -> Tensor {
    fn raw<const N: usize>(values: impl IntoIterator<Item = [u8; N]>) -> TensorData {
        TensorData::Raw(values.into_iter().flatten().collect())
    }
    let data = match datatype {
        DataType::Bool => TensorData::Raw(vec![1, 0, 1, 1, 0, 0]),
        DataType::Uint8 => TensorData::Raw(vec![0, 1, 127, 128, 254, 255]),
        DataType::Int8 => raw([-128i8, -1, 0, 1, 100, 127].map(i8::to_le_bytes)),
        DataType::Uint16 => raw([0u16, 1, 300, 65535, 1000, 2].map(u16::to_le_bytes)),
        DataType::Int16 => raw([i16::MIN, -1, 0, 1, 12345, i16::MAX].map(i16::to_le_bytes)),
        DataType::Uint32 => raw([0u32, 1, u32::MAX, 1 << 31, 7, 99].map(u32::to_le_bytes)),
        DataType::Int32 => raw([i32::MIN, -1, 0, 1, 1 << 30, i32::MAX].map(i32::to_le_bytes)),
        DataType::Uint64 => raw([0u64, u64::MAX, (1 << 53) + 1, 1, 42, u64::MAX - 1].map(u64::to_le_bytes)),
        DataType::Int64 => raw([i64::MIN, i64::MAX, -(1 << 53) - 1, -1, 0, 1].map(i64::to_le_bytes)),
        DataType::Fp16 => raw([1.0f32, -2.5, 65504.0, 5.960_464_5e-8, 0.0, -0.0].map(|v| f32_to_f16(v).to_le_bytes())),
        DataType::Fp32 => raw([0.1f32, -1e-40, f32::MAX, f32::MIN_POSITIVE, 1e-45, -0.0].map(f32::to_le_bytes)),
        DataType::Fp64 => raw([0.1f64, f64::MAX, 5e-324, -0.0, 1.0 / 3.0, -1e300].map(f64::to_le_bytes)),
        DataType::Bytes => TensorData::Bytes(
            ["", "a", "héllo wörld", "quote\" and \\ backslash", "nul\u{0}", "line\nbreak"]
                .map(|s| s.as_bytes().to_vec())
                .to_vec(),
        ),
    };
    Tensor { name: name.to_owned(), datatype, shape: vec![2, 3], data }
}

/// One sample tensor per datatype, named after it.
pub fn every_datatype() -> Vec<Tensor> {
    DataType::ALL.iter().map(|&d| sample(&format!("t_{}", d.as_str().to_lowercase()), d)).collect()
}

/// A body made of a JSON header and binary data, with the header length.
pub fn with_binary(json: &str, binary: &[u8]) -> (Vec<u8>, Option<usize>) {
    let mut body = json.as_bytes().to_vec();
    body.extend_from_slice(binary);
    (body, Some(json.len()))
}

/// BYTES elements in binary form.
pub fn bytes_binary(items: &[&[u8]]) -> Vec<u8> {
    let items: Vec<Vec<u8>> = items.iter().map(|i| i.to_vec()).collect();
    let mut out = Vec::new();
    baton_core::tensors::tensor::append_framed(&items, &mut out);
    out
}

/// Splits an encoded body into its parsed JSON header and binary tail.
pub fn header_and_tail(body: &[u8], header_length: Option<usize>) -> (serde_json::Value, Vec<u8>) {
    let n = header_length.unwrap_or(body.len());
    (serde_json::from_slice(&body[..n]).expect("header is JSON"), body[n..].to_vec())
}
