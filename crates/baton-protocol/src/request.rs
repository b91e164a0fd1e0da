//! Inference requests as the server receives them:
//! `POST /v2/models/{name}[/versions/{v}]/infer`, parsed first and decoded
//! second, so that the model check and the memory reservation come before
//! any tensor is allocated.

use baton_core::tensors::signature::{InputError, Signature};
use baton_core::tensors::tensor::Tensor;
use baton_core::tensors::tensor_json::NullFloats;
use serde_json::{Map, Value};

use crate::error::CodecError;
use crate::framing::{BinaryCursor, brief, parse_header, split};
use crate::tensor_decode::{ParsedTensor, parse_tensors};
use crate::tensor_header::{TensorHeader, check, total_bytes};
use crate::wire_json::{Checked, Entries, RequestJson, RequestedOutputJson, parse_entry};

/// A decoded inference request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InferRequest {
    /// The request's `id`, echoed in the response. Any JSON string,
    /// including the empty one Triton's clients send.
    pub id: Option<String>,
    /// The input tensors, in request order, names unique.
    pub inputs: Vec<Tensor>,
    /// The outputs asked for, in request order, names unique; empty means
    /// every output.
    pub outputs: Vec<RequestedOutput>,
    /// Request-level `parameters.binary_data_output`: return every output
    /// as binary data unless the output itself says otherwise.
    pub binary_data_output: bool,
    /// Every request-level parameter as given (`binary_data_output`
    /// included), for the front end to interpret or ignore.
    pub parameters: Map<String, Value>,
}

/// One entry of a request's `outputs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestedOutput {
    /// Output name.
    pub name: String,
    /// `parameters.binary_data`: `Some(true)` for binary data, `Some(false)`
    /// for JSON even when the request asks for binary outputs, `None` to
    /// follow the request.
    pub binary_data: Option<bool>,
}

impl RequestedOutput {
    /// An output asked for by name, in whichever form the request chooses.
    pub fn new(name: impl Into<String>) -> RequestedOutput {
        RequestedOutput { name: name.into(), binary_data: None }
    }

    /// An output asked for by name, as binary data (`true`) or JSON.
    pub fn with_binary(name: impl Into<String>, binary: bool) -> RequestedOutput {
        RequestedOutput { name: name.into(), binary_data: Some(binary) }
    }
}

/// An inference request whose JSON header is parsed and checked, and whose
/// tensor data is not decoded yet: it stays in the body, which this
/// borrows. Made by [`parse_request`]; [`RequestHeader::decode`] makes the
/// [`InferRequest`].
///
/// Between the two, a server checks the inputs against the model
/// ([`RequestHeader::check`]) and reserves the memory decoding will take
/// ([`RequestHeader::tensor_bytes`]): nothing has been allocated for tensor
/// data yet.
pub struct RequestHeader<'body> {
    /// The request's `id`, as in [`InferRequest::id`].
    pub id: Option<String>,
    /// The outputs asked for, as in [`InferRequest::outputs`].
    pub outputs: Vec<RequestedOutput>,
    /// As in [`InferRequest::binary_data_output`].
    pub binary_data_output: bool,
    /// As in [`InferRequest::parameters`].
    pub parameters: Map<String, Value>,
    json: &'body [u8],
    inputs: Vec<ParsedTensor<'body>>,
}

/// Leaves out the body, which may be large.
impl std::fmt::Debug for RequestHeader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestHeader")
            .field("id", &self.id)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .field("binary_data_output", &self.binary_data_output)
            .field("parameters", &self.parameters)
            .finish_non_exhaustive()
    }
}

impl<'body> RequestHeader<'body> {
    /// The inputs, in request order, names unique, each with the bytes its
    /// decoded tensor will take.
    pub fn inputs(&self) -> impl ExactSizeIterator<Item = &TensorHeader> {
        self.inputs.iter().map(|t| &t.header)
    }

    /// The bytes [`RequestHeader::decode`] allocates for all the inputs'
    /// data together (see [`TensorHeader::tensor_bytes`]).
    pub fn tensor_bytes(&self) -> usize {
        total_bytes(self.inputs())
    }

    /// Checks the inputs against the model: names, datatypes, shapes, and
    /// for a model that batches, that the inputs agree on the batch size
    /// and that it is at most `max_batch_size` (0: no limit). See
    /// [`Signature::check_request`]. Element counts were checked against
    /// the data where that is cheap (binary sizes, and JSON data too short
    /// to hold them); the rest is checked while decoding.
    pub fn check(&self, signature: &Signature, max_batch_size: usize) -> Result<(), InputError> {
        check(self.inputs(), signature, max_batch_size)
    }

    /// Decodes every input's data straight into its tensor's buffer,
    /// checking each element against the datatype and the element count
    /// against the shape.
    pub fn decode(self) -> Result<InferRequest, CodecError> {
        let RequestHeader { id, outputs, binary_data_output, parameters, json, inputs } = self;
        let inputs = inputs
            .into_iter()
            .map(|t| t.decode(json, "input", NullFloats::Reject))
            .collect::<Result<Vec<Tensor>, CodecError>>()?;
        Ok(InferRequest { id, inputs, outputs, binary_data_output, parameters })
    }
}

/// Parses an inference request body, without decoding its tensor data.
///
/// `header_length` is the value of the `Inference-Header-Content-Length`
/// HTTP header, when present: the JSON header is `body[..n]` and the rest is
/// the binary tensor data of the inputs that carry
/// `parameters.binary_data_size`, concatenated in input order.
///
/// Every input needs `name`, `datatype` and a concrete `shape`, and exactly
/// one of `data` (flat or nested JSON) or `parameters.binary_data_size`;
/// input parameters other than `binary_data_size` are ignored. Binary data
/// must be exactly as long as the sizes say: none missing, none left over.
/// The whole header must be JSON; tensor data is kept as text, not parsed
/// into values.
pub fn parse_request(body: &[u8], header_length: Option<usize>) -> Result<RequestHeader<'_>, CodecError> {
    let (json, binary) = split(body, header_length)?;
    let header: RequestJson<'_> = parse_header(json, header_length)?;
    let invalid = CodecError::InvalidRequest;
    let id = match header.id {
        None => None,
        Some(Checked::Valid(id)) => Some(id),
        Some(Checked::Invalid(v)) => return Err(invalid(format!("'id' must be a string, got {}", brief(&v)))),
    };
    let parameters = match header.parameters {
        None => Map::new(),
        Some(Checked::Valid(p)) => p,
        Some(Checked::Invalid(v)) => {
            return Err(invalid(format!("request 'parameters' must be an object, got {}", brief(&v))));
        }
    };
    let binary_data_output = match parameters.get("binary_data_output") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(invalid(format!("parameters.binary_data_output must be true or false, got {}", brief(v))));
        }
    };
    let entries = header.inputs.ok_or_else(|| invalid("the request has no 'inputs' array".to_owned()))?;
    let mut cursor = BinaryCursor::new(binary, header_length, "input");
    let inputs = parse_tensors(json, entries, &mut cursor, "input")?;
    cursor.finish()?;
    let outputs = requested_outputs(json, header.outputs.unwrap_or_default())?;
    Ok(RequestHeader { id, outputs, binary_data_output, parameters, json, inputs })
}

/// Decodes an inference request body: [`parse_request`], then
/// [`RequestHeader::decode`], with no model to check against in between.
/// Each tensor's data is decoded once, out of the body, into a buffer of
/// exactly its size.
pub fn decode_request(body: &[u8], header_length: Option<usize>) -> Result<InferRequest, CodecError> {
    parse_request(body, header_length)?.decode()
}

fn requested_outputs(json: &[u8], entries: Entries<'_>) -> Result<Vec<RequestedOutput>, CodecError> {
    let invalid = CodecError::InvalidRequest;
    let mut outputs: Vec<RequestedOutput> = Vec::new();
    for (index, entry) in entries.into_iter().enumerate() {
        let entry: RequestedOutputJson = parse_entry(json, entry)?;
        let name = match entry.name {
            None => return Err(invalid(format!("requested output {index} has no 'name'"))),
            Some(Checked::Invalid(v)) => {
                return Err(invalid(format!("requested output {index}: 'name' must be a string, got {}", brief(&v))));
            }
            Some(Checked::Valid(name)) => name,
        };
        if outputs.iter().any(|o| o.name == name) {
            return Err(invalid(format!("output '{name}' is requested more than once")));
        }
        let binary_data = match entry.parameters {
            None => None,
            Some(Checked::Invalid(v)) => {
                return Err(invalid(format!(
                    "requested output '{name}': 'parameters' must be an object, got {}",
                    brief(&v)
                )));
            }
            Some(Checked::Valid(p)) => match p.get("binary_data") {
                None => None,
                Some(Value::Bool(b)) => Some(*b),
                Some(v) => {
                    return Err(invalid(format!(
                        "requested output '{name}': parameters.binary_data must be true or false, got {}",
                        brief(v)
                    )));
                }
            },
        };
        outputs.push(RequestedOutput { name, binary_data });
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use baton_core::tensors::tensor::{DataType, TensorData};

    use super::*;

    #[test]
    fn json_request_with_everything() {
        let body = br#"{"id":"r1","parameters":{"binary_data_output":true,"priority":2},
            "inputs":[{"name":"x","datatype":"INT32","shape":[2],"data":[1,-2],"parameters":{"other":1}}],
            "outputs":[{"name":"y"},{"name":"z","parameters":{"binary_data":false}}]}"#;
        let r = decode_request(body, None).unwrap();
        assert_eq!(r.id.as_deref(), Some("r1"));
        assert!(r.binary_data_output);
        assert_eq!(r.parameters["priority"], 2);
        assert_eq!(r.outputs, vec![RequestedOutput::new("y"), RequestedOutput::with_binary("z", false)]);
        let x = &r.inputs[0];
        assert_eq!((x.datatype, x.shape.clone()), (DataType::Int32, vec![2]));
        assert_eq!(x.data, TensorData::Raw([1i32.to_le_bytes(), (-2i32).to_le_bytes()].concat()));
    }

    #[test]
    fn empty_id_and_null_fields() {
        let r = decode_request(br#"{"id":"","inputs":[],"outputs":null}"#, None).unwrap();
        assert_eq!(r.id.as_deref(), Some(""));
        assert!(r.inputs.is_empty() && r.outputs.is_empty() && !r.binary_data_output);
    }
}
