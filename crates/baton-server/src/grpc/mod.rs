//! The gRPC front end, on its own port beside REST: the KServe V2 / Open
//! Inference Protocol service `inference.GRPCInferenceService` with the
//! Triton extensions its clients use, and baton's own `baton.v1.Management`
//! (the event stream, status, load, rollback, pins and rollouts).
//!
//! It shares everything but the encoding with REST: the registry, readiness,
//! the metrics, the serving path ([`crate::serving::infer`]) and the error
//! model ([`ServeError`]), whose classes map to gRPC status codes in one
//! place, [`code`].
//!
//! Access: every call passes a guard ([`guard`]) that applies
//! [`crate::access`] by the call's method, so one listener can serve
//! inference and another management.
//!
//! Shutdown: when the app starts draining, the server stops accepting
//! connections, ends event streams and streaming inference (a stream
//! finishes the request it is answering, then ends with UNAVAILABLE), and
//! returns once the RPCs in flight have finished.

mod admission;
mod guard;
mod inference;
mod manage;
mod model_config;
mod repository;
mod rollout;

use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::access::{Access, Listener};
use crate::app::App;
use crate::error::{Class, ServeError};

pub use baton_protocol::grpc::{pb, pb_baton};

pub use baton_protocol::grpc::KIND_KEY;

/// The gRPC status code of a class of error. Of the choices left open:
///
/// - `Conflict` (a load, rollback or unload of the model is already running;
///   no previous version to roll back to) is `ABORTED`: a concurrency
///   conflict the client may retry once the other operation is done, not an
///   entity that already exists.
/// - `Unprocessable` (a version refused by a stage of the load transaction)
///   is `FAILED_PRECONDITION`: the request is well formed, the repository's
///   content is what is wrong.
/// - `InsufficientMemory` (a load refused by a memory budget) is
///   `RESOURCE_EXHAUSTED`: memory is the resource, and freeing some (or a
///   larger budget) is what lets the load through.
/// - `Forbidden` (management on an inference listener when an admin
///   listener serves it, inference on an admin listener, a model operation
///   under `--model-control none`) is `PERMISSION_DENIED`: retrying will not
///   help, another listener or configuration will.
pub fn code(class: Class) -> Code {
    match class {
        Class::BadRequest => Code::InvalidArgument,
        Class::NotFound => Code::NotFound,
        Class::Conflict => Code::Aborted,
        Class::TooLarge | Class::InsufficientMemory => Code::ResourceExhausted,
        Class::Unprocessable => Code::FailedPrecondition,
        Class::Unavailable | Class::Overloaded => Code::Unavailable,
        Class::DeadlineExceeded | Class::RequestTimeout => Code::DeadlineExceeded,
        Class::Internal => Code::Internal,
        Class::Unauthorized => Code::Unauthenticated,
        Class::Forbidden => Code::PermissionDenied,
    }
}

impl From<ServeError> for Status {
    fn from(e: ServeError) -> Status {
        let mut status = Status::new(code(e.class), e.message);
        status.metadata_mut().insert(KIND_KEY, MetadataValue::from_static(e.kind));
        status
    }
}

/// Parses a version field: empty means the stable version.
pub fn parse_version(text: &str) -> Result<Option<u64>, ServeError> {
    if text.is_empty() { Ok(None) } else { crate::serving::parse_version(text).map(Some) }
}

/// tonic refuses a message over the decoding limit with `OUT_OF_RANGE`;
/// baton's error model says `RESOURCE_EXHAUSTED` (as the C++ and Go gRPC
/// servers do) for a request larger than `--max-request-bytes`.
fn is_too_large(code: Code, message: &str) -> bool {
    code == Code::OutOfRange && message.contains("message length too large")
}

/// The status a streaming handler sends for an error reading its inbound
/// stream, with a message over the limit reported as `RESOURCE_EXHAUSTED`.
pub fn inbound_error(status: Status) -> Status {
    if is_too_large(status.code(), status.message()) {
        let mut mapped = Status::new(Code::ResourceExhausted, status.message());
        mapped.metadata_mut().insert(KIND_KEY, MetadataValue::from_static("too_large"));
        return mapped;
    }
    status
}

/// Rewrites the status of unary responses refused by tonic's decoding limit
/// (which never reach a handler) from `OUT_OF_RANGE` to `RESOURCE_EXHAUSTED`.
/// Such an answer is "trailers-only": the status is in the headers.
fn too_large_as_resource_exhausted<B>(mut response: axum::http::Response<B>) -> axum::http::Response<B> {
    let headers = response.headers_mut();
    let out_of_range = headers.get("grpc-status").is_some_and(|v| v.as_bytes() == b"11");
    let message = headers.get("grpc-message").map(|v| String::from_utf8_lossy(v.as_bytes()).replace("%20", " "));
    if out_of_range && message.is_some_and(|m| is_too_large(Code::OutOfRange, &m)) {
        headers.insert("grpc-status", axum::http::HeaderValue::from_static("8"));
        headers.insert(KIND_KEY, axum::http::HeaderValue::from_static("too_large"));
    }
    response
}

/// Streams a client may have open at once on one connection (HTTP/2's
/// `SETTINGS_MAX_CONCURRENT_STREAMS`), as nginx's default: without it
/// tonic lets a connection open any number, each a task of the server's.
/// A client that wants more opens more connections, which the listener
/// bounds.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 128;

/// How often an HTTP/2 connection is pinged, and how long the answer may
/// take before the connection is closed.
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);
const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Serves both gRPC services on `listener`, a listener of the given role
/// whose calls `access` checks, until the app starts draining, then
/// finishes the RPCs in flight and returns.
pub async fn serve(
    app: Arc<App>,
    listener: crate::serve::conn::Bounded,
    access: Arc<Access>,
    role: Listener,
) -> Result<(), tonic::transport::Error> {
    let limit = app.max_request_bytes;
    let inference =
        pb::grpc_inference_service_server::GrpcInferenceServiceServer::new(inference::Inference::new(Arc::clone(&app)))
            .max_decoding_message_size(limit);
    let management = pb_baton::management_server::ManagementServer::new(manage::Management::new(Arc::clone(&app)))
        .max_decoding_message_size(limit);
    let mut stopped = app.shutdown_signal();
    // Bounded, with deadlines on each connection's handshake and idle
    // time, and TCP_NODELAY set (see crate::serve::conn).
    let incoming = listener.incoming();
    tonic::transport::Server::builder()
        // A peer that vanished (a partition, a host gone) while a stream is
        // open answers no ping: its connection, and its slot, are freed.
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .layer(crate::serve::conn::track::TrackLayer)
        .layer(tower::util::MapResponseLayer::new(too_large_as_resource_exhausted))
        .layer(guard::GuardLayer::new(access, role))
        .layer(admission::AdmissionLayer::new(Arc::clone(&app)))
        .add_service(inference)
        .add_service(management)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        })
        .await
}

/// How a quiet stream (events, a streaming call between messages) ends
/// when its connection makes room at its listener's bound: `UNAVAILABLE`,
/// which clients retry.
pub fn making_room() -> Status {
    Status::from(ServeError::new(
        Class::Unavailable,
        "making_room",
        "the server ended this stream to make room for another connection at its bound; call again",
    ))
}

/// Resolves when the app starts draining; never, if it cannot tell.
pub async fn draining(mut stop: tokio::sync::watch::Receiver<bool>) {
    if stop.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_has_its_code() {
        assert_eq!(code(Class::BadRequest), Code::InvalidArgument);
        assert_eq!(code(Class::NotFound), Code::NotFound);
        assert_eq!(code(Class::Conflict), Code::Aborted);
        assert_eq!(code(Class::TooLarge), Code::ResourceExhausted);
        assert_eq!(code(Class::Unprocessable), Code::FailedPrecondition);
        assert_eq!(code(Class::InsufficientMemory), Code::ResourceExhausted);
        assert_eq!(code(Class::Unavailable), Code::Unavailable);
        assert_eq!(code(Class::Overloaded), Code::Unavailable);
        assert_eq!(code(Class::DeadlineExceeded), Code::DeadlineExceeded);
        assert_eq!(code(Class::RequestTimeout), Code::DeadlineExceeded);
        assert_eq!(code(Class::Internal), Code::Internal);
        assert_eq!(code(Class::Unauthorized), Code::Unauthenticated);
        assert_eq!(code(Class::Forbidden), Code::PermissionDenied);
    }

    #[test]
    fn a_serve_error_keeps_its_message_and_kind() {
        let status = Status::from(ServeError::unknown_model("m"));
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(status.message(), "unknown model 'm'");
        assert_eq!(status.metadata().get(KIND_KEY).and_then(|v| v.to_str().ok()), Some("model_not_found"));
    }

    #[test]
    fn versions_parse_or_say_why_not() {
        assert_eq!(parse_version("").unwrap(), None);
        assert_eq!(parse_version("3").unwrap(), Some(3));
        let e = parse_version("x").unwrap_err();
        assert_eq!((e.class, e.kind), (Class::BadRequest, "invalid_version"));
    }

    #[test]
    fn only_the_decoding_limit_becomes_resource_exhausted() {
        let limit =
            Status::out_of_range("Error, decoded message length too large: found 9 bytes, the limit is: 4 bytes");
        assert_eq!(inbound_error(limit).code(), Code::ResourceExhausted);
        assert_eq!(inbound_error(Status::out_of_range("other")).code(), Code::OutOfRange);
        let response = axum::http::Response::builder()
            .header("grpc-status", "11")
            .header("grpc-message", "Error,%20decoded%20message%20length%20too%20large:%20found%209%20bytes")
            .body(())
            .unwrap();
        let mapped = too_large_as_resource_exhausted(response);
        assert_eq!(mapped.headers()["grpc-status"], "8");
        let other = axum::http::Response::builder().header("grpc-status", "11").body(()).unwrap();
        assert_eq!(too_large_as_resource_exhausted(other).headers()["grpc-status"], "11");
    }
}
