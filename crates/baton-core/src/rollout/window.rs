//! What requests observe during a rollout, one window at a time: per role,
//! requests, errors and latency; per output, how the candidate's answers
//! compare with the stable version's; shadow copies dropped.
//!
//! Requests record into [`Observations`] (a short lock, no allocation on
//! the request path); the controller takes the window at the end of each
//! interval, which starts the next one and adds the finished one to the
//! rollout's totals.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::Role;
use crate::tensor::Tensor;

/// Shared by the requests of one rollout and its controller.
#[derive(Debug, Default)]
pub struct Observations {}

impl Observations {
    /// Counts one request `role` answered (or failed) in `latency`. Requests
    /// to [`Role::Previous`] are not counted.
    pub fn record(&self, role: Role, latency: Duration, failed: bool) {
        let _ = (role, latency, failed);
    }

    /// Compares the outputs the stable version gave for one request with
    /// the candidate's, output by output (matched by name).
    pub fn record_comparison(&self, stable: &[Tensor], candidate: &[Tensor]) {
        let _ = (stable, candidate);
    }

    /// Counts a comparison that could not run: the candidate (or, paired,
    /// the stable version) failed on the copy.
    pub fn record_comparison_error(&self) {}

    /// Counts a copy dropped because the comparison queue was full.
    pub fn record_dropped(&self) {}

    /// The window since the last take; starts the next one and adds this
    /// one into the totals.
    pub fn take(&self) -> Window {
        Window::default()
    }

    /// Everything observed since the rollout began, the open window
    /// included.
    pub fn totals(&self) -> Window {
        Window::default()
    }
}

/// What one window (or the whole rollout) observed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Window {
    /// Requests the stable version answered.
    pub stable: Side,
    /// Requests the candidate answered, on the response path (canary, A/B)
    /// or as shadow copies.
    pub candidate: Side,
    /// Per output name, how the candidate's answers compare.
    pub outputs: BTreeMap<String, OutputDrift>,
    /// Requests compared (both sides answered).
    pub compared: u64,
    /// Comparisons that could not run because a side failed.
    pub comparison_errors: u64,
    /// Copies dropped because the comparison queue was full.
    pub dropped: u64,
}

/// One role's requests in a window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Side {
    /// Requests answered or failed.
    pub requests: u64,
    /// Of those, failed.
    pub errors: u64,
    /// The 99th percentile latency, in milliseconds, when any request ran.
    pub p99_ms: Option<f64>,
}

impl Side {
    /// Failed requests over all requests; `None` when there were none.
    pub fn error_rate(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.errors as f64 / self.requests as f64)
    }
}

/// How one output of the candidate compares with the stable version's.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OutputDrift {
    /// Comparisons of this output.
    pub samples: u64,
    /// The largest absolute difference of any element.
    pub max_abs_diff: f64,
    /// The mean over comparisons of ‖candidate − stable‖ / ‖stable‖.
    pub rel_l2: f64,
    /// The mean over comparisons of the cosine similarity.
    pub cosine: f64,
    /// For outputs that look like class scores (a batch of rows of two or
    /// more scores): the share of rows whose highest score is the same
    /// class on both sides.
    pub top1_agreement: Option<f64>,
}
