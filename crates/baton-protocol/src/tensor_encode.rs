//! Writes tensors for the wire: the JSON entry of a tensor (`name`,
//! `datatype`, `shape`, then flat `data` or `parameters.binary_data_size`)
//! and its binary form. The JSON data is serialized straight from the
//! tensor's bytes, element by element, without building a
//! `serde_json::Value` per element.
//!
//! Floating-point NaN and ±Inf have no JSON representation; they are
//! written as `null` (serde_json's convention). The binary form is exact.

use baton_core::tensors::tensor::{DataType, Tensor, TensorData, append_framed, f16_to_f32, framed_size};
use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};

/// A tensor as one entry of `inputs` (request) or `outputs` (response).
pub(crate) struct TensorEntry<'a> {
    /// The tensor.
    pub(crate) tensor: &'a Tensor,
    /// `Some(size)` when its data travels as binary after the JSON header.
    pub(crate) binary_size: Option<usize>,
}

#[derive(Serialize)]
struct BinaryParameters {
    binary_data_size: usize,
}

impl Serialize for TensorEntry<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("name", &self.tensor.name)?;
        map.serialize_entry("datatype", self.tensor.datatype.as_str())?;
        map.serialize_entry("shape", &self.tensor.shape)?;
        match self.binary_size {
            Some(size) => map.serialize_entry("parameters", &BinaryParameters { binary_data_size: size })?,
            None => map.serialize_entry("data", &FlatData(self.tensor))?,
        }
        map.end()
    }
}

/// A tensor's elements as a flat JSON array.
struct FlatData<'a>(&'a Tensor);

impl Serialize for FlatData<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let bytes = match &self.0.data {
            TensorData::Bytes(items) => {
                // JSON strings are Unicode: bytes that are not UTF-8 are
                // replaced (U+FFFD); use the binary form for exact bytes.
                return serializer.collect_seq(items.iter().map(|b| String::from_utf8_lossy(b)));
            }
            TensorData::Raw(bytes) => bytes,
        };
        match self.0.datatype {
            DataType::Bool => serializer.collect_seq(bytes.iter().map(|&b| b != 0)),
            DataType::Uint8 | DataType::Bytes => serializer.collect_seq(bytes),
            DataType::Int8 => serializer.collect_seq(bytes.iter().map(|&b| b as i8)),
            DataType::Uint16 => elements(serializer, bytes, u16::from_le_bytes),
            DataType::Int16 => elements(serializer, bytes, i16::from_le_bytes),
            DataType::Uint32 => elements(serializer, bytes, u32::from_le_bytes),
            DataType::Int32 => elements(serializer, bytes, i32::from_le_bytes),
            DataType::Uint64 => elements(serializer, bytes, u64::from_le_bytes),
            DataType::Int64 => elements(serializer, bytes, i64::from_le_bytes),
            DataType::Fp16 => elements(serializer, bytes, |b: [u8; 2]| f16_to_f32(u16::from_le_bytes(b))),
            DataType::Fp32 => elements(serializer, bytes, f32::from_le_bytes),
            DataType::Fp64 => elements(serializer, bytes, f64::from_le_bytes),
        }
    }
}

/// Serializes little-endian elements of `N` bytes; a trailing partial
/// element (an inconsistent tensor) is dropped.
fn elements<S: Serializer, T: Serialize, const N: usize>(
    serializer: S,
    bytes: &[u8],
    decode: impl Fn([u8; N]) -> T,
) -> Result<S::Ok, S::Error> {
    let chunks = bytes.chunks_exact(N);
    let mut seq = serializer.serialize_seq(Some(chunks.len()))?;
    for chunk in chunks {
        let mut array = [0u8; N];
        array.copy_from_slice(chunk);
        seq.serialize_element(&decode(array))?;
    }
    seq.end()
}

/// The size of a tensor's binary form, or `None` when a BYTES element is
/// too long for its 4-byte length prefix.
pub(crate) fn binary_size(tensor: &Tensor) -> Option<usize> {
    match &tensor.data {
        TensorData::Raw(bytes) => Some(bytes.len()),
        TensorData::Bytes(items) => framed_size(items),
    }
}

/// Appends a tensor's binary form: raw little-endian elements, or framed
/// BYTES elements ([`append_framed`]); callers check [`binary_size`] first
/// where an overlong element matters.
pub(crate) fn append_binary(tensor: &Tensor, out: &mut Vec<u8>) {
    match &tensor.data {
        TensorData::Raw(bytes) => out.extend_from_slice(bytes),
        TensorData::Bytes(items) => append_framed(items, out),
    }
}

/// A rough size of a tensor's JSON data, to reserve the output buffer.
pub(crate) fn json_size_hint(tensor: &Tensor) -> usize {
    match &tensor.data {
        TensorData::Raw(bytes) => bytes.len() / tensor.datatype.size().unwrap_or(1) * 12,
        TensorData::Bytes(items) => items.iter().map(|i| i.len() + 3).sum(),
    }
}

/// Writes a value as JSON into `out`. Serializing into a `Vec` fails only
/// when a `Serialize` implementation reports an error or a map key is not a
/// string; the types of this crate do neither.
pub(crate) fn write_json<T: Serialize>(out: &mut Vec<u8>, value: &T) -> Result<(), serde_json::Error> {
    value.serialize(&mut serde_json::Serializer::new(out))
}

#[cfg(test)]
mod tests {
    use baton_core::tensors::tensor_json::tensor_to_json;
    use serde_json::Value;

    use super::*;

    fn entry_json(tensor: &Tensor) -> Value {
        let mut out = Vec::new();
        write_json(&mut out, &TensorEntry { tensor, binary_size: None }).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn direct_writer_agrees_with_baton_core_for_every_datatype() {
        for datatype in DataType::ALL {
            let data = match datatype {
                DataType::Bytes => TensorData::Bytes(vec![b"a\"b".to_vec(), vec![0xff]]),
                DataType::Bool => TensorData::Raw(vec![1, 0]),
                d => TensorData::Raw((0..2 * d.size().unwrap()).map(|i| (i * 37 + 1) as u8).collect()),
            };
            let tensor = Tensor { name: "t".into(), datatype, shape: vec![2], data };
            let json = entry_json(&tensor);
            let reference = tensor_to_json(&tensor);
            if datatype == DataType::Fp32 || datatype == DataType::Fp16 {
                // baton-core widens to f64 before writing; compare as f32.
                let ours: Vec<f32> =
                    json["data"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
                let theirs: Vec<f32> =
                    reference.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
                assert_eq!(ours, theirs, "{datatype}");
            } else {
                assert_eq!(json["data"], reference, "{datatype}");
            }
            assert_eq!(json["datatype"], datatype.as_str());
        }
    }

    #[test]
    fn non_finite_floats_become_null() {
        let tensor = Tensor::from_f32("x", vec![3], &[f32::NAN, f32::INFINITY, 1.5]);
        assert_eq!(entry_json(&tensor)["data"], serde_json::json!([null, null, 1.5]));
    }

    #[test]
    fn binary_sizes() {
        let bytes = Tensor {
            name: "s".into(),
            datatype: DataType::Bytes,
            shape: vec![2],
            data: TensorData::Bytes(vec![b"ab".to_vec(), vec![]]),
        };
        assert_eq!(binary_size(&bytes), Some(10));
        let mut out = Vec::new();
        append_binary(&bytes, &mut out);
        assert_eq!(out, [2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
    }
}
