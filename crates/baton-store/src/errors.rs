//! What a store answered, as a stable kind and a sentence.

use baton_core::files::source::FetchError;

/// The stable kind of a store's failure: `store_not_found` (no such bucket
/// or object), `store_denied` (credentials refused), `store_throttled`,
/// `store_unreachable` (no answer at all), `store_changed` (the object is
/// no longer the one listed) or `store_error` (anything else).
pub fn kind(error: &object_store::Error) -> &'static str {
    let text = error.to_string();
    if changed(error) {
        return "store_changed";
    }
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

/// Whether the store refused a read because the object's entity tag is no
/// longer the one asked for (`If-Match`, 412), here or in what caused it.
fn changed(error: &object_store::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if matches!(error.downcast_ref::<object_store::Error>(), Some(object_store::Error::Precondition { .. })) {
            return true;
        }
        cause = error.source();
    }
    false
}

/// `url` answered with another entity tag than its listing gave: the object
/// was replaced since.
pub fn changed_since_listed(url: &str, listed: &str, now: &str) -> FetchError {
    FetchError::Store {
        kind: "store_changed",
        message: format!(
            "{url}: {}: it was tagged {listed} when listed and is tagged {now} now; nothing of it is kept",
            meaning("store_changed")
        ),
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
        "store_changed" => "the object changed while it was being fetched (published again?)",
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
