//! Inference responses as the server sends them.

use baton_core::tensors::tensor::Tensor;
use serde::Serialize;

use crate::error::CodecError;
use crate::request::InferRequest;
use crate::tensor_encode::{TensorEntry, append_binary, binary_size, json_size_hint, write_json};

/// An encoded request or response body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    /// The whole body: the JSON header, then any binary tensor data.
    pub body: Vec<u8>,
    /// `Some(n)` when binary data follows the JSON header of `n` bytes:
    /// send it as `Inference-Header-Content-Length` and the content type
    /// `application/octet-stream`. `None` for a plain JSON body
    /// (`application/json`).
    pub header_length: Option<usize>,
}

#[derive(Serialize)]
struct ResponseHeader<'a> {
    model_name: &'a str,
    model_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    parameters: std::collections::BTreeMap<&'a str, &'a str>,
    outputs: Vec<TensorEntry<'a>>,
}

/// Encodes an inference response.
///
/// Selects the outputs: the requested ones in request order, or all of
/// `outputs` (model order) when none were requested; an unknown requested
/// name is [`CodecError::UnknownOutput`], naming it and listing the model's
/// outputs. An output is sent as binary data when its `binary_data` is true,
/// or when the request's `binary_data_output` is true and the output's own
/// `binary_data` is not false. Binary outputs carry
/// `"parameters": {"binary_data_size": N}` and no `data`, and their bytes
/// follow the JSON in output order; an output never carries a `parameters`
/// object without `binary_data_size` (Triton's clients reject that).
///
/// JSON data is flat, row-major. NaN and ±Inf have no JSON form and are
/// written as `null`; ask for binary outputs to get them exactly. BYTES
/// elements that are not UTF-8 are written lossily in JSON (exact in binary).
///
/// An output tensor whose data disagrees with its shape and datatype is
/// [`CodecError::InvalidOutput`], a server-side fault.
pub fn encode_response(
    model_name: &str,
    model_version: u64,
    id: Option<&str>,
    outputs: Vec<Tensor>,
    request: &InferRequest,
) -> Result<Encoded, CodecError> {
    encode_response_with(model_name, model_version, id, outputs, request, &[])
}

/// [`encode_response`], with string `parameters` in the response (the
/// server's, such as the role of the version that answered).
pub fn encode_response_with(
    model_name: &str,
    model_version: u64,
    id: Option<&str>,
    outputs: Vec<Tensor>,
    request: &InferRequest,
    parameters: &[(&str, &str)],
) -> Result<Encoded, CodecError> {
    let selected: Vec<(&Tensor, bool)> = if request.outputs.is_empty() {
        outputs.iter().map(|t| (t, request.binary_data_output)).collect()
    } else {
        request
            .outputs
            .iter()
            .map(|wanted| {
                let tensor =
                    outputs.iter().find(|t| t.name == wanted.name).ok_or_else(|| CodecError::UnknownOutput {
                        name: wanted.name.clone(),
                        available: outputs.iter().map(|t| t.name.clone()).collect(),
                    })?;
                Ok((tensor, wanted.binary_data.unwrap_or(request.binary_data_output)))
            })
            .collect::<Result<_, CodecError>>()?
    };

    let mut entries = Vec::with_capacity(selected.len());
    let mut binary_total = 0usize;
    let mut json_hint = 256 + model_name.len() + id.map_or(0, str::len);
    for &(tensor, binary) in &selected {
        tensor.check_consistent().map_err(CodecError::InvalidOutput)?;
        let binary_size = if binary {
            let size = binary_size(tensor).ok_or_else(|| {
                CodecError::InvalidOutput(format!(
                    "output '{}' has a BYTES element longer than the 4-byte length prefix can say",
                    tensor.name
                ))
            })?;
            binary_total = binary_total.saturating_add(size);
            Some(size)
        } else {
            json_hint = json_hint.saturating_add(json_size_hint(tensor));
            None
        };
        json_hint = json_hint.saturating_add(64 + tensor.name.len());
        entries.push(TensorEntry { tensor, binary_size });
    }
    let any_binary = entries.iter().any(|e| e.binary_size.is_some());

    let header = ResponseHeader {
        model_name,
        model_version: model_version.to_string(),
        id,
        parameters: parameters.iter().copied().collect(),
        outputs: entries,
    };
    let mut body = Vec::with_capacity(json_hint.saturating_add(binary_total));
    write_json(&mut body, &header).map_err(|e| CodecError::InvalidOutput(e.to_string()))?;
    let header_length = body.len();
    if !any_binary {
        return Ok(Encoded { body, header_length: None });
    }
    for entry in &header.outputs {
        if entry.binary_size.is_some() {
            append_binary(entry.tensor, &mut body);
        }
    }
    Ok(Encoded { body, header_length: Some(header_length) })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::request::RequestedOutput;

    fn outputs() -> Vec<Tensor> {
        vec![Tensor::from_f32("a", vec![1], &[1.0]), Tensor::from_f32("b", vec![2], &[2.0, 3.0])]
    }

    #[test]
    fn all_outputs_as_json_by_default() {
        let e = encode_response("m", 3, Some("r"), outputs(), &InferRequest::default()).unwrap();
        assert_eq!(e.header_length, None);
        let v: Value = serde_json::from_slice(&e.body).unwrap();
        assert_eq!(
            v,
            json!({"model_name":"m","model_version":"3","id":"r","outputs":[
                {"name":"a","datatype":"FP32","shape":[1],"data":[1.0]},
                {"name":"b","datatype":"FP32","shape":[2],"data":[2.0,3.0]}]})
        );
    }

    #[test]
    fn inconsistent_output_is_a_server_fault() {
        let mut bad = outputs();
        bad[1].shape = vec![3];
        let e = encode_response("m", 1, None, bad, &InferRequest::default()).unwrap_err();
        assert_eq!(e.kind(), "invalid_output");
        assert!(!e.is_client_error());
        assert!(e.to_string().contains("'b'"), "{e}");
    }

    #[test]
    fn unknown_output_lists_the_model_outputs() {
        let request = InferRequest { outputs: vec![RequestedOutput::new("zz")], ..Default::default() };
        let e = encode_response("m", 1, None, outputs(), &request).unwrap_err();
        assert_eq!(e.to_string(), "unknown output 'zz'; the model's outputs are [\"a\", \"b\"]");
    }
}
