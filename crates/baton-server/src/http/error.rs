//! The one place errors become HTTP responses: `{"error": "...", "kind":
//! "..."}` with the status of the error's class.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::{Class, ServeError};

/// An error on its way to an HTTP client.
pub type ApiError = ServeError;

/// The HTTP status of a class of error.
pub fn status(class: Class) -> StatusCode {
    match class {
        Class::BadRequest => StatusCode::BAD_REQUEST,
        Class::NotFound => StatusCode::NOT_FOUND,
        Class::Conflict => StatusCode::CONFLICT,
        Class::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Class::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        Class::InsufficientMemory => StatusCode::INSUFFICIENT_STORAGE,
        Class::Unavailable | Class::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
        Class::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Class::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        Class::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Class::Unauthorized => StatusCode::UNAUTHORIZED,
        Class::Forbidden => StatusCode::FORBIDDEN,
    }
}

/// What an overloaded answer's `Retry-After` says, in seconds: the
/// smallest the header can say. Shedding lasts as long as the burst that
/// caused it, usually well under a second.
pub const RETRY_AFTER_SECONDS: u32 = 1;

impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message, "kind": self.kind });
        let mut response = (status(self.class), Json(body)).into_response();
        if self.class == Class::Unauthorized {
            // What a 401 must carry: the scheme the client should use.
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"baton\""));
        }
        if self.class == Class::Overloaded {
            response.headers_mut().insert(header::RETRY_AFTER, RETRY_AFTER_SECONDS.into());
        }
        response
    }
}

impl From<axum::extract::rejection::BytesRejection> for ServeError {
    fn from(e: axum::extract::rejection::BytesRejection) -> ServeError {
        let class = match e.status() {
            StatusCode::PAYLOAD_TOO_LARGE => Class::TooLarge,
            s if s.is_client_error() => Class::BadRequest,
            _ => Class::Internal,
        };
        let kind = if class == Class::TooLarge { "too_large" } else { "bad_body" };
        ServeError::new(class, kind, e.body_text())
    }
}
