//! The client side: encoding requests and decoding responses, for tests,
//! the command line and load generators.

use baton_core::tensors::tensor::Tensor;
use baton_core::tensors::tensor_json::NullFloats;
use serde::Serialize;
use serde_json::Value;

use crate::error::CodecError;
use crate::framing::{BinaryCursor, brief, parse_header, split};
use crate::request::RequestedOutput;
use crate::response::Encoded;
use crate::tensor_decode::parse_tensors;
use crate::tensor_encode::{TensorEntry, append_binary, binary_size, json_size_hint, write_json};
use crate::wire_json::{Checked, ResponseJson};

#[derive(Serialize)]
struct HeaderOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<RequestParameters>,
    inputs: Vec<TensorEntry<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    outputs: Vec<OutputEntry<'a>>,
}

#[derive(Serialize)]
struct RequestParameters {
    binary_data_output: bool,
}

#[derive(Serialize)]
struct OutputEntry<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<OutputParameters>,
}

#[derive(Serialize)]
struct OutputParameters {
    binary_data: bool,
}

/// Encodes an inference request.
///
/// With `binary` every input's data goes after the JSON header (with
/// `parameters.binary_data_size`), and the request asks for binary outputs
/// (`parameters.binary_data_output: true`); each requested output's own
/// `binary_data` still overrides that. Without it, inputs are flat JSON
/// (NaN and ±Inf written as `null`, which a server rejects) and outputs come
/// back as JSON unless requested otherwise. `outputs` empty asks for every
/// output.
///
/// Tensors are encoded as given, not checked: an inconsistent tensor makes
/// a request the server rejects. A BYTES element longer than `u32::MAX`
/// cannot be framed in binary and gets a wrong length.
pub fn encode_request(inputs: &[Tensor], binary: bool, outputs: &[RequestedOutput], id: Option<&str>) -> Encoded {
    let entries: Vec<TensorEntry<'_>> = inputs
        .iter()
        .map(|tensor| TensorEntry { tensor, binary_size: binary.then(|| binary_size(tensor).unwrap_or(usize::MAX)) })
        .collect();
    let header = HeaderOut {
        id,
        parameters: binary.then_some(RequestParameters { binary_data_output: true }),
        inputs: entries,
        outputs: outputs
            .iter()
            .map(|o| OutputEntry {
                name: &o.name,
                parameters: o.binary_data.map(|binary_data| OutputParameters { binary_data }),
            })
            .collect(),
    };
    let hint: usize = inputs
        .iter()
        .map(|t| 64 + t.name.len() + if binary { binary_size(t).unwrap_or(0) } else { json_size_hint(t) })
        .fold(256, usize::saturating_add);
    let mut body = Vec::with_capacity(hint);
    // The header holds only strings, numbers and tensors, which always
    // serialize; the error branch cannot be taken.
    if write_json(&mut body, &header).is_err() {
        body.clear();
    }
    if !binary {
        return Encoded { body, header_length: None };
    }
    let header_length = body.len();
    for tensor in inputs {
        append_binary(tensor, &mut body);
    }
    Encoded { body, header_length: Some(header_length) }
}

/// A decoded inference response.
#[derive(Clone, Debug, PartialEq)]
pub struct InferResponse {
    /// The model that answered.
    pub model_name: String,
    /// Its version, as the server wrote it (a string in the protocol);
    /// empty when absent.
    pub model_version: String,
    /// The request's `id`, when the server echoed one.
    pub id: Option<String>,
    /// The outputs, in response order.
    pub outputs: Vec<Tensor>,
}

/// Decodes an inference response body, JSON or with binary outputs after
/// the JSON header (`header_length` is `Inference-Header-Content-Length`).
///
/// JSON data is decoded using each output's datatype and shape, flat or
/// nested; a `null` element of a floating-point output decodes as NaN
/// (servers write NaN and ±Inf as `null`). An error object
/// (`{"error": "..."}`) is [`CodecError::ErrorResponse`].
pub fn decode_response(body: &[u8], header_length: Option<usize>) -> Result<InferResponse, CodecError> {
    let (json, binary) = split(body, header_length)?;
    let header: ResponseJson<'_> = parse_header(json, header_length)?;
    let invalid = CodecError::InvalidRequest;
    if let (Some(error), None) = (&header.error, &header.outputs) {
        let message = error.as_str().map_or_else(|| error.to_string(), str::to_owned);
        return Err(CodecError::ErrorResponse(message));
    }
    let model_name = match header.model_name {
        None => return Err(invalid("the response has no 'model_name'".to_owned())),
        Some(Checked::Invalid(v)) => {
            return Err(invalid(format!("'model_name' must be a string, got {}", brief(&v))));
        }
        Some(Checked::Valid(name)) => name,
    };
    let model_version = match header.model_version {
        None => String::new(),
        Some(Value::String(s)) => s,
        Some(Value::Number(n)) => n.to_string(),
        Some(v) => return Err(invalid(format!("'model_version' must be a string, got {}", brief(&v)))),
    };
    let id = match header.id {
        None => None,
        Some(Checked::Valid(id)) => Some(id),
        Some(Checked::Invalid(v)) => return Err(invalid(format!("'id' must be a string, got {}", brief(&v)))),
    };
    let entries = header.outputs.ok_or_else(|| invalid("the response has no 'outputs' array".to_owned()))?;
    let mut cursor = BinaryCursor::new(binary, header_length, "output");
    let parsed = parse_tensors(json, entries, &mut cursor, "output")?;
    cursor.finish()?;
    let outputs = parsed
        .into_iter()
        .map(|t| t.decode(json, "output", NullFloats::AsNan))
        .collect::<Result<Vec<Tensor>, CodecError>>()?;
    Ok(InferResponse { model_name, model_version, id, outputs })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn json_request_shape() {
        let x = Tensor::from_f32("x", vec![1, 2], &[0.5, -1.0]);
        let e = encode_request(&[x], false, &[RequestedOutput::with_binary("y", true)], Some("q"));
        assert_eq!(e.header_length, None);
        let v: Value = serde_json::from_slice(&e.body).unwrap();
        assert_eq!(
            v,
            json!({"id":"q","inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[0.5,-1.0]}],
                   "outputs":[{"name":"y","parameters":{"binary_data":true}}]})
        );
    }

    #[test]
    fn binary_request_shape() {
        let x = Tensor::from_f32("x", vec![1], &[2.0]);
        let e = encode_request(std::slice::from_ref(&x), true, &[], None);
        let n = e.header_length.unwrap();
        let v: Value = serde_json::from_slice(&e.body[..n]).unwrap();
        assert_eq!(
            v,
            json!({"parameters":{"binary_data_output":true},
                   "inputs":[{"name":"x","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":4}}]})
        );
        assert_eq!(&e.body[n..], 2.0f32.to_le_bytes());
    }

    #[test]
    fn error_objects_and_versions() {
        let e = decode_response(br#"{"error":"model 'm' is not ready"}"#, None).unwrap_err();
        assert_eq!(e, CodecError::ErrorResponse("model 'm' is not ready".into()));
        let r = decode_response(br#"{"model_name":"m","model_version":7,"outputs":[]}"#, None).unwrap();
        assert_eq!((r.model_version.as_str(), r.id), ("7", None));
        let e = decode_response(br#"{"model_version":"1","outputs":[]}"#, None).unwrap_err();
        assert!(e.to_string().contains("no 'model_name'"), "{e}");
    }
}
