//! The errors of serving requests ([`InferError`]), with a stable `kind()`
//! string for metric labels and response bodies.

use thiserror::Error;

use crate::run::admission::Shed;
use crate::run::backend::BackendError;

/// Why a request was not answered.
#[derive(Debug, Error)]
pub enum InferError {
    /// No such model is served.
    #[error("unknown model '{0}'")]
    ModelNotFound(String),
    /// The model is served but not at that version.
    #[error("model '{model}' has no loaded version {version}")]
    VersionNotFound {
        /// The model.
        model: String,
        /// The version asked for.
        version: u64,
    },
    /// The request does not fit the model's signature; the message says how.
    #[error("{0}")]
    InvalidInput(String),
    /// The engine failed while running the request.
    #[error("inference failed: {0}")]
    Backend(#[from] BackendError),
    /// The version holds as many requests as its `[admission]` bounds allow;
    /// the request was refused without being queued.
    #[error("model '{model}' version {version} is overloaded ({}); retry later or elsewhere", .shed.reason())]
    Overloaded {
        /// The model.
        model: String,
        /// The version.
        version: u64,
        /// Which bound was reached.
        shed: Shed,
    },
    /// The request's deadline passed before it was answered; if it was
    /// still queued then, it never ran.
    #[error("the request's deadline passed {}", .at.describe())]
    DeadlineExceeded {
        /// Where the request was when its deadline passed.
        at: Expired,
    },
    /// The engine panicked on this request (or on a batch holding it). The
    /// session thread survived and its session serves the next request.
    #[error("the engine failed on this request: internal error: {0}")]
    EnginePanicked(String),
    /// The version's session threads have stopped; only a version being
    /// freed has none.
    #[error("the version's session threads have stopped")]
    Stopped,
}

/// Where a request was when its deadline passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expired {
    /// Before it was queued: the deadline had passed on arrival.
    Arrival,
    /// Waiting in the version's queue: it was never run.
    Queued,
    /// Being run: the engine's answer came too late.
    Running,
}

impl Expired {
    /// Stable label for metrics: `arrival`, `queued`, `running`.
    pub fn as_str(self) -> &'static str {
        match self {
            Expired::Arrival => "arrival",
            Expired::Queued => "queued",
            Expired::Running => "running",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Expired::Arrival => "before it could be queued",
            Expired::Queued => "while it waited for a session; it was not run",
            Expired::Running => "while it was being run",
        }
    }
}

impl InferError {
    /// Stable kind string.
    pub fn kind(&self) -> &'static str {
        match self {
            InferError::ModelNotFound(_) => "model_not_found",
            InferError::VersionNotFound { .. } => "version_not_found",
            InferError::InvalidInput(_) => "invalid_input",
            InferError::Backend(_) => "backend",
            InferError::Overloaded { .. } => "overloaded",
            InferError::DeadlineExceeded { .. } => "deadline_exceeded",
            InferError::EnginePanicked(_) => "engine_panicked",
            InferError::Stopped => "stopped",
        }
    }
}
