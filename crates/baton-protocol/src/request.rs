//! Inference requests as the server receives them:
//! `POST /v2/models/{name}[/versions/{v}]/infer`.

use baton_core::tensor::Tensor;
use serde_json::{Map, Value};

use crate::error::CodecError;
use crate::framing::{BinaryCursor, brief, parse_header, split};
use crate::tensor_decode::{NullFloats, decode_tensors};
use crate::wire_json::{Checked, RequestJson, RequestedOutputJson};

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

/// Decodes an inference request body.
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
/// Each tensor's bytes are copied once, out of the body.
pub fn decode_request(body: &[u8], header_length: Option<usize>) -> Result<InferRequest, CodecError> {
    let (json, binary) = split(body, header_length)?;
    let header: RequestJson = parse_header(json, header_length)?;
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
    let inputs = decode_tensors(entries, &mut cursor, "input", NullFloats::Reject)?;
    cursor.finish()?;
    let outputs = requested_outputs(header.outputs.unwrap_or_default())?;
    Ok(InferRequest { id, inputs, outputs, binary_data_output, parameters })
}

fn requested_outputs(entries: Vec<RequestedOutputJson>) -> Result<Vec<RequestedOutput>, CodecError> {
    let invalid = CodecError::InvalidRequest;
    let mut outputs: Vec<RequestedOutput> = Vec::with_capacity(entries.len());
    for (index, entry) in entries.into_iter().enumerate() {
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
    use baton_core::tensor::{DataType, TensorData};

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
