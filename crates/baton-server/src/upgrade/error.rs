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
    /// An upgrade is already running, or the server is shutting down.
    #[error("{0}")]
    Busy(&'static str),
    /// This server cannot replace itself at all (it is embedded in
    /// another program).
    #[error("{0}")]
    Unavailable(&'static str),
    /// What the upgrade waits for before it starts anything (an operator's
    /// operation already running, a rollout's decision in flight) was
    /// still going on when its timeout ran out; nothing was started.
    #[error(
        "the upgrade's timeout of {within:?} ran out while {what}; nothing was started (try again once it has ended, \
         or with a longer timeout)"
    )]
    Pending {
        /// The time it had.
        within: Duration,
        /// What it waited for.
        what: String,
    },
    /// Handing the sockets over failed.
    #[error("handing over to the new process: {0}")]
    Channel(std::io::Error),
}

impl UpgradeError {
    /// A stable kind string for responses.
    pub fn kind(&self) -> &'static str {
        match self {
            UpgradeError::Busy(_) => "upgrade_in_progress",
            UpgradeError::Unavailable(_) => "upgrade_unavailable",
            UpgradeError::Pending { .. } => "operation_in_progress",
            _ => "upgrade_failed",
        }
    }

    /// Whether the server's state, not the new process, stood in the way
    /// (409 rather than 422).
    pub fn is_conflict(&self) -> bool {
        matches!(self, UpgradeError::Busy(_) | UpgradeError::Unavailable(_) | UpgradeError::Pending { .. })
    }
}
