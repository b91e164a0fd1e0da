//! Errors on their way to a client, independent of the protocol. Each has a
//! class that the REST front end maps to an HTTP status and the gRPC front
//! end to a status code — in one place each — and a stable kind string used
//! in responses and metrics. Client errors say exactly what was wrong;
//! internal errors do not leak internals.

use baton_core::files::source::FetchError;
use baton_core::registry::error::LoadError;
use baton_core::run::error::InferError;
use baton_protocol::CodecError;

/// Whose fault an error is, and what the client can do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// The request is malformed or does not fit the model.
    BadRequest,
    /// No such model, version or endpoint.
    NotFound,
    /// Another operation on the model is running, or the state forbids it.
    Conflict,
    /// The request is larger than the server accepts.
    TooLarge,
    /// The request was fine, but the version it names cannot be loaded.
    Unprocessable,
    /// The version could be loaded, but not within a memory budget: the
    /// server's state, not the version, is what stands in the way.
    InsufficientMemory,
    /// Not ready: the model is not serving, or the server is shutting down.
    Unavailable,
    /// Overloaded: the request was refused at once because the version or
    /// the server holds as much as it takes; worth retrying later or
    /// elsewhere.
    Overloaded,
    /// The request's deadline passed before it was answered.
    DeadlineExceeded,
    /// The client did not send the request's body within the server's
    /// body read timeout.
    RequestTimeout,
    /// The server failed.
    Internal,
    /// A management operation came without the admin token, or with a wrong one.
    Unauthorized,
    /// Not allowed here: a management operation on an inference listener when
    /// an admin listener serves them, inference on an admin listener, or a
    /// model operation under `--model-control none`.
    Forbidden,
}

/// An error for a client.
#[derive(Debug)]
pub struct ServeError {
    /// Its class.
    pub class: Class,
    /// Stable kind string.
    pub kind: &'static str,
    /// What happened, for people.
    pub message: String,
}

impl ServeError {
    /// A new error.
    pub fn new(class: Class, kind: &'static str, message: impl Into<String>) -> ServeError {
        ServeError { class, kind, message: message.into() }
    }

    /// A malformed request.
    pub fn bad_request(kind: &'static str, message: impl Into<String>) -> ServeError {
        ServeError::new(Class::BadRequest, kind, message)
    }

    /// An unknown model.
    pub fn unknown_model(model: &str) -> ServeError {
        ServeError::new(Class::NotFound, "model_not_found", format!("unknown model '{model}'"))
    }

    /// A request refused at once because the server holds as much as it
    /// takes; kind `overloaded`.
    pub fn overloaded(message: impl Into<String>) -> ServeError {
        ServeError::new(Class::Overloaded, "overloaded", message)
    }

    /// A request whose deadline passed; kind `deadline_exceeded`.
    pub fn deadline_exceeded(message: impl Into<String>) -> ServeError {
        ServeError::new(Class::DeadlineExceeded, "deadline_exceeded", message)
    }
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<baton_core::tensors::signature::InputError> for ServeError {
    fn from(e: baton_core::tensors::signature::InputError) -> ServeError {
        ServeError::bad_request(e.kind(), e.to_string())
    }
}

impl From<CodecError> for ServeError {
    fn from(e: CodecError) -> ServeError {
        // An output the model produced that cannot be encoded is the server's fault.
        let class = if e.is_client_error() { Class::BadRequest } else { Class::Internal };
        ServeError::new(class, e.kind(), e.to_string())
    }
}

impl From<InferError> for ServeError {
    fn from(e: InferError) -> ServeError {
        let class = match &e {
            InferError::ModelNotFound(_) | InferError::VersionNotFound { .. } => Class::NotFound,
            InferError::InvalidInput(_) => Class::BadRequest,
            InferError::Backend(b) if b.kind == "invalid_input" || b.kind == "unsupported_datatype" => {
                Class::BadRequest
            }
            // Inputs a version's processing refuses (text that is not
            // UTF-8, or longer than it takes).
            InferError::Backend(b) if baton_processing::CLIENT_KINDS.contains(&b.kind) => Class::BadRequest,
            // A worker process that is gone, hung, full, or being replaced
            // because its hop broke: the version cannot answer now; a
            // client may retry, and another replica can.
            InferError::Backend(b)
                if matches!(b.kind, "worker_gone" | "worker_timed_out" | "worker_busy" | "worker_hop_broken") =>
            {
                Class::Unavailable
            }
            // The request's inputs, or the answer it asks for, do not fit
            // the worker's shared region (`[engine] worker_region_mb`).
            InferError::Backend(b) if b.kind == "worker_region_exceeded" => Class::TooLarge,
            InferError::Backend(_) | InferError::EnginePanicked(_) | InferError::Stopped => Class::Internal,
            InferError::Overloaded { .. } => Class::Overloaded,
            InferError::DeadlineExceeded { .. } => Class::DeadlineExceeded,
        };
        let kind = match &e {
            InferError::Backend(b) => b.kind,
            other => other.kind(),
        };
        let message = match &e {
            // The panic's message is in the server log, not for clients.
            InferError::EnginePanicked(_) => {
                "the engine failed on this request (internal error; see the server log)".into()
            }
            other => other.to_string(),
        };
        ServeError::new(class, kind, message)
    }
}

impl From<LoadError> for ServeError {
    fn from(e: LoadError) -> ServeError {
        let class = match &e {
            LoadError::InProgress { .. }
            | LoadError::NoPrevious { .. }
            | LoadError::NotRetirable { .. }
            | LoadError::RolloutInProgress { .. }
            | LoadError::NoRollout { .. } => Class::Conflict,
            LoadError::RolloutRefused { .. } => Class::BadRequest,
            LoadError::UnknownModel { .. }
            | LoadError::NoVersion { .. }
            | LoadError::NotLoaded { .. }
            | LoadError::Fetch(FetchError::ModelNotFound { .. } | FetchError::VersionNotFound { .. }) => {
                Class::NotFound
            }
            LoadError::ShuttingDown => Class::Unavailable,
            LoadError::Panicked { .. } => Class::Internal,
            LoadError::MemoryBudget(_) => Class::InsufficientMemory,
            LoadError::Config(_)
            | LoadError::Fetch(_)
            | LoadError::Verify(_)
            | LoadError::Load(_)
            | LoadError::Validate(_)
            | LoadError::Warmup(_)
            | LoadError::EngineEnded { .. } => Class::Unprocessable,
        };
        let message = match &e {
            LoadError::Panicked { stage, .. } => format!("{stage} failed: internal error (see the server log)"),
            other => other.to_string(),
        };
        ServeError::new(class, e.kind(), message)
    }
}
