//! Tensors between the gRPC messages and [`Tensor`]: the typed
//! `InferTensorContents` fields and the raw little-endian bytes of
//! `raw_input_contents` / `raw_output_contents`.
//!
//! Requests decode in two steps, like REST's: [`parse_request`] checks each
//! input on its own and learns its decoded size, [`Parsed::decode`] packs
//! the typed contents; a server checks the inputs against the model in
//! between. Every error names the tensor and says what was expected and
//! what was found, like the REST codec's.

use baton_core::tensors::signature::{InputError, Signature};
use baton_core::tensors::tensor::{
    DataType, Tensor, TensorData, append_framed, element_count, framed_items, framed_size,
};

use super::pb::model_infer_request::InferInputTensor;
use super::pb::model_infer_response::InferOutputTensor;
use super::pb::{InferTensorContents, ModelInferRequest, ModelInferResponse};
use crate::error::CodecError;
use crate::tensor_header::{TensorHeader, bytes_size, check, total_bytes};

/// A decoded inference request.
#[derive(Debug)]
pub struct Decoded {
    /// Echoed in the response.
    pub id: String,
    /// The inputs, names unique.
    pub inputs: Vec<Tensor>,
    /// The outputs asked for, in request order; empty for all of them.
    pub outputs: Vec<String>,
    /// Whether the inputs came as `raw_input_contents`; the response then
    /// carries `raw_output_contents` too, as Triton's do.
    pub raw: bool,
}

/// A request whose inputs are checked on their own (names, datatypes,
/// shapes, element counts, raw sizes and BYTES framing) and not yet packed
/// into tensors. Made by [`parse_request`]; [`Parsed::decode`] makes the
/// [`Decoded`] request.
///
/// Between the two, a server checks the inputs against the model
/// ([`Parsed::check`]) and reserves the memory packing will take
/// ([`Parsed::tensor_bytes`]).
#[derive(Debug)]
pub struct Parsed {
    /// Echoed in the response.
    pub id: String,
    /// The outputs asked for, in request order; empty for all of them.
    pub outputs: Vec<String>,
    /// Whether the inputs came as `raw_input_contents`.
    pub raw: bool,
    inputs: Vec<ParsedInput>,
}

/// One input, checked, with its elements as they came.
struct ParsedInput {
    header: TensorHeader,
    elements: Elements,
}

enum Elements {
    Raw(Vec<u8>),
    Typed(InferTensorContents),
}

/// Shows the header only: the elements may be the size of the message.
impl std::fmt::Debug for ParsedInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.header.fmt(f)
    }
}

impl Parsed {
    /// The inputs, in request order, names unique, each with the bytes its
    /// decoded tensor holds.
    pub fn inputs(&self) -> impl ExactSizeIterator<Item = &TensorHeader> {
        self.inputs.iter().map(|i| &i.header)
    }

    /// The bytes the decoded inputs hold together (see
    /// [`TensorHeader::tensor_bytes`]). Fixed-size raw contents are moved
    /// into their tensors, not copied; typed contents and raw BYTES are
    /// copied into new buffers of this size.
    pub fn tensor_bytes(&self) -> usize {
        total_bytes(self.inputs())
    }

    /// Checks the inputs against the model, as REST's
    /// [`crate::RequestHeader::check`] does.
    pub fn check(&self, signature: &Signature, max_batch_size: usize) -> Result<(), InputError> {
        check(self.inputs(), signature, max_batch_size)
    }

    /// Packs every input into its tensor, checking each typed element's
    /// range and each raw BOOL byte.
    pub fn decode(self) -> Result<Decoded, CodecError> {
        let Parsed { id, outputs, raw, inputs } = self;
        let inputs = inputs.into_iter().map(ParsedInput::decode).collect::<Result<Vec<Tensor>, CodecError>>()?;
        Ok(Decoded { id, inputs, outputs, raw })
    }
}

fn invalid_tensor(message: String) -> CodecError {
    CodecError::InvalidTensor(message)
}

fn invalid_request(message: String) -> CodecError {
    CodecError::InvalidRequest(message)
}

fn invalid_raw(message: String) -> CodecError {
    CodecError::InvalidBinary(message)
}

/// Decodes the tensors and requested outputs of a request (the model name
/// and version are the caller's): [`parse_request`], then
/// [`Parsed::decode`], with no model to check against in between. Moves
/// fixed-size raw bytes, copying nothing.
pub fn decode_request(request: ModelInferRequest) -> Result<Decoded, CodecError> {
    parse_request(request)?.decode()
}

/// Checks the tensors and requested outputs of a request on their own, and
/// learns the size of every decoded tensor, without packing any.
pub fn parse_request(request: ModelInferRequest) -> Result<Parsed, CodecError> {
    let ModelInferRequest { id, inputs, outputs, raw_input_contents, .. } = request;
    let raw = !raw_input_contents.is_empty();
    if raw && raw_input_contents.len() != inputs.len() {
        return Err(invalid_raw(format!(
            "raw_input_contents has {} entries but the request has {} inputs; give one entry per input, in input order",
            raw_input_contents.len(),
            inputs.len()
        )));
    }
    let mut raw_contents = raw_input_contents.into_iter();
    let mut parsed: Vec<ParsedInput> = Vec::with_capacity(inputs.len());
    for (index, input) in inputs.into_iter().enumerate() {
        let input = parse_input(index, input, raw_contents.next())?;
        if parsed.iter().any(|i| i.header.name() == input.header.name()) {
            return Err(invalid_request(format!("input '{}' appears more than once", input.header.name())));
        }
        parsed.push(input);
    }
    let mut wanted: Vec<String> = Vec::with_capacity(outputs.len());
    for (index, output) in outputs.into_iter().enumerate() {
        if output.name.is_empty() {
            return Err(invalid_request(format!("requested output {index} has no name")));
        }
        if wanted.contains(&output.name) {
            return Err(invalid_request(format!("output '{}' is requested more than once", output.name)));
        }
        wanted.push(output.name);
    }
    Ok(Parsed { id, outputs: wanted, raw, inputs: parsed })
}

fn parse_input(index: usize, input: InferInputTensor, raw: Option<Vec<u8>>) -> Result<ParsedInput, CodecError> {
    let InferInputTensor { name, datatype, shape, contents, .. } = input;
    if name.is_empty() {
        return Err(invalid_tensor(format!("input {index} has no name")));
    }
    let datatype = DataType::parse(&datatype).ok_or_else(|| {
        let valid: Vec<&str> = DataType::ALL.iter().map(|d| d.as_str()).collect();
        invalid_tensor(format!(
            "input '{name}': unknown datatype '{datatype}'; valid datatypes are {}",
            valid.join(", ")
        ))
    })?;
    if shape.iter().any(|&d| d < 0) {
        return Err(invalid_tensor(format!(
            "input '{name}': shape {shape:?} has a negative dimension; every size must be concrete (0 or more)"
        )));
    }
    let count = element_count(&shape).ok_or_else(|| {
        invalid_tensor(format!("input '{name}': shape {shape:?} holds more elements than can be addressed"))
    })?;
    let contents = contents.unwrap_or_default();
    let (bytes, elements) = match raw {
        Some(bytes) => {
            if let Some(field) = filled_fields(&contents).first() {
                return Err(invalid_tensor(format!(
                    "input '{name}' has contents.{field} although the request carries raw_input_contents; \
                     give one or the other"
                )));
            }
            (raw_size(&name, datatype, &shape, count, &bytes)?, Elements::Raw(bytes))
        }
        None => (contents_size(&name, datatype, &shape, count, &contents)?, Elements::Typed(contents)),
    };
    Ok(ParsedInput { header: TensorHeader::new(name, datatype, shape, count, bytes), elements })
}

impl ParsedInput {
    fn decode(self) -> Result<Tensor, CodecError> {
        let name = self.header.name();
        let data = match self.elements {
            Elements::Raw(bytes) => from_raw(name, self.header.datatype(), self.header.element_count(), bytes)?,
            Elements::Typed(contents) => from_contents(name, self.header.datatype(), contents)?,
        };
        let (name, datatype, shape) = self.header.into_parts();
        Ok(Tensor { name, datatype, shape, data })
    }
}

/// The typed field that holds a datatype's elements; `None` for FP16.
fn field_of(datatype: DataType) -> Option<&'static str> {
    Some(match datatype {
        DataType::Bool => "bool_contents",
        DataType::Int8 | DataType::Int16 | DataType::Int32 => "int_contents",
        DataType::Int64 => "int64_contents",
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => "uint_contents",
        DataType::Uint64 => "uint64_contents",
        DataType::Fp32 => "fp32_contents",
        DataType::Fp64 => "fp64_contents",
        DataType::Bytes => "bytes_contents",
        DataType::Fp16 => return None,
    })
}

/// The typed fields that hold elements, and how many each holds.
fn field_lengths(c: &InferTensorContents) -> [(&'static str, usize); 8] {
    [
        ("bool_contents", c.bool_contents.len()),
        ("int_contents", c.int_contents.len()),
        ("int64_contents", c.int64_contents.len()),
        ("uint_contents", c.uint_contents.len()),
        ("uint64_contents", c.uint64_contents.len()),
        ("fp32_contents", c.fp32_contents.len()),
        ("fp64_contents", c.fp64_contents.len()),
        ("bytes_contents", c.bytes_contents.len()),
    ]
}

fn filled_fields(c: &InferTensorContents) -> Vec<&'static str> {
    field_lengths(c).into_iter().filter(|(_, n)| *n > 0).map(|(f, _)| f).collect()
}

/// Packs elements into little-endian bytes, converting each with `convert`;
/// the first element that does not fit is reported by its index.
fn pack<T: Copy + std::fmt::Display, const N: usize>(
    name: &str,
    field: &str,
    datatype: DataType,
    values: &[T],
    convert: impl Fn(T) -> Option<[u8; N]>,
) -> Result<Vec<u8>, CodecError> {
    let mut bytes = Vec::with_capacity(values.len() * N);
    for (i, &value) in values.iter().enumerate() {
        let le = convert(value).ok_or_else(|| {
            invalid_tensor(format!("input '{name}': {field} element {i} is {value}, out of range for {datatype}"))
        })?;
        bytes.extend_from_slice(&le);
    }
    Ok(bytes)
}

/// Checks typed contents against the datatype and shape; the size of the
/// tensor they make.
fn contents_size(
    name: &str,
    datatype: DataType,
    shape: &[i64],
    count: usize,
    contents: &InferTensorContents,
) -> Result<usize, CodecError> {
    let filled = filled_fields(contents);
    let Some(field) = field_of(datatype) else {
        if count == 0 && filled.is_empty() {
            return Ok(0);
        }
        return Err(invalid_tensor(format!(
            "input '{name}': FP16 has no typed contents field; send its elements in raw_input_contents"
        )));
    };
    if let Some(other) = filled.iter().find(|f| **f != field) {
        return Err(invalid_tensor(format!(
            "input '{name}' of datatype {datatype} has {other}; its elements belong in {field}"
        )));
    }
    let got = field_lengths(contents).into_iter().find(|(f, _)| *f == field).map_or(0, |(_, n)| n);
    if got != count {
        return Err(invalid_tensor(format!(
            "input '{name}': shape {shape:?} needs {count} {datatype} elements, {field} holds {got}"
        )));
    }
    Ok(match datatype.size() {
        Some(size) => count * size,
        None => bytes_size(count, contents.bytes_contents.iter().map(Vec::len).fold(0, usize::saturating_add)),
    })
}

/// Packs typed contents, checked by [`contents_size`], into a tensor's data.
fn from_contents(name: &str, datatype: DataType, contents: InferTensorContents) -> Result<TensorData, CodecError> {
    let Some(field) = field_of(datatype) else {
        // FP16 without elements; any other FP16 was refused.
        return Ok(TensorData::Raw(Vec::new()));
    };
    let c = contents;
    let raw = match datatype {
        DataType::Bool => c.bool_contents.iter().map(|&b| u8::from(b)).collect(),
        DataType::Int8 => pack(name, field, datatype, &c.int_contents, |v| i8::try_from(v).ok().map(i8::to_le_bytes))?,
        DataType::Int16 => {
            pack(name, field, datatype, &c.int_contents, |v| i16::try_from(v).ok().map(i16::to_le_bytes))?
        }
        DataType::Int32 => pack(name, field, datatype, &c.int_contents, |v| Some(v.to_le_bytes()))?,
        DataType::Int64 => pack(name, field, datatype, &c.int64_contents, |v| Some(v.to_le_bytes()))?,
        DataType::Uint8 => {
            pack(name, field, datatype, &c.uint_contents, |v| u8::try_from(v).ok().map(u8::to_le_bytes))?
        }
        DataType::Uint16 => {
            pack(name, field, datatype, &c.uint_contents, |v| u16::try_from(v).ok().map(u16::to_le_bytes))?
        }
        DataType::Uint32 => pack(name, field, datatype, &c.uint_contents, |v| Some(v.to_le_bytes()))?,
        DataType::Uint64 => pack(name, field, datatype, &c.uint64_contents, |v| Some(v.to_le_bytes()))?,
        DataType::Fp32 => pack(name, field, datatype, &c.fp32_contents, |v| Some(v.to_le_bytes()))?,
        DataType::Fp64 => pack(name, field, datatype, &c.fp64_contents, |v| Some(v.to_le_bytes()))?,
        DataType::Bytes => return Ok(TensorData::Bytes(c.bytes_contents)),
        DataType::Fp16 => unreachable!("FP16 has no typed field and returned above"),
    };
    Ok(TensorData::Raw(raw))
}

/// Checks raw contents' size against the datatype and shape (for BYTES, the
/// framing and the element count); the size of the tensor they make.
fn raw_size(name: &str, datatype: DataType, shape: &[i64], count: usize, bytes: &[u8]) -> Result<usize, CodecError> {
    let Some(size) = datatype.size() else {
        let (mut items, mut payload) = (0usize, 0usize);
        for item in framed_items(bytes) {
            payload += item.map_err(|e| invalid_raw(format!("input '{name}': raw {e}")))?.len();
            items += 1;
        }
        if items != count {
            return Err(invalid_raw(format!(
                "input '{name}': raw BYTES contents hold {items} elements, shape {shape:?} needs {count}"
            )));
        }
        return Ok(bytes_size(count, payload));
    };
    let expected = count.checked_mul(size);
    if expected != Some(bytes.len()) {
        let expected = expected.map_or_else(|| "more".to_owned(), |n| n.to_string());
        return Err(invalid_raw(format!(
            "input '{name}': shape {shape:?} of {datatype} needs {expected} bytes, its raw contents hold {}",
            bytes.len()
        )));
    }
    Ok(bytes.len())
}

/// Makes a tensor's data of raw contents checked by [`raw_size`].
fn from_raw(name: &str, datatype: DataType, count: usize, bytes: Vec<u8>) -> Result<TensorData, CodecError> {
    if datatype == DataType::Bytes {
        let mut items = Vec::with_capacity(count);
        for item in framed_items(&bytes) {
            items.push(item.map_err(|e| invalid_raw(format!("input '{name}': raw {e}")))?.to_vec());
        }
        return Ok(TensorData::Bytes(items));
    }
    if datatype == DataType::Bool
        && let Some(i) = bytes.iter().position(|&b| b > 1)
    {
        return Err(invalid_raw(format!(
            "input '{name}': BOOL element {i} is {}; raw BOOL elements must be 0 or 1",
            bytes[i]
        )));
    }
    Ok(TensorData::Raw(bytes))
}

/// Builds the response: the requested outputs in request order (all of them,
/// in model order, when none were requested), as raw contents when `raw`
/// is set or an FP16 output has no typed field to go in, else as typed
/// contents.
pub fn encode_response(
    model: &str,
    version: u64,
    id: String,
    outputs: Vec<Tensor>,
    requested: &[String],
    raw: bool,
) -> Result<ModelInferResponse, CodecError> {
    let selected: Vec<Tensor> = if requested.is_empty() {
        outputs
    } else {
        let available: Vec<String> = outputs.iter().map(|t| t.name.clone()).collect();
        let mut outputs: Vec<Option<Tensor>> = outputs.into_iter().map(Some).collect();
        let mut selected = Vec::with_capacity(requested.len());
        for wanted in requested {
            let found =
                outputs.iter_mut().find(|t| t.as_ref().is_some_and(|t| &t.name == wanted)).and_then(Option::take);
            let Some(tensor) = found else {
                return Err(CodecError::UnknownOutput { name: wanted.clone(), available });
            };
            selected.push(tensor);
        }
        selected
    };
    for tensor in &selected {
        tensor.check_consistent().map_err(CodecError::InvalidOutput)?;
    }
    let raw = raw || selected.iter().any(|t| field_of(t.datatype).is_none());
    let mut response = ModelInferResponse {
        model_name: model.to_owned(),
        model_version: version.to_string(),
        id,
        ..ModelInferResponse::default()
    };
    for tensor in selected {
        let mut entry = InferOutputTensor {
            name: tensor.name,
            datatype: tensor.datatype.as_str().to_owned(),
            shape: tensor.shape,
            ..InferOutputTensor::default()
        };
        if raw {
            response.raw_output_contents.push(to_raw(&entry.name, tensor.data)?);
        } else {
            entry.contents = Some(to_contents(tensor.datatype, tensor.data));
        }
        response.outputs.push(entry);
    }
    Ok(response)
}

fn to_raw(name: &str, data: TensorData) -> Result<Vec<u8>, CodecError> {
    match data {
        TensorData::Raw(bytes) => Ok(bytes),
        TensorData::Bytes(items) => {
            let size = framed_size(&items).ok_or_else(|| {
                CodecError::InvalidOutput(format!(
                    "output '{name}' has a BYTES element longer than the 4-byte length prefix can say"
                ))
            })?;
            let mut out = Vec::with_capacity(size);
            append_framed(&items, &mut out);
            Ok(out)
        }
    }
}

fn unpack<T, const N: usize>(bytes: &[u8], from: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes.chunks_exact(N).map(|c| from(c.try_into().unwrap_or([0; N]))).collect()
}

/// Typed contents of a consistent tensor (checked by the caller) of any
/// datatype but FP16.
fn to_contents(datatype: DataType, data: TensorData) -> InferTensorContents {
    let mut c = InferTensorContents::default();
    let bytes = match data {
        TensorData::Bytes(items) => {
            c.bytes_contents = items;
            return c;
        }
        TensorData::Raw(bytes) => bytes,
    };
    match datatype {
        DataType::Bool => c.bool_contents = bytes.iter().map(|&b| b != 0).collect(),
        DataType::Int8 => c.int_contents = unpack(&bytes, |b| i32::from(i8::from_le_bytes(b))),
        DataType::Int16 => c.int_contents = unpack(&bytes, |b| i32::from(i16::from_le_bytes(b))),
        DataType::Int32 => c.int_contents = unpack(&bytes, i32::from_le_bytes),
        DataType::Int64 => c.int64_contents = unpack(&bytes, i64::from_le_bytes),
        DataType::Uint8 => c.uint_contents = bytes.iter().map(|&b| u32::from(b)).collect(),
        DataType::Uint16 => c.uint_contents = unpack(&bytes, |b| u32::from(u16::from_le_bytes(b))),
        DataType::Uint32 => c.uint_contents = unpack(&bytes, u32::from_le_bytes),
        DataType::Uint64 => c.uint64_contents = unpack(&bytes, u64::from_le_bytes),
        DataType::Fp32 => c.fp32_contents = unpack(&bytes, f32::from_le_bytes),
        DataType::Fp64 => c.fp64_contents = unpack(&bytes, f64::from_le_bytes),
        DataType::Fp16 | DataType::Bytes => {}
    }
    c
}

#[cfg(test)]
mod tests {
    use baton_core::tensors::signature::TensorSpec;

    use super::*;
    use crate::grpc::pb::model_infer_request::InferRequestedOutputTensor;

    fn input(name: &str, datatype: &str, shape: &[i64], contents: Option<InferTensorContents>) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
            contents,
            ..InferInputTensor::default()
        }
    }

    fn request(inputs: Vec<InferInputTensor>, raw: Vec<Vec<u8>>) -> ModelInferRequest {
        ModelInferRequest { inputs, raw_input_contents: raw, ..ModelInferRequest::default() }
    }

    fn message(result: Result<Decoded, CodecError>) -> String {
        let e = result.unwrap_err();
        assert!(e.is_client_error(), "{e}");
        e.to_string()
    }

    /// One value per datatype, typed and raw, decodes to the same bytes and
    /// encodes back to the same contents.
    #[test]
    fn typed_and_raw_agree_for_every_datatype() {
        let cases: Vec<(DataType, InferTensorContents, Vec<u8>)> = vec![
            (
                DataType::Bool,
                InferTensorContents { bool_contents: vec![true, false], ..Default::default() },
                vec![1, 0],
            ),
            (DataType::Int8, InferTensorContents { int_contents: vec![-2, 3], ..Default::default() }, vec![0xfe, 3]),
            (
                DataType::Int16,
                InferTensorContents { int_contents: vec![-2, 3], ..Default::default() },
                [(-2i16).to_le_bytes(), 3i16.to_le_bytes()].concat(),
            ),
            (
                DataType::Int32,
                InferTensorContents { int_contents: vec![-2, 3], ..Default::default() },
                [(-2i32).to_le_bytes(), 3i32.to_le_bytes()].concat(),
            ),
            (
                DataType::Int64,
                InferTensorContents { int64_contents: vec![-2, 3], ..Default::default() },
                [(-2i64).to_le_bytes(), 3i64.to_le_bytes()].concat(),
            ),
            (DataType::Uint8, InferTensorContents { uint_contents: vec![2, 255], ..Default::default() }, vec![2, 255]),
            (
                DataType::Uint16,
                InferTensorContents { uint_contents: vec![2, 65535], ..Default::default() },
                [2u16.to_le_bytes(), 65535u16.to_le_bytes()].concat(),
            ),
            (
                DataType::Uint32,
                InferTensorContents { uint_contents: vec![2, 7], ..Default::default() },
                [2u32.to_le_bytes(), 7u32.to_le_bytes()].concat(),
            ),
            (
                DataType::Uint64,
                InferTensorContents { uint64_contents: vec![2, u64::MAX], ..Default::default() },
                [2u64.to_le_bytes(), u64::MAX.to_le_bytes()].concat(),
            ),
            (
                DataType::Fp32,
                InferTensorContents { fp32_contents: vec![0.5, -1.25], ..Default::default() },
                [0.5f32.to_le_bytes(), (-1.25f32).to_le_bytes()].concat(),
            ),
            (
                DataType::Fp64,
                InferTensorContents { fp64_contents: vec![0.5, -1.25], ..Default::default() },
                [0.5f64.to_le_bytes(), (-1.25f64).to_le_bytes()].concat(),
            ),
        ];
        for (datatype, contents, raw) in cases {
            let dt = datatype.as_str();
            let typed = decode_request(request(vec![input("x", dt, &[2], Some(contents.clone()))], vec![])).unwrap();
            assert_eq!(typed.inputs[0].data, TensorData::Raw(raw.clone()), "{dt} typed");
            assert!(!typed.raw);
            let from_raw = decode_request(request(vec![input("x", dt, &[2], None)], vec![raw.clone()])).unwrap();
            assert_eq!(from_raw.inputs[0].data, TensorData::Raw(raw.clone()), "{dt} raw");
            assert!(from_raw.raw);
            let back = encode_response("m", 1, String::new(), typed.inputs.clone(), &[], false).unwrap();
            assert_eq!(back.outputs[0].contents.as_ref(), Some(&contents), "{dt} typed out");
            let back = encode_response("m", 1, String::new(), typed.inputs, &[], true).unwrap();
            assert_eq!(back.raw_output_contents, vec![raw], "{dt} raw out");
            assert_eq!(back.outputs[0].contents, None);
        }
    }

    #[test]
    fn bytes_typed_and_raw() {
        let items = vec![b"ab".to_vec(), Vec::new(), b"xyz".to_vec()];
        let contents = InferTensorContents { bytes_contents: items.clone(), ..Default::default() };
        let typed = decode_request(request(vec![input("s", "BYTES", &[3], Some(contents))], vec![])).unwrap();
        assert_eq!(typed.inputs[0].data, TensorData::Bytes(items.clone()));
        let raw = [&2u32.to_le_bytes()[..], b"ab", &0u32.to_le_bytes(), &3u32.to_le_bytes(), b"xyz"].concat();
        let decoded = decode_request(request(vec![input("s", "BYTES", &[3], None)], vec![raw.clone()])).unwrap();
        assert_eq!(decoded.inputs[0].data, TensorData::Bytes(items));
        let back = encode_response("m", 1, String::new(), decoded.inputs, &[], true).unwrap();
        assert_eq!(back.raw_output_contents, vec![raw.clone()]);
        let e = message(decode_request(request(
            vec![input("s", "BYTES", &[3], None)],
            vec![raw[..raw.len() - 1].to_vec()],
        )));
        assert_eq!(e, "input 's': raw BYTES element 2 says it has 3 bytes but only 2 remain");
        let e = message(decode_request(request(vec![input("s", "BYTES", &[4], None)], vec![raw])));
        assert!(e.contains("hold 3 elements, shape [4] needs 4"), "{e}");
    }

    #[test]
    fn fp16_travels_raw_only() {
        let raw = [0x3c00u16.to_le_bytes(), 0xc000u16.to_le_bytes()].concat();
        let decoded = decode_request(request(vec![input("h", "FP16", &[2], None)], vec![raw.clone()])).unwrap();
        assert_eq!(decoded.inputs[0].data, TensorData::Raw(raw.clone()));
        let e = message(decode_request(request(vec![input("h", "FP16", &[2], None)], vec![])));
        assert!(e.contains("input 'h': FP16 has no typed contents field"), "{e}");
        // A typed request still gets FP16 outputs, as raw contents.
        let back = encode_response("m", 1, String::new(), decoded.inputs, &[], false).unwrap();
        assert_eq!(back.raw_output_contents, vec![raw]);
    }

    #[test]
    fn errors_name_the_tensor_and_say_expected_and_got() {
        let short = InferTensorContents { fp32_contents: vec![1.0; 3], ..Default::default() };
        let e = message(decode_request(request(vec![input("x", "FP32", &[2, 2], Some(short))], vec![])));
        assert_eq!(e, "input 'x': shape [2, 2] needs 4 FP32 elements, fp32_contents holds 3");
        let wrong = InferTensorContents { int_contents: vec![1; 4], ..Default::default() };
        let e = message(decode_request(request(vec![input("x", "FP32", &[2, 2], Some(wrong))], vec![])));
        assert_eq!(e, "input 'x' of datatype FP32 has int_contents; its elements belong in fp32_contents");
        let big = InferTensorContents { int_contents: vec![1, 300], ..Default::default() };
        let e = message(decode_request(request(vec![input("x", "INT8", &[2], Some(big))], vec![])));
        assert_eq!(e, "input 'x': int_contents element 1 is 300, out of range for INT8");
        let e = message(decode_request(request(vec![input("x", "FP32", &[2], None)], vec![vec![0; 7]])));
        assert_eq!(e, "input 'x': shape [2] of FP32 needs 8 bytes, its raw contents hold 7");
        let e = message(decode_request(request(vec![input("x", "FLOAT", &[2], None)], vec![])));
        assert!(e.starts_with("input 'x': unknown datatype 'FLOAT'; valid datatypes are BOOL,"), "{e}");
        let e = message(decode_request(request(vec![input("x", "FP32", &[-1, 2], None)], vec![])));
        assert!(e.contains("input 'x': shape [-1, 2] has a negative dimension"), "{e}");
        let e = message(decode_request(request(vec![input("b", "BOOL", &[1], None)], vec![vec![2]])));
        assert_eq!(e, "input 'b': BOOL element 0 is 2; raw BOOL elements must be 0 or 1");
        let e = message(decode_request(request(
            vec![input("x", "FP32", &[1], None), input("y", "FP32", &[1], None)],
            vec![vec![0; 4]],
        )));
        assert!(e.contains("raw_input_contents has 1 entries but the request has 2 inputs"), "{e}");
        let both = InferTensorContents { fp32_contents: vec![1.0], ..Default::default() };
        let e = message(decode_request(request(vec![input("x", "FP32", &[1], Some(both))], vec![vec![0; 4]])));
        assert!(e.contains("input 'x' has contents.fp32_contents although the request carries raw_input_contents"));
        let e = message(decode_request(request(
            vec![input("x", "FP32", &[0], None), input("x", "FP32", &[0], None)],
            vec![],
        )));
        assert_eq!(e, "input 'x' appears more than once");
        let mut twice = request(vec![], vec![]);
        twice.outputs = vec![
            InferRequestedOutputTensor { name: "y".into(), ..Default::default() },
            InferRequestedOutputTensor { name: "y".into(), ..Default::default() },
        ];
        assert_eq!(message(decode_request(twice)), "output 'y' is requested more than once");
    }

    #[test]
    fn requests_are_checked_against_the_model_before_packing() {
        let spec =
            |name: &str, datatype, shape: &[i64]| TensorSpec { name: name.into(), datatype, shape: shape.to_vec() };
        let signature = Signature {
            inputs: vec![spec("x", DataType::Fp32, &[-1, 2]), spec("s", DataType::Bytes, &[-1])],
            outputs: vec![spec("y", DataType::Fp32, &[-1])],
        };
        let fp32 = InferTensorContents { fp32_contents: vec![0.5; 6], ..Default::default() };
        let strings = InferTensorContents { bytes_contents: vec![b"abc".to_vec(); 3], ..Default::default() };
        let typed =
            request(vec![input("x", "FP32", &[3, 2], Some(fp32)), input("s", "BYTES", &[3], Some(strings))], vec![]);
        let parsed = parse_request(typed.clone()).unwrap();
        assert_eq!(parsed.tensor_bytes(), 24 + 3 * size_of::<Vec<u8>>() + 9);
        let shapes: Vec<(&str, &[i64])> = parsed.inputs().map(|t| (t.name(), t.shape())).collect();
        assert_eq!(shapes, [("x", &[3, 2][..]), ("s", &[3][..])]);
        let e = parsed.check(&signature, 2).unwrap_err();
        assert_eq!(e.to_string(), "input 'x': batch size 3 exceeds the model's max_batch_size 2");
        assert_eq!(parse_request(typed).unwrap().check(&signature, 3), Ok(()));

        // Raw contents: the size is known, the bytes are moved.
        let framed = [&2u32.to_le_bytes()[..], b"xy"].concat();
        let raw =
            request(vec![input("x", "FP32", &[1, 2], None), input("s", "BYTES", &[1], None)], vec![vec![0; 8], framed]);
        let parsed = parse_request(raw).unwrap();
        assert_eq!(parsed.tensor_bytes(), 8 + size_of::<Vec<u8>>() + 2);
        let decoded = parsed.decode().unwrap();
        assert_eq!(decoded.inputs[1].data, TensorData::Bytes(vec![b"xy".to_vec()]));

        // An element out of range is found by packing, after the check.
        let ints = InferTensorContents { int_contents: vec![300], ..Default::default() };
        let parsed = parse_request(request(vec![input("i", "INT8", &[1], Some(ints))], vec![])).unwrap();
        assert_eq!(parsed.tensor_bytes(), 1);
        assert_eq!(message(parsed.decode()), "input 'i': int_contents element 0 is 300, out of range for INT8");
    }

    #[test]
    fn requested_outputs_are_selected_and_ordered() {
        let outputs = || vec![Tensor::from_f32("a", vec![1], &[1.0]), Tensor::from_f32("b", vec![1], &[2.0])];
        let r = encode_response("m", 2, "id".into(), outputs(), &["b".into(), "a".into()], false).unwrap();
        let names: Vec<&str> = r.outputs.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["b", "a"]);
        assert_eq!((r.model_name.as_str(), r.model_version.as_str(), r.id.as_str()), ("m", "2", "id"));
        let r = encode_response("m", 2, String::new(), outputs(), &["b".into()], true).unwrap();
        assert_eq!(r.outputs.len(), 1);
        assert_eq!(r.raw_output_contents, vec![2.0f32.to_le_bytes().to_vec()]);
        let e = encode_response("m", 2, String::new(), outputs(), &["a".into(), "zz".into()], false).unwrap_err();
        assert_eq!(e.kind(), "unknown_output");
        assert_eq!(e.to_string(), "unknown output 'zz'; the model's outputs are [\"a\", \"b\"]");
    }

    #[test]
    fn an_inconsistent_output_is_internal() {
        let mut bad = Tensor::from_f32("a", vec![1], &[1.0]);
        bad.shape = vec![2];
        let e = encode_response("m", 1, String::new(), vec![bad], &[], false).unwrap_err();
        assert_eq!(e.kind(), "invalid_output");
        assert!(!e.is_client_error());
    }
}
