//! `model.toml`'s `[rollout]` section: the mode a rollout starts in, its
//! steps and windows, and the guards each window is held to. The rollout
//! room (`rollout`) turns it into a plan and judges windows by it; the
//! declaration stands here, beside the rest of the spec, because every
//! version's spec carries it.

use serde::{Deserialize, Serialize};

/// How a candidate takes part in traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The candidate answers a share of requests that moves through steps;
    /// after the last step passes, it is promoted.
    Canary,
    /// The candidate answers a fixed share of requests until someone
    /// decides.
    Ab,
    /// The candidate gets a copy of a share of the stable traffic, off the
    /// response path; its answers are compared, never returned.
    Shadow,
}

impl Mode {
    /// The name used in configuration, responses and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Canary => "canary",
            Mode::Ab => "ab",
            Mode::Shadow => "shadow",
        }
    }

    /// The mode in a sentence, with its article: "a canary", "an A/B",
    /// "a shadow" (rollout).
    pub fn in_words(self) -> &'static str {
        match self {
            Mode::Canary => "a canary",
            Mode::Ab => "an A/B",
            Mode::Shadow => "a shadow",
        }
    }

    /// Parses a name written by [`Mode::as_str`].
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "canary" => Some(Mode::Canary),
            "ab" => Some(Mode::Ab),
            "shadow" => Some(Mode::Shadow),
            _ => None,
        }
    }
}

/// `model.toml`'s `[rollout]` section.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutPolicy {
    /// Whether a newly published version starts a rollout rather than a
    /// full swap (the repository watcher's choice; an explicit load still
    /// swaps).
    pub auto: bool,
    /// The mode a rollout starts in unless told otherwise.
    pub mode: Mode,
    /// The candidate's share at each step, in percent.
    pub steps: Vec<f64>,
    /// The length of a window; a window is judged at its end.
    pub interval_ms: u64,
    /// Failed windows that roll the candidate back.
    pub failure_limit: u32,
    /// Inconclusive windows in a row after which the rollout pauses.
    pub max_inconclusive: u32,
    /// In canary and A/B modes, whether requests the candidate answers are
    /// also run on the stable version, off the response path, so that the
    /// drift guards have pairs to compare.
    pub paired: bool,
    /// Comparison copies that may wait; a copy beyond it is dropped and
    /// counted, never waited for.
    pub queue: usize,
    /// How long after promotion the new stable version is still judged
    /// against the old one, kept loaded as previous; a failed window in
    /// that time rolls back to it. 0: no watch.
    pub watch_ms: u64,
    /// Paired copies run on a twin of the stable version, loaded for the
    /// rollout with weights of its own, when the stable version holds at
    /// most this many MiB (and the memory budgets admit a second one);
    /// otherwise on the stable version itself. 0: never. See
    /// `rollout::Rollout::twin` for why.
    pub twin_max_mb: u64,
    /// What each window is held to.
    pub guards: Guards,
}

/// The largest stable version a rollout loads a twin of by default. A
/// twin costs what the stable version holds, for as long as the rollout
/// runs. The warmth it evens out is that of weights a CPU's caches hold
/// (a few MiB to a few hundred); a model much larger runs about as cold
/// on either side, and a second copy of it would cost more memory than
/// the bias it removes is worth.
pub const DEFAULT_TWIN_MAX_MB: u64 = 256;

/// The watch after promotion by default: five minutes, long enough for a
/// regression that needs traffic (a cache that warms, a feature that comes
/// into play) to show in error rate, latency and drift, and for business
/// signals that lag their requests by a minute or two; short next to the
/// hours a previous version may stay loaded anyway.
pub const DEFAULT_WATCH_MS: u64 = 300_000;

impl Default for RolloutPolicy {
    fn default() -> Self {
        RolloutPolicy {
            auto: false,
            mode: Mode::Canary,
            steps: vec![1.0, 5.0, 25.0, 50.0, 100.0],
            interval_ms: 30_000,
            failure_limit: 1,
            max_inconclusive: 10,
            paired: true,
            queue: 64,
            watch_ms: DEFAULT_WATCH_MS,
            twin_max_mb: DEFAULT_TWIN_MAX_MB,
            guards: Guards::default(),
        }
    }
}

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
    /// The candidate's outcome value per answer over the stable version's
    /// (posted outcomes: clicks, conversions, order values), at least.
    pub min_outcome_ratio: Option<f64>,
    /// Queries to the operator's Prometheus, read for both sides at the
    /// end of each window.
    pub metrics: Vec<MetricGuard>,
}

/// A guard on a number the operator's Prometheus holds: a PromQL query
/// with `{{model}}`, `{{version}}` and `{{window}}` in it, read once per
/// side, and the bounds of the candidate's value over the stable one's.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricGuard {
    /// The guard's name in checks, events and metrics (`metric:<name>`).
    pub name: String,
    /// The query; it must give exactly one number.
    pub query: String,
    /// The candidate's value over the stable one's, at least.
    #[serde(default)]
    pub min_ratio: Option<f64>,
    /// The candidate's value over the stable one's, at most.
    #[serde(default)]
    pub max_ratio: Option<f64>,
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
            min_outcome_ratio: None,
            metrics: Vec::new(),
        }
    }
}
