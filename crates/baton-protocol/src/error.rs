//! What can be wrong with a body, said precisely enough that a client can fix
//! its request without reading the server's code.

/// An encoding or decoding failure. Every message names the tensor at fault
/// (when there is one) and says what was expected and what was found.
///
/// Every variant except [`CodecError::InvalidOutput`] describes a body the
/// peer sent, so on the server side it is a client error (HTTP 400);
/// [`CodecError::is_client_error`] tells them apart.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The JSON header does not parse, or a field has the wrong JSON type.
    /// The message includes serde's line and column.
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    /// The JSON parses but the request or response is not well formed:
    /// no `inputs`, a duplicate name, a parameter of the wrong type.
    #[error("{0}")]
    InvalidRequest(String),
    /// A tensor's name, datatype, shape or JSON data is wrong.
    #[error("{0}")]
    InvalidTensor(String),
    /// The binary tensor data after the JSON header does not agree with the
    /// header: sizes, the header length, leftover or missing bytes.
    #[error("{0}")]
    InvalidBinary(String),
    /// An output was requested that the model does not produce.
    #[error("unknown output '{name}'; the model's outputs are {available:?}")]
    UnknownOutput {
        /// The requested name.
        name: String,
        /// The outputs the model produced, in model order.
        available: Vec<String>,
    },
    /// An output tensor handed to [`crate::encode_response`] disagrees with
    /// itself (data size vs shape and datatype). This is a fault of the
    /// server or model, not of the client (HTTP 500).
    #[error("model produced an invalid output: {0}")]
    InvalidOutput(String),
    /// The response body is an error object (`{"error": "..."}`) rather
    /// than an inference response; only [`crate::decode_response`] returns it.
    #[error("server error: {0}")]
    ErrorResponse(String),
}

impl CodecError {
    /// A stable, machine-readable name for the kind of failure.
    pub fn kind(&self) -> &'static str {
        match self {
            CodecError::InvalidJson(_) => "invalid_json",
            CodecError::InvalidRequest(_) => "invalid_request",
            CodecError::InvalidTensor(_) => "invalid_tensor",
            CodecError::InvalidBinary(_) => "invalid_binary",
            CodecError::UnknownOutput { .. } => "unknown_output",
            CodecError::InvalidOutput(_) => "invalid_output",
            CodecError::ErrorResponse(_) => "error_response",
        }
    }

    /// Whether the peer that sent the body is at fault (HTTP 400 on the
    /// server side). Only [`CodecError::InvalidOutput`] is not.
    pub fn is_client_error(&self) -> bool {
        !matches!(self, CodecError::InvalidOutput(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_classes() {
        let unknown = CodecError::UnknownOutput { name: "z".into(), available: vec!["y".into()] };
        assert_eq!(unknown.kind(), "unknown_output");
        assert_eq!(unknown.to_string(), "unknown output 'z'; the model's outputs are [\"y\"]");
        assert!(unknown.is_client_error());
        let output = CodecError::InvalidOutput("x".into());
        assert_eq!(output.kind(), "invalid_output");
        assert!(!output.is_client_error());
        assert_eq!(CodecError::InvalidJson("eof".into()).to_string(), "invalid JSON: eof");
    }
}
