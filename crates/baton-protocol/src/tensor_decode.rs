//! Turns the tensors of a JSON header (with their binary data, when they
//! have some) into [`Tensor`]s in two steps, checking every field and
//! saying which tensor is wrong and how. [`parse_tensors`] reads names,
//! datatypes and shapes, takes each tensor's binary data and checks its
//! size, and learns how many bytes each decoded tensor will take, without
//! allocating for any; [`ParsedTensor::decode`] then writes the elements
//! straight into a buffer of exactly that size. Shared by request decoding
//! (server side) and response decoding (client side).

use baton_core::tensors::tensor::{DataType, Tensor, TensorData, element_count, framed_items};
use baton_core::tensors::tensor_json::{ElementsError, NullFloats, check_json_count, elements_from_json};

use crate::error::CodecError;
use crate::framing::{BinaryCursor, brief, brief_text, json_error_at};
use crate::tensor_header::{TensorHeader, bytes_size};
use crate::wire_json::{Checked, Entries, TensorJson, offset_in, parse_entry};

/// One tensor of a header, checked, with its data not decoded yet.
pub(crate) struct ParsedTensor<'a> {
    pub(crate) header: TensorHeader,
    data: Data<'a>,
}

/// Shows the header only: the data may be the size of the body.
impl std::fmt::Debug for ParsedTensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.header.fmt(f)
    }
}

/// Where a tensor's data is: JSON text at an offset of the JSON header, or
/// a slice of the binary data after it.
enum Data<'a> {
    Json { text: &'a str, offset: usize },
    Binary(&'a [u8]),
}

/// Parses tensors in order, taking binary data from `cursor` for those
/// that carry `parameters.binary_data_size`. `json` is the JSON header the
/// entries came from, each parsed only once those before it are checked;
/// `role` is `input` or `output`.
pub(crate) fn parse_tensors<'a>(
    json: &'a [u8],
    entries: Entries<'a>,
    cursor: &mut BinaryCursor<'a>,
    role: &'static str,
) -> Result<Vec<ParsedTensor<'a>>, CodecError> {
    let mut tensors: Vec<ParsedTensor<'a>> = Vec::new();
    for (index, entry) in entries.into_iter().enumerate() {
        let tensor = parse_tensor(json, index, parse_entry(json, entry)?, &tensors, cursor, role)?;
        tensors.push(tensor);
    }
    Ok(tensors)
}

fn parse_tensor<'a>(
    json: &'a [u8],
    index: usize,
    entry: TensorJson<'a>,
    earlier: &[ParsedTensor<'a>],
    cursor: &mut BinaryCursor<'a>,
    role: &'static str,
) -> Result<ParsedTensor<'a>, CodecError> {
    let bad = |message: String| CodecError::InvalidTensor(message);
    let name = match entry.name {
        None => return Err(bad(format!("{role} {index} has no 'name'"))),
        Some(Checked::Invalid(v)) => {
            return Err(bad(format!("{role} {index}: 'name' must be a string, got {}", brief(&v))));
        }
        Some(Checked::Valid(name)) => name,
    };
    if earlier.iter().any(|t| t.header.name() == name) {
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
        (Some(data), None) => {
            let text = data.get();
            let bytes = match datatype.size() {
                Some(size) => count.saturating_mul(size),
                None => bytes_size(count, text.len()),
            };
            let header = TensorHeader::new(name, datatype, shape, count, bytes);
            // The text is a slice of `json`: its offset there locates errors.
            let offset = offset_in(json, text);
            check_json_count(text, count)
                .map_err(|e| elements_error(e, &header, role, NullFloats::Reject, json, offset))?;
            Ok(ParsedTensor { header, data: Data::Json { text, offset } })
        }
        (None, Some(size)) => from_binary(TensorHeader::new(name, datatype, shape, count, size), cursor, role),
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

/// Takes a tensor's binary data and checks its size against the shape (for
/// BYTES, the framing and the element count), without copying it.
///
/// `header` says the data takes `binary_data_size` bytes; for BYTES that
/// becomes the decoded size once the framing has been walked.
fn from_binary<'a>(
    mut header: TensorHeader,
    cursor: &mut BinaryCursor<'a>,
    role: &str,
) -> Result<ParsedTensor<'a>, CodecError> {
    let bad = |message: String| CodecError::InvalidBinary(message);
    let (name, datatype, shape) = (header.name(), header.datatype(), header.shape());
    let (count, size) = (header.element_count(), header.tensor_bytes());
    let bytes = match datatype.size() {
        Some(element) => {
            let expected = count.checked_mul(element);
            if expected != Some(size) {
                let expected = expected.map_or_else(|| "more".to_owned(), |n| n.to_string());
                return Err(bad(format!(
                    "{role} '{name}': shape {shape:?} of {datatype} needs {expected} bytes, binary_data_size is {size}"
                )));
            }
            cursor.take(name, size)?
        }
        None => {
            let bytes = cursor.take(name, size)?;
            let (mut items, mut payload) = (0usize, 0usize);
            for item in framed_items(bytes) {
                payload += item.map_err(|e| bad(format!("{role} '{name}': binary {e}")))?.len();
                items += 1;
            }
            if items != count {
                return Err(bad(format!(
                    "{role} '{name}': binary BYTES data holds {items} elements, shape {shape:?} needs {count}"
                )));
            }
            header.set_bytes(bytes_size(count, payload));
            bytes
        }
    };
    Ok(ParsedTensor { header, data: Data::Binary(bytes) })
}

impl ParsedTensor<'_> {
    /// Decodes the data into the tensor's buffer, checking every element.
    /// `json` is the JSON header given to [`parse_tensors`].
    pub(crate) fn decode(self, json: &[u8], role: &str, nulls: NullFloats) -> Result<Tensor, CodecError> {
        let header = &self.header;
        let (count, datatype) = (header.element_count(), header.datatype());
        let data = match self.data {
            Data::Json { text, offset } => elements_from_json(text, datatype, count, nulls)
                .map_err(|e| elements_error(e, header, role, nulls, json, offset))?,
            Data::Binary(bytes) if datatype == DataType::Bytes => {
                let mut items = Vec::with_capacity(count);
                for item in framed_items(bytes) {
                    // The framing was checked when the header was parsed.
                    items.push(item.map_err(CodecError::InvalidBinary)?.to_vec());
                }
                TensorData::Bytes(items)
            }
            Data::Binary(bytes) => {
                if datatype == DataType::Bool
                    && let Some(i) = bytes.iter().position(|&b| b > 1)
                {
                    return Err(CodecError::InvalidBinary(format!(
                        "{role} '{}': BOOL element {i} is {}; binary BOOL elements must be 0 or 1",
                        header.name(),
                        bytes[i]
                    )));
                }
                TensorData::Raw(bytes.to_vec())
            }
        };
        let (name, datatype, shape) = self.header.into_parts();
        Ok(Tensor { name, datatype, shape, data })
    }
}

/// Says what is wrong with a tensor's JSON data.
fn elements_error(
    error: ElementsError,
    header: &TensorHeader,
    role: &str,
    nulls: NullFloats,
    json: &[u8],
    offset: usize,
) -> CodecError {
    let (name, datatype, shape, count) = (header.name(), header.datatype(), header.shape(), header.element_count());
    match error {
        ElementsError::Count { found } => CodecError::InvalidTensor(format!(
            "{role} '{name}': shape {shape:?} needs {count} elements, 'data' has {found}"
        )),
        ElementsError::Element { index, found } => {
            // Elements where null stands for NaN are shown shortened.
            let found = if nulls == NullFloats::AsNan && datatype.is_float() { brief_text(found) } else { found };
            CodecError::InvalidTensor(format!("{role} '{name}': element {index} ({found}) is not a valid {datatype}"))
        }
        ElementsError::Json(e) => json_error_at(json, offset, &e),
    }
}
