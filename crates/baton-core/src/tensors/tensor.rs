//! Tensors as they cross baton's boundaries: a name, a datatype, a shape and
//! the element bytes, little-endian. One representation for every protocol
//! and engine keeps conversions at the edges and out of the core.

use serde::{Deserialize, Serialize};

/// The tensor datatypes of the KServe V2 / Open Inference Protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DataType {
    /// Boolean, one byte per element.
    #[serde(rename = "BOOL")]
    Bool,
    /// Unsigned 8-bit integer.
    #[serde(rename = "UINT8")]
    Uint8,
    /// Unsigned 16-bit integer.
    #[serde(rename = "UINT16")]
    Uint16,
    /// Unsigned 32-bit integer.
    #[serde(rename = "UINT32")]
    Uint32,
    /// Unsigned 64-bit integer.
    #[serde(rename = "UINT64")]
    Uint64,
    /// Signed 8-bit integer.
    #[serde(rename = "INT8")]
    Int8,
    /// Signed 16-bit integer.
    #[serde(rename = "INT16")]
    Int16,
    /// Signed 32-bit integer.
    #[serde(rename = "INT32")]
    Int32,
    /// Signed 64-bit integer.
    #[serde(rename = "INT64")]
    Int64,
    /// IEEE 754 half precision.
    #[serde(rename = "FP16")]
    Fp16,
    /// IEEE 754 single precision.
    #[serde(rename = "FP32")]
    Fp32,
    /// IEEE 754 double precision.
    #[serde(rename = "FP64")]
    Fp64,
    /// Variable-length byte strings.
    #[serde(rename = "BYTES")]
    Bytes,
}

impl DataType {
    /// Every datatype, for exhaustive tests and listings.
    pub const ALL: [DataType; 13] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bytes,
    ];

    /// The protocol name, e.g. `FP32`.
    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    /// Parses a protocol name such as `FP32`.
    pub fn parse(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.as_str() == name)
    }

    /// Bytes per element, or `None` for variable-length `BYTES`.
    pub fn size(self) -> Option<usize> {
        match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => Some(1),
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 => Some(2),
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => Some(4),
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => Some(8),
            DataType::Bytes => None,
        }
    }

    /// Whether the type is a floating-point type (NaN and Inf exist).
    pub fn is_float(self) -> bool {
        matches!(self, DataType::Fp16 | DataType::Fp32 | DataType::Fp64)
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The elements of a tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// Fixed-size elements, little-endian, densely packed in row-major order.
    Raw(Vec<u8>),
    /// One byte string per element, for `BYTES`.
    Bytes(Vec<Vec<u8>>),
}

/// A named tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Input or output name.
    pub name: String,
    /// Element datatype.
    pub datatype: DataType,
    /// Dimensions; all non-negative for a concrete tensor.
    pub shape: Vec<i64>,
    /// The elements.
    pub data: TensorData,
}

/// Number of elements a shape holds, or `None` when a dimension is negative
/// or the product overflows.
pub fn element_count(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d).ok()?;
        acc.checked_mul(d)
    })
}

impl Tensor {
    /// An FP32 tensor from values.
    pub fn from_f32(name: impl Into<String>, shape: Vec<i64>, values: &[f32]) -> Tensor {
        Tensor {
            name: name.into(),
            datatype: DataType::Fp32,
            shape,
            data: TensorData::Raw(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        }
    }

    /// The bytes its elements take in memory (for BYTES, each element's
    /// bytes and the vector that holds them).
    pub fn data_bytes(&self) -> usize {
        match &self.data {
            TensorData::Raw(bytes) => bytes.len(),
            TensorData::Bytes(items) => {
                items.iter().map(|i| i.len() + std::mem::size_of::<Vec<u8>>()).fold(0, usize::saturating_add)
            }
        }
    }

    /// The elements as `f32`, when the tensor is FP32.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        match (&self.data, self.datatype) {
            (TensorData::Raw(bytes), DataType::Fp32) => {
                Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            _ => None,
        }
    }

    /// Checks that the data agrees with the datatype and shape, and says
    /// exactly what disagrees.
    pub fn check_consistent(&self) -> Result<(), String> {
        self.view().check_consistent()
    }

    /// The tensor, borrowed.
    pub fn view(&self) -> TensorView<'_> {
        let data = match &self.data {
            TensorData::Raw(bytes) => ViewData::Raw(bytes),
            TensorData::Bytes(items) => ViewData::Bytes(items.iter().map(Vec::as_slice).collect()),
        };
        TensorView { name: &self.name, datatype: self.datatype, shape: &self.shape, data }
    }
}

/// A tensor whose parts are borrowed: how a worker hands its engine the
/// inputs where they lie in shared memory, and how an engine lends its
/// outputs to be written there, with no copy of their own.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorView<'a> {
    /// Input or output name.
    pub name: &'a str,
    /// Element datatype.
    pub datatype: DataType,
    /// Dimensions.
    pub shape: &'a [i64],
    /// The elements.
    pub data: ViewData<'a>,
}

/// The elements of a [`TensorView`].
#[derive(Clone, Debug, PartialEq)]
pub enum ViewData<'a> {
    /// Fixed-size elements, little-endian, densely packed in row-major order.
    Raw(&'a [u8]),
    /// One byte string per element, for `BYTES`.
    Bytes(Vec<&'a [u8]>),
}

impl TensorView<'_> {
    /// A tensor of its own: the elements copied.
    pub fn to_tensor(&self) -> Tensor {
        let data = match &self.data {
            ViewData::Raw(bytes) => TensorData::Raw(bytes.to_vec()),
            ViewData::Bytes(items) => TensorData::Bytes(items.iter().map(|i| i.to_vec()).collect()),
        };
        Tensor { name: self.name.to_owned(), datatype: self.datatype, shape: self.shape.to_vec(), data }
    }

    /// The bytes its elements take (for BYTES, the elements' bytes alone).
    pub fn len(&self) -> usize {
        match &self.data {
            ViewData::Raw(bytes) => bytes.len(),
            ViewData::Bytes(items) => items.iter().map(|i| i.len()).fold(0, usize::saturating_add),
        }
    }

    /// Whether its elements take no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks that the data agrees with the datatype and shape, and says
    /// exactly what disagrees.
    pub fn check_consistent(&self) -> Result<(), String> {
        let count = element_count(self.shape)
            .ok_or_else(|| format!("tensor '{}': shape {:?} is not a valid concrete shape", self.name, self.shape))?;
        match (&self.data, self.datatype.size()) {
            (ViewData::Raw(bytes), Some(size)) => {
                let expected = count.saturating_mul(size);
                if bytes.len() != expected {
                    return Err(format!(
                        "tensor '{}': shape {:?} of {} needs {} bytes, got {}",
                        self.name,
                        self.shape,
                        self.datatype,
                        expected,
                        bytes.len()
                    ));
                }
            }
            (ViewData::Bytes(items), None) => {
                if items.len() != count {
                    return Err(format!(
                        "tensor '{}': shape {:?} needs {} elements, got {}",
                        self.name,
                        self.shape,
                        count,
                        items.len()
                    ));
                }
            }
            _ => {
                return Err(format!(
                    "tensor '{}': data representation does not match datatype {}",
                    self.name, self.datatype
                ));
            }
        }
        Ok(())
    }
}

/// The size of BYTES elements in their framed form (each a 4-byte
/// little-endian length, then its bytes), or `None` when an element is too
/// long for its length prefix.
pub fn framed_size(items: &[Vec<u8>]) -> Option<usize> {
    items.iter().try_fold(0usize, |total, item| {
        u32::try_from(item.len()).ok()?;
        total.checked_add(4 + item.len())
    })
}

/// Appends BYTES elements in their framed form: each a 4-byte little-endian
/// length, then its bytes. This is the one framing of BYTES on every wire
/// baton speaks (REST binary data, gRPC raw contents). An element longer
/// than `u32::MAX` gets a saturated (wrong) length; callers that can meet
/// one check [`framed_size`] first.
pub fn append_framed(items: &[Vec<u8>], out: &mut Vec<u8>) {
    for item in items {
        out.extend_from_slice(&u32::try_from(item.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(item);
    }
}

/// Splits framed BYTES elements (see [`append_framed`]). The error says
/// where the framing breaks, starting with "BYTES", so that callers can
/// prefix the tensor and the wire it came on.
pub fn split_framed(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    framed_items(bytes).map(|item| item.map(<[u8]>::to_vec)).collect()
}

/// The framed BYTES elements of `bytes` (see [`append_framed`]) as slices
/// of it, in order, without allocating: for counting and sizing elements
/// before copying them. An item is an error, worded as [`split_framed`]'s,
/// where the framing breaks; nothing follows it.
pub fn framed_items(bytes: &[u8]) -> FramedItems<'_> {
    FramedItems { rest: bytes, index: 0 }
}

/// The iterator of [`framed_items`].
#[derive(Clone, Debug)]
pub struct FramedItems<'a> {
    rest: &'a [u8],
    index: usize,
}

impl<'a> Iterator for FramedItems<'a> {
    type Item = Result<&'a [u8], String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let index = self.index;
        self.index += 1;
        let Some((prefix, rest)) = self.rest.split_first_chunk::<4>() else {
            let remain = std::mem::take(&mut self.rest).len();
            return Some(Err(format!(
                "BYTES data ends inside the 4-byte length prefix of element {index} ({remain} bytes remain)"
            )));
        };
        let len = u32::from_le_bytes(*prefix) as usize;
        if len > rest.len() {
            self.rest = &[];
            return Some(Err(format!("BYTES element {index} says it has {len} bytes but only {} remain", rest.len())));
        }
        let (item, rest) = rest.split_at(len);
        self.rest = rest;
        Some(Ok(item))
    }
}

/// Converts IEEE half-precision bits to `f32`.
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits >> 15) << 31;
    let exp = u32::from((bits >> 10) & 0x1f);
    let frac = u32::from(bits & 0x3ff);
    let magnitude = match exp {
        0 => {
            // Zero or subnormal: value = frac * 2^-24.
            let value = frac as f32 * 2f32.powi(-24);
            return if sign == 0 { value } else { -value };
        }
        0x1f => 0xff << 23 | frac << 13,
        _ => (exp + 127 - 15) << 23 | frac << 13,
    };
    f32::from_bits(sign | magnitude)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framed_bytes_round_trip_and_breaks_are_located() {
        let items = vec![b"ab".to_vec(), Vec::new(), b"xyz".to_vec()];
        let mut framed = Vec::new();
        append_framed(&items, &mut framed);
        assert_eq!(framed_size(&items), Some(framed.len()));
        assert_eq!(split_framed(&framed).unwrap(), items);
        let e = split_framed(&framed[..framed.len() - 1]).unwrap_err();
        assert_eq!(e, "BYTES element 2 says it has 3 bytes but only 2 remain");
        let e = split_framed(&framed[..8]).unwrap_err();
        assert_eq!(e, "BYTES data ends inside the 4-byte length prefix of element 1 (2 bytes remain)");
    }

    #[test]
    fn datatype_names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::parse(d.as_str()), Some(d));
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(json, format!("\"{}\"", d.as_str()));
        }
        assert_eq!(DataType::parse("FLOAT"), None);
    }

    #[test]
    fn consistency_names_the_tensor_and_sizes() {
        let mut t = Tensor::from_f32("x", vec![2, 2], &[1.0, 2.0, 3.0, 4.0]);
        assert!(t.check_consistent().is_ok());
        t.shape = vec![2, 3];
        let err = t.check_consistent().unwrap_err();
        assert!(err.contains("'x'") && err.contains("24") && err.contains("16"), "{err}");
        t.shape = vec![-1, 2];
        assert!(t.check_consistent().is_err());
    }

    #[test]
    fn f16_conversion_covers_special_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x0000), 0.0);
    }
}
