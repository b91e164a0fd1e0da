//! Conversions between baton's [`Tensor`] (little-endian bytes) and ONNX
//! Runtime values, for every datatype both sides know.

use baton_core::run::backend::BackendError;
use baton_core::tensors::tensor::{DataType, Tensor, TensorData, TensorView, ViewData};
use half::f16;
use ort::value::{DynValue, TensorElementType, ValueType};

/// The baton datatype of an ORT element type, if baton has one.
pub(crate) fn datatype_of(ty: TensorElementType) -> Option<DataType> {
    Some(match ty {
        TensorElementType::Bool => DataType::Bool,
        TensorElementType::Uint8 => DataType::Uint8,
        TensorElementType::Uint16 => DataType::Uint16,
        TensorElementType::Uint32 => DataType::Uint32,
        TensorElementType::Uint64 => DataType::Uint64,
        TensorElementType::Int8 => DataType::Int8,
        TensorElementType::Int16 => DataType::Int16,
        TensorElementType::Int32 => DataType::Int32,
        TensorElementType::Int64 => DataType::Int64,
        TensorElementType::Float16 => DataType::Fp16,
        TensorElementType::Float32 => DataType::Fp32,
        TensorElementType::Float64 => DataType::Fp64,
        TensorElementType::String => DataType::Bytes,
        _ => return None,
    })
}

/// The baton datatype of an ONNX `TensorProto.DataType`, if baton has one.
pub(crate) fn datatype_of_onnx(data_type: i32) -> Option<DataType> {
    use crate::proto::elem;
    Some(match data_type {
        elem::FLOAT => DataType::Fp32,
        elem::UINT8 => DataType::Uint8,
        elem::INT8 => DataType::Int8,
        elem::UINT16 => DataType::Uint16,
        elem::INT16 => DataType::Int16,
        elem::INT32 => DataType::Int32,
        elem::INT64 => DataType::Int64,
        elem::STRING => DataType::Bytes,
        elem::BOOL => DataType::Bool,
        elem::FLOAT16 => DataType::Fp16,
        elem::DOUBLE => DataType::Fp64,
        elem::UINT32 => DataType::Uint32,
        elem::UINT64 => DataType::Uint64,
        _ => return None,
    })
}

fn invalid_input(message: String) -> BackendError {
    BackendError::new("invalid_input", message)
}

fn failed(message: String) -> BackendError {
    BackendError::new("inference_failed", message)
}

/// Splits little-endian bytes into `N`-byte elements. The caller has checked
/// that the length is a multiple of `N`.
fn decode<T, const N: usize>(bytes: &[u8], from_le: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|chunk| {
            let mut element = [0u8; N];
            element.copy_from_slice(chunk);
            from_le(element)
        })
        .collect()
}

/// Joins elements into little-endian bytes.
fn encode<T: Copy, const N: usize>(values: &[T], to_le: fn(T) -> [u8; N]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(values.len() * N);
    for value in values {
        bytes.extend_from_slice(&to_le(*value));
    }
    bytes
}

/// Makes an ORT value of a request tensor. Fails with `invalid_input` when the
/// data does not agree with the datatype and shape, or (for `BYTES`) an
/// element is not UTF-8 without NUL bytes, which is all an ORT string tensor
/// can hold.
pub(crate) fn to_ort(tensor: &TensorView<'_>) -> Result<DynValue, BackendError> {
    tensor.check_consistent().map_err(invalid_input)?;
    let shape = tensor.shape.to_vec();
    let name = tensor.name;
    let created = match (&tensor.data, tensor.datatype) {
        (ViewData::Raw(b), DataType::Fp32) => typed(shape, decode(b, f32::from_le_bytes)),
        (ViewData::Raw(b), DataType::Fp64) => typed(shape, decode(b, f64::from_le_bytes)),
        (ViewData::Raw(b), DataType::Fp16) => typed(shape, decode(b, f16::from_le_bytes)),
        (ViewData::Raw(b), DataType::Int8) => typed(shape, decode(b, i8::from_le_bytes)),
        (ViewData::Raw(b), DataType::Int16) => typed(shape, decode(b, i16::from_le_bytes)),
        (ViewData::Raw(b), DataType::Int32) => typed(shape, decode(b, i32::from_le_bytes)),
        (ViewData::Raw(b), DataType::Int64) => typed(shape, decode(b, i64::from_le_bytes)),
        (ViewData::Raw(b), DataType::Uint8) => typed(shape, b.to_vec()),
        (ViewData::Raw(b), DataType::Uint16) => typed(shape, decode(b, u16::from_le_bytes)),
        (ViewData::Raw(b), DataType::Uint32) => typed(shape, decode(b, u32::from_le_bytes)),
        (ViewData::Raw(b), DataType::Uint64) => typed(shape, decode(b, u64::from_le_bytes)),
        (ViewData::Raw(b), DataType::Bool) => typed(shape, b.iter().map(|&v| v != 0).collect::<Vec<bool>>()),
        (ViewData::Bytes(items), DataType::Bytes) => {
            let mut strings = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let text = std::str::from_utf8(item).ok().filter(|s| !s.contains('\0')).ok_or_else(|| {
                    invalid_input(format!(
                        "input '{name}': element {i} is not UTF-8 text without NUL bytes, \
                             which is all an ONNX string tensor can hold"
                    ))
                })?;
                strings.push(text.to_owned());
            }
            ort::value::Tensor::from_string_array((shape, strings.as_slice())).map(|t| t.into_dyn())
        }
        // check_consistent refuses every other pairing.
        _ => {
            return Err(invalid_input(format!(
                "input '{name}': data representation does not match datatype {}",
                tensor.datatype
            )));
        }
    };
    created.map_err(|e| invalid_input(format!("input '{name}': {e}")))
}

fn typed<T>(shape: Vec<i64>, values: Vec<T>) -> ort::Result<DynValue>
where
    T: ort::value::PrimitiveTensorElementType + std::fmt::Debug + Clone + 'static,
{
    ort::value::Tensor::from_array((shape, values)).map(|t| t.into_dyn())
}

/// Lends an ORT output value to `out` as a view of the engine's own
/// buffer, with no copy: on a little-endian machine an element's bytes in
/// memory are its wire bytes. Elsewhere, and for `BYTES`, through
/// [`from_ort`].
pub(crate) fn lend_ort(name: &str, value: &DynValue, out: &mut dyn FnMut(&TensorView<'_>)) -> Result<(), BackendError> {
    let datatype = match value.dtype() {
        ValueType::Tensor { ty, .. } => datatype_of(*ty),
        _ => None,
    };
    let extract = |e: ort::Error| failed(format!("reading output '{name}': {e}"));
    let lend = |shape: &[i64], bytes: &[u8], datatype: DataType, out: &mut dyn FnMut(&TensorView<'_>)| {
        out(&TensorView { name, datatype, shape, data: ViewData::Raw(bytes) });
    };
    macro_rules! lent {
        ($t:ty, $datatype:expr) => {{
            let (shape, values) = value.try_extract_tensor::<$t>().map_err(extract)?;
            let shape: Vec<i64> = shape.iter().copied().collect();
            lend(&shape, plain::as_bytes(values), $datatype, out);
            return Ok(());
        }};
    }
    if cfg!(target_endian = "little") {
        match datatype {
            Some(DataType::Fp32) => lent!(f32, DataType::Fp32),
            Some(DataType::Fp64) => lent!(f64, DataType::Fp64),
            Some(DataType::Fp16) => lent!(f16, DataType::Fp16),
            Some(DataType::Int8) => lent!(i8, DataType::Int8),
            Some(DataType::Int16) => lent!(i16, DataType::Int16),
            Some(DataType::Int32) => lent!(i32, DataType::Int32),
            Some(DataType::Int64) => lent!(i64, DataType::Int64),
            Some(DataType::Uint8) => lent!(u8, DataType::Uint8),
            Some(DataType::Uint16) => lent!(u16, DataType::Uint16),
            Some(DataType::Uint32) => lent!(u32, DataType::Uint32),
            Some(DataType::Uint64) => lent!(u64, DataType::Uint64),
            Some(DataType::Bool) => lent!(bool, DataType::Bool),
            Some(DataType::Bytes) | None => {}
        }
    }
    out(&from_ort(name, value)?.view());
    Ok(())
}

/// Element slices seen as their bytes.
mod plain {
    use half::f16;

    /// Element types with no padding, every byte of which is initialized.
    pub(super) trait Plain: Copy {}
    macro_rules! plain {
        ($($t:ty),*) => { $(impl Plain for $t {})* };
    }
    plain!(f32, f64, f16, i8, i16, i32, i64, u8, u16, u32, u64, bool);

    /// The bytes `values` take in memory.
    #[allow(unsafe_code)]
    pub(super) fn as_bytes<T: Plain>(values: &[T]) -> &[u8] {
        // SAFETY: a `Plain` type has no padding and every byte of a value
        // is initialized; `u8` needs no alignment; the length is the
        // slice's size in bytes; the result borrows `values`.
        unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
    }
}

/// Makes a response tensor of an ORT output value.
pub(crate) fn from_ort(name: &str, value: &DynValue) -> Result<Tensor, BackendError> {
    let ValueType::Tensor { ty, shape, .. } = value.dtype() else {
        return Err(BackendError::new(
            "unsupported_datatype",
            format!("output '{name}' is a {}, not a tensor", value.dtype()),
        ));
    };
    let ty = *ty;
    let shape: Vec<i64> = shape.iter().copied().collect();
    let datatype = datatype_of(ty).ok_or_else(|| {
        BackendError::new(
            "unsupported_datatype",
            format!("output '{name}' has element type {ty}, which baton cannot return"),
        )
    })?;
    let extract = |e: ort::Error| failed(format!("reading output '{name}': {e}"));
    let raw = |bytes: Vec<u8>| Ok::<_, BackendError>(TensorData::Raw(bytes));
    let data = match datatype {
        DataType::Fp32 => raw(encode(value.try_extract_tensor::<f32>().map_err(extract)?.1, f32::to_le_bytes))?,
        DataType::Fp64 => raw(encode(value.try_extract_tensor::<f64>().map_err(extract)?.1, f64::to_le_bytes))?,
        DataType::Fp16 => raw(encode(value.try_extract_tensor::<f16>().map_err(extract)?.1, f16::to_le_bytes))?,
        DataType::Int8 => raw(encode(value.try_extract_tensor::<i8>().map_err(extract)?.1, i8::to_le_bytes))?,
        DataType::Int16 => raw(encode(value.try_extract_tensor::<i16>().map_err(extract)?.1, i16::to_le_bytes))?,
        DataType::Int32 => raw(encode(value.try_extract_tensor::<i32>().map_err(extract)?.1, i32::to_le_bytes))?,
        DataType::Int64 => raw(encode(value.try_extract_tensor::<i64>().map_err(extract)?.1, i64::to_le_bytes))?,
        DataType::Uint8 => raw(value.try_extract_tensor::<u8>().map_err(extract)?.1.to_vec())?,
        DataType::Uint16 => raw(encode(value.try_extract_tensor::<u16>().map_err(extract)?.1, u16::to_le_bytes))?,
        DataType::Uint32 => raw(encode(value.try_extract_tensor::<u32>().map_err(extract)?.1, u32::to_le_bytes))?,
        DataType::Uint64 => raw(encode(value.try_extract_tensor::<u64>().map_err(extract)?.1, u64::to_le_bytes))?,
        DataType::Bool => {
            raw(value.try_extract_tensor::<bool>().map_err(extract)?.1.iter().map(|&b| u8::from(b)).collect())?
        }
        DataType::Bytes => {
            let (_, strings) = value.try_extract_strings().map_err(extract)?;
            TensorData::Bytes(strings.into_iter().map(String::into_bytes).collect())
        }
    };
    Ok(Tensor { name: name.to_owned(), datatype, shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn little_endian_helpers_round_trip() {
        let values = [1.5f32, -0.0, f32::MAX, f32::MIN_POSITIVE];
        let bytes = encode(&values, f32::to_le_bytes);
        assert_eq!(bytes.len(), 16);
        assert_eq!(&bytes[..4], &1.5f32.to_le_bytes());
        assert_eq!(decode(&bytes, f32::from_le_bytes), values);
        let ints = [i64::MIN, -1, 0, i64::MAX];
        assert_eq!(decode(&encode(&ints, i64::to_le_bytes), i64::from_le_bytes), ints);
    }

    #[test]
    fn onnx_and_ort_types_map_to_the_same_datatypes() {
        use crate::proto::elem;
        let pairs = [
            (elem::FLOAT, TensorElementType::Float32),
            (elem::UINT8, TensorElementType::Uint8),
            (elem::INT8, TensorElementType::Int8),
            (elem::UINT16, TensorElementType::Uint16),
            (elem::INT16, TensorElementType::Int16),
            (elem::INT32, TensorElementType::Int32),
            (elem::INT64, TensorElementType::Int64),
            (elem::STRING, TensorElementType::String),
            (elem::BOOL, TensorElementType::Bool),
            (elem::FLOAT16, TensorElementType::Float16),
            (elem::DOUBLE, TensorElementType::Float64),
            (elem::UINT32, TensorElementType::Uint32),
            (elem::UINT64, TensorElementType::Uint64),
        ];
        for (onnx, ort) in pairs {
            assert!(datatype_of(ort).is_some());
            assert_eq!(datatype_of_onnx(onnx), datatype_of(ort), "{onnx}");
        }
        assert_eq!(pairs.len(), DataType::ALL.len());
        assert_eq!(datatype_of_onnx(16), None); // bfloat16
        assert_eq!(datatype_of(TensorElementType::Bfloat16), None);
    }
}
