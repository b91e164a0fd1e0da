//! Guards: the evidence a candidate must give, window by window, before it
//! takes more traffic, and the rules that judge a window.

use serde::{Deserialize, Serialize};

use super::window::Window;

/// Thresholds a candidate's window is held to, against the stable version
/// in the same window. A guard set to `None` is not checked.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Guards {
    /// Requests each side must have in a window (comparisons, for the drift
    /// guards) before the window can pass or fail.
    pub min_samples: u64,
    /// The candidate's error rate may exceed the stable version's by at
    /// most this much (0.01 = one percentage point).
    pub max_error_rate_increase: Option<f64>,
    /// The candidate's p99 latency over the stable version's.
    pub max_p99_ratio: Option<f64>,
    /// The largest absolute difference of any output element.
    pub max_abs_diff: Option<f64>,
    /// The mean relative L2 distance of an output.
    pub max_rel_l2: Option<f64>,
    /// The mean cosine similarity of an output.
    pub min_cosine: Option<f64>,
    /// The share of rows of a class-score output with the same top class.
    pub min_top1_agreement: Option<f64>,
}

impl Default for Guards {
    fn default() -> Self {
        Guards {
            min_samples: 100,
            max_error_rate_increase: Some(0.01),
            max_p99_ratio: Some(1.5),
            max_abs_diff: None,
            max_rel_l2: None,
            min_cosine: None,
            min_top1_agreement: None,
        }
    }
}

/// What a window came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Every guard held, each over enough samples.
    Pass,
    /// A guard failed over enough samples.
    Fail,
    /// Too few samples, or a value that is not a number: neither passes nor
    /// fails.
    Inconclusive,
}

/// One guard's reading in one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// The guard, e.g. `p99_ratio` or `rel_l2:scores`.
    pub guard: String,
    /// The measured value, when there was one.
    pub value: Option<f64>,
    /// The threshold it was held to.
    pub threshold: f64,
    /// The samples it was measured over.
    pub samples: u64,
    /// What it came to.
    pub outcome: Outcome,
}

/// The judgement of one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Fail if any guard failed, else inconclusive if any was, else pass.
    pub outcome: Outcome,
    /// Every guard's reading.
    pub checks: Vec<Check>,
    /// A sentence saying why, for events and status.
    pub reason: String,
}

/// Judges one window against the guards.
pub fn evaluate(guards: &Guards, window: &Window) -> Verdict {
    let _ = (guards, window);
    Verdict { outcome: Outcome::Inconclusive, checks: Vec::new(), reason: "not judged".to_owned() }
}
