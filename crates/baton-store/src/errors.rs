//! What a store answered, as a stable kind and a sentence.

use baton_core::source::FetchError;

/// The stable kind of a store's failure: `store_not_found` (no such bucket
/// or object), `store_denied` (credentials refused), `store_throttled`,
/// `store_unreachable` (no answer at all) or `store_error` (anything else).
pub fn kind(error: &object_store::Error) -> &'static str {
    let text = error.to_string();
    match error {
        object_store::Error::NotFound { .. } => "store_not_found",
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => "store_denied",
        _ if text.contains("NoSuchBucket") || text.contains("NoSuchKey") => "store_not_found",
        _ if ["AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId", "403 Forbidden", "401 Unauthorized"]
            .iter()
            .any(|s| text.contains(s)) =>
        {
            "store_denied"
        }
        _ if ["SlowDown", "Throttl", "TooManyRequests", "429", "503 Service Unavailable"]
            .iter()
            .any(|s| text.contains(s)) =>
        {
            "store_throttled"
        }
        _ if ["error sending request", "connect", "timed out", "Timeout", "dns error"]
            .iter()
            .any(|s| text.contains(s)) =>
        {
            "store_unreachable"
        }
        _ => "store_error",
    }
}

/// A store's failure at `doing` (say, "listing s3://models/"), as a
/// [`FetchError`].
pub fn fetch_error(doing: &str, error: &object_store::Error) -> FetchError {
    let kind = kind(error);
    FetchError::Store { kind, message: format!("{doing}: {}: {}", meaning(kind), flatten(error)) }
}

/// What a kind means, for the operator reading the message.
pub fn meaning(kind: &str) -> &'static str {
    match kind {
        "store_not_found" => "the store has no such bucket or object",
        "store_denied" => "the store refused the credentials",
        "store_throttled" => "the store is throttling requests",
        "store_unreachable" => "the store did not answer",
        _ => "the store failed",
    }
}

/// The error and every cause, on one line.
fn flatten(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}
