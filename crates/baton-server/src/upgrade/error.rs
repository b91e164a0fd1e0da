//! Why an upgrade did not happen, with a stable kind for responses and
//! logs. In every case the old process serves on, unchanged.

use std::time::Duration;

/// Why an upgrade did not happen; the old process serves on.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The new binary could not be started.
    #[error("starting {binary}: {error}")]
    Start {
        /// The binary's path.
        binary: String,
        /// Why it did not start.
        error: std::io::Error,
    },
    /// The new process ended before it was ready.
    #[error("the new process exited before it was ready ({status})")]
    Exited {
        /// How it ended.
        status: String,
    },
    /// The new process said why it could not start or become ready.
    #[error("the new process could not take over: {0}")]
    Failed(String),
    /// The new process was not ready in time, and was stopped.
    #[error("the new process was not ready within {within:?}; it was stopped: {stopped}")]
    TimedOut {
        /// The time it had.
        within: Duration,
        /// How it ended once stopped.
        stopped: String,
    },
    /// An upgrade is already running, or the server cannot hand itself
    /// over now.
    #[error("{0}")]
    Busy(&'static str),
    /// Handing the sockets over failed.
    #[error("handing over to the new process: {0}")]
    Channel(std::io::Error),
}

impl UpgradeError {
    /// A stable kind string for responses.
    pub fn kind(&self) -> &'static str {
        match self {
            UpgradeError::Busy(_) => "upgrade_in_progress",
            _ => "upgrade_failed",
        }
    }
}
