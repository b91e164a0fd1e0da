//! The one place errors become HTTP responses: `{"error": "...", "kind":
//! "..."}` with a status that says whose fault it was. Client errors say
//! exactly what was wrong; internal errors do not leak internals.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use baton_core::error::{InferError, LoadError};
use baton_core::source::FetchError;
use baton_kserve::CodecError;

/// An error on its way to the client.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable kind string.
    pub kind: &'static str,
    /// What happened, for people.
    pub message: String,
}

impl ApiError {
    /// A new error.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, kind, message: message.into() }
    }

    /// 400 with a message.
    pub fn bad_request(kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, kind, message)
    }

    /// 404 for an unknown model.
    pub fn unknown_model(model: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "model_not_found", format!("unknown model '{model}'"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message, "kind": self.kind });
        (self.status, Json(body)).into_response()
    }
}

impl From<CodecError> for ApiError {
    fn from(e: CodecError) -> ApiError {
        ApiError::bad_request(e.kind(), e.to_string())
    }
}

impl From<InferError> for ApiError {
    fn from(e: InferError) -> ApiError {
        let status = match &e {
            InferError::ModelNotFound(_) | InferError::VersionNotFound { .. } => StatusCode::NOT_FOUND,
            InferError::InvalidInput(_) => StatusCode::BAD_REQUEST,
            InferError::Backend(b) if b.kind == "invalid_input" || b.kind == "unsupported_datatype" => {
                StatusCode::BAD_REQUEST
            }
            InferError::Backend(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let kind = match &e {
            InferError::Backend(b) => b.kind,
            other => other.kind(),
        };
        ApiError::new(status, kind, e.to_string())
    }
}

impl From<LoadError> for ApiError {
    fn from(e: LoadError) -> ApiError {
        let status = match &e {
            LoadError::InProgress { .. } | LoadError::NoPrevious { .. } | LoadError::NotRetirable { .. } => {
                StatusCode::CONFLICT
            }
            LoadError::UnknownModel { .. }
            | LoadError::NoVersion { .. }
            | LoadError::NotLoaded { .. }
            | LoadError::Fetch(FetchError::ModelNotFound { .. } | FetchError::VersionNotFound { .. }) => {
                StatusCode::NOT_FOUND
            }
            LoadError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            LoadError::Panicked { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            // The request was fine; the version it names is not loadable.
            LoadError::Fetch(_)
            | LoadError::Verify(_)
            | LoadError::Load(_)
            | LoadError::Validate(_)
            | LoadError::Warmup(_) => StatusCode::UNPROCESSABLE_ENTITY,
        };
        let message = match &e {
            LoadError::Panicked { stage, .. } => format!("{stage} failed: internal error (see the server log)"),
            other => other.to_string(),
        };
        ApiError::new(status, e.kind(), message)
    }
}

impl From<axum::extract::rejection::BytesRejection> for ApiError {
    fn from(e: axum::extract::rejection::BytesRejection) -> ApiError {
        let kind = if e.status() == StatusCode::PAYLOAD_TOO_LARGE { "too_large" } else { "bad_body" };
        ApiError::new(e.status(), kind, e.body_text())
    }
}
