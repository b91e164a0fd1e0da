//! What goes wrong in a version's processing, each with a stable kind.
//!
//! Two families: a version whose processing files cannot be used (its load
//! fails), and a request whose inputs the processing refuses (the client's
//! fault). [`CLIENT_KINDS`] lists the second family in one place, for the
//! front ends that answer them with a 400.

use baton_core::run::backend::BackendError;
use thiserror::Error;

/// The request's text is not valid UTF-8.
pub const TEXT_NOT_UTF8: &str = "text_not_utf8";
/// The request's text is longer than the version allows, and the version
/// does not truncate.
pub const TEXT_TOO_LONG: &str = "text_too_long";
/// The request's texts pad to more tokens than one request may take.
pub const TEXT_BATCH_TOO_LARGE: &str = "text_batch_too_large";
/// The version's processing files cannot be read or contradict its graph.
pub const PROCESSING_INVALID: &str = "processing_invalid";
/// The tokenizer failed on a request's text for another reason.
pub const TOKENIZER_FAILED: &str = "tokenizer_failed";
/// The graph answered with outputs the processing cannot take.
pub const OUTPUT_MISMATCH: &str = "processing_output_mismatch";

/// The kinds of error a request's own inputs cause: a front end answers
/// them as a bad request. The feature transforms' are those
/// [`crate::features::FeatureError::is_client_error`] says are.
pub const CLIENT_KINDS: &[&str] = &[
    TEXT_NOT_UTF8,
    TEXT_TOO_LONG,
    TEXT_BATCH_TOO_LARGE,
    "unknown_feature",
    "missing_feature",
    "feature_type",
    "feature_shape",
    "duplicate_feature",
];

/// A processing failure, with a stable kind (see the constants above).
#[derive(Debug, Error)]
#[error("{message}")]
pub struct ProcessingError {
    /// Stable kind string.
    pub kind: &'static str,
    /// What happened, for people.
    pub message: String,
}

impl ProcessingError {
    /// A new error.
    pub fn new(kind: &'static str, message: impl Into<String>) -> ProcessingError {
        ProcessingError { kind, message: message.into() }
    }

    /// A version whose processing cannot be used.
    pub fn invalid(message: impl Into<String>) -> ProcessingError {
        ProcessingError::new(PROCESSING_INVALID, message)
    }

    /// Whether the request's inputs caused it.
    pub fn is_client_error(&self) -> bool {
        CLIENT_KINDS.contains(&self.kind)
    }
}

impl From<ProcessingError> for BackendError {
    fn from(error: ProcessingError) -> BackendError {
        BackendError::new(error.kind, error.message)
    }
}

impl From<crate::features::FeatureError> for ProcessingError {
    fn from(error: crate::features::FeatureError) -> ProcessingError {
        ProcessingError::new(error.kind(), error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use crate::features::FeatureSpec;

    /// Every client error of the feature transforms is answered as one.
    #[test]
    fn the_feature_transforms_client_kinds_are_client_kinds() {
        let spec =
            FeatureSpec::parse("[[feature]]\nname = \"age\"\ndatatype = \"FP32\"\ngraph_input = \"dense\"\n").unwrap();
        let unknown = baton_core::tensors::tensor::Tensor::from_f32("height", vec![1], &[1.0]);
        for raw in [vec![], vec![unknown]] {
            let error = super::ProcessingError::from(spec.apply(&raw).unwrap_err());
            assert!(error.is_client_error(), "{}: {}", error.kind, error.message);
        }
    }
}
