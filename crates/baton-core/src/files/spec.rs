//! `model.toml`: what a model is and how baton treats its versions.
//!
//! The spec is read again at every load, so a changed policy applies from the
//! next version on, and the version keeps the spec it was loaded with.
//!
//! ```toml
//! backend = "onnx"
//! required = true            # readiness waits for this model
//! max_batch_size = 64        # largest batch a request may carry
//! inputs  = [{ name = "input",  datatype = "FP32", shape = [-1, 256] }]
//! outputs = [{ name = "output", datatype = "FP32", shape = [-1, 1] }]
//!
//! [policy]
//! keep_previous = 1          # versions kept loaded for instant rollback
//! drain_timeout_ms = 30000   # how long a swap waits for in-flight requests
//! allow_symlinks_outside_version = false  # files may not lead out of their version
//! memory_budget = "2GiB"     # refuse a load that would take this model's versions beyond it; none by default
//! swap = "availability"      # or "resource": free the old version before the new one loads
//!
//! [validation]                # see ValidationPolicy for what each check covers
//! nan = true
//! inf = true
//! magnitude = true           # elements far beyond the tensor's own scale
//! max_ratio = 1e6            # how far: times its typical magnitude
//! # max_abs = 1e6            # an absolute bound besides; none by default
//! zero_tensors = true        # all-zero weight matrices (rank >= 2)
//! tensors = [{ name = "fc0.weight", datatype = "FP32", shape = [256, 1024] }]
//!
//! [warmup]
//! batch_sizes = [1, 8, 32, 64]
//! generated = true           # also warm with generated inputs
//! max_latency_ms = 2000      # a slower warmup run fails the load
//!
//! [batching]                 # join concurrent requests into one inference
//! enabled = false
//! max_batch = 32
//! max_queue_delay_us = 0
//!
//! [admission]                # bounds on the requests a version holds
//! max_queue = 64             # waiting for a session thread; default 32 per instance
//! max_in_flight = 80         # waiting and running; default: the queue plus what the instances run at once
//! inline_us = 1000           # cheaper requests may run on the async worker when a session is free
//!
//! [rollout]                  # canary, A/B or shadow; see rollout::plan
//! auto = false
//!
//! [engine]                   # passed to the backend as is
//! sessions = 2
//! ```

use std::path::Path;

use serde::Deserialize;

use crate::tensors::signature::{Signature, TensorSpec};

/// A parsed `model.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Which backend loads the model (`onnx`).
    #[serde(default = "default_backend")]
    pub backend: String,
    /// Whether the server is ready only once this model serves (default true).
    #[serde(default = "yes")]
    pub required: bool,
    /// The largest batch a request may carry, for models whose inputs and
    /// outputs all batch along a variable first dimension. Protocol front
    /// ends publish it (Triton's `max_batch_size`) and refuse larger batches.
    #[serde(default)]
    pub max_batch_size: Option<usize>,
    /// Declared inputs; checked against the model file at validation.
    #[serde(default)]
    pub inputs: Vec<TensorSpec>,
    /// Declared outputs; checked against the model file at validation.
    #[serde(default)]
    pub outputs: Vec<TensorSpec>,
    /// Version-keeping and drain policy.
    #[serde(default)]
    pub policy: Policy,
    /// Tensor-level checks.
    #[serde(default)]
    pub validation: ValidationPolicy,
    /// Warmup before a version sees traffic.
    #[serde(default)]
    pub warmup: WarmupPolicy,
    /// Dynamic batching of concurrent requests.
    #[serde(default)]
    pub batching: BatchingPolicy,
    /// How many requests a version takes before it refuses more.
    #[serde(default)]
    pub admission: AdmissionPolicy,
    /// How a new version is rolled out beside the stable one, and the
    /// guards it is held to ([`crate::files::rollout_spec`]).
    #[serde(default)]
    pub rollout: crate::files::rollout_spec::RolloutPolicy,
    /// Backend-specific settings, handed to the backend unparsed.
    #[serde(default)]
    pub engine: toml::Table,
}

fn yes() -> bool {
    true
}

fn default_backend() -> String {
    "onnx".to_owned()
}

/// How many versions stay loaded and how long a swap waits.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// Previous versions kept loaded so rollback is a pointer store.
    pub keep_previous: usize,
    /// How long the drain stage waits for requests pinned to the old state.
    pub drain_timeout_ms: u64,
    /// Whether a version's files may be symlinks to files outside its
    /// directory. Off by default: the verify stage refuses such a file
    /// (`outside_version`), because what it serves could then change, or be
    /// read from a place the repository's owner does not control, without
    /// the version changing. Symlinks between files of the version are
    /// always accepted.
    pub allow_symlinks_outside_version: bool,
    /// The most memory this model's live versions may hold together, in
    /// bytes (`"2GiB"` or a number in `model.toml`); none by default. A load
    /// that would go beyond it is refused (see [`crate::registry::budget`]).
    #[serde(deserialize_with = "crate::human::bytes::deserialize_optional")]
    pub memory_budget: Option<u64>,
    /// Whether a new version loads beside the old one or in its place.
    pub swap: SwapPolicy,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            keep_previous: 1,
            drain_timeout_ms: 30_000,
            allow_symlinks_outside_version: false,
            memory_budget: None,
            swap: SwapPolicy::Availability,
        }
    }
}

/// How a load replaces the version that serves (docs/hot-swap.md, "Swap
/// policy: availability or resource").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SwapPolicy {
    /// The new version loads beside the old one, which serves until the
    /// commit: no pause, twice the memory for the length of a load.
    #[default]
    Availability,
    /// The old version is drained and freed before the new one loads:
    /// about one version's memory at the peak, and requests wait for the
    /// length of a load. No previous version is kept.
    Resource,
}

impl SwapPolicy {
    /// As written in `model.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            SwapPolicy::Availability => "availability",
            SwapPolicy::Resource => "resource",
        }
    }
}

impl Policy {
    /// What the verify stage accepts under this policy.
    pub fn verify_options(&self) -> crate::files::manifest::VerifyOptions {
        crate::files::manifest::VerifyOptions { allow_symlinks_outside_version: self.allow_symlinks_outside_version }
    }
}

/// Which tensor checks run on a candidate's weights.
///
/// The checks look at floating-point tensors only (FP16, FP32, FP64):
/// integer tensors are indices, shapes and quantized codes, whose values
/// say nothing about corruption. The backend tells each tensor's role
/// ([`WeightRole`](crate::run::backend::WeightRole)) from the model's graph:
///
/// - a **compute** weight (multiplied, convolved, looked up as an
///   embedding, a normalization's scale or bias) gets every check;
/// - a **constant** (a mask, a fill value, a scalar of arithmetic, an
///   operand of an addition) gets every check too, unless it is
///   mask-like: a single element, or only zeros, infinities and extreme
///   values (magnitude at least 2^64, or 2^15 for FP16, whose largest
///   finite value is 65504). Exports fill masks with those: PyTorch's
///   `finfo(float32).min` (-3.4e38) for padding, `-inf` for causal masks.
///   A mask-like constant is checked for NaN only, and no constant is
///   refused for being all zero.
///
/// NaN is refused in every floating-point tensor: no export writes one on
/// purpose. An infinity among ordinary values (a bias vector holding one
/// Inf) is refused whatever the role.
///
/// The magnitude check is relative: an element is refused when it is more
/// than `max_ratio` times the tensor's typical magnitude, the geometric
/// mean of its normal non-zero finite elements. Both are judged by binary
/// exponent (`floor(log2 |v|)`), so the element's exponent may exceed the
/// mean exponent by at most `log2(max_ratio)`; whole binades make the
/// bound exact to within a factor of two either way. A corrupted element
/// (a flipped exponent bit, garbage bytes) is many orders of magnitude
/// off; trained weights stay within a few hundred times their typical
/// size. The mean is computed in the same pass as the other checks, and
/// one outlier among n elements moves it by only 1/n of its own exponent.
/// An absolute bound is there besides when `max_abs` is set (off by
/// default: legitimate constants reach 3.4e38).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationPolicy {
    /// Refuse NaN in floating-point tensors.
    pub nan: bool,
    /// Refuse infinities in floating-point tensors other than mask-like
    /// constants.
    pub inf: bool,
    /// Refuse elements beyond the tensor's own scale (`max_ratio`), and
    /// beyond `max_abs` when it is set.
    pub magnitude: bool,
    /// How many times the typical magnitude an element may reach, at
    /// least 2 (default one million).
    pub max_ratio: f64,
    /// An absolute bound on every element, off unless set.
    pub max_abs: Option<f64>,
    /// Refuse compute weights of rank 2 or more that are entirely zero. A
    /// zero bias vector can be legitimate, so rank-1 tensors are not
    /// checked, nor are constants (zero padding, an empty mask).
    pub zero_tensors: bool,
    /// Weights whose datatype and shape are declared; each must exist and match.
    pub tensors: Vec<TensorSpec>,
}

impl Default for ValidationPolicy {
    fn default() -> Self {
        ValidationPolicy {
            nan: true,
            inf: true,
            magnitude: true,
            max_ratio: 1e6,
            max_abs: None,
            zero_tensors: true,
            tensors: Vec::new(),
        }
    }
}

/// How a candidate is warmed before it sees traffic.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WarmupPolicy {
    /// Batch sizes of the generated warmup inputs.
    pub batch_sizes: Vec<usize>,
    /// Whether generated inputs run besides the version's own `warmup/` samples.
    pub generated: bool,
    /// A warmup run slower than this fails the load. A run's time leaves
    /// out what the low-priority loader thread spent waiting for a CPU or
    /// stepped aside for threads that wait for one.
    pub max_latency_ms: u64,
}

impl Default for WarmupPolicy {
    fn default() -> Self {
        WarmupPolicy { batch_sizes: vec![1, 8, 32, 64], generated: true, max_latency_ms: 2_000 }
    }
}

/// Dynamic batching: concurrent requests joined along the batch dimension.
///
/// Off by default: a row computed in a batch can differ from the same row
/// computed alone in the last bits of a float, because the engine may pick
/// a different kernel for a different batch size.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchingPolicy {
    /// Whether requests are batched.
    pub enabled: bool,
    /// The most rows one batch holds.
    pub max_batch: usize,
    /// How long the oldest queued request may wait for others to join it,
    /// in microseconds. 0: batch only what is already waiting.
    pub max_queue_delay_us: u64,
}

impl Default for BatchingPolicy {
    fn default() -> Self {
        BatchingPolicy { enabled: false, max_batch: 32, max_queue_delay_us: 0 }
    }
}

/// Bounds on the requests one version holds; a request beyond them is
/// refused at once (see [`crate::run::admission`]). Unset bounds are derived from
/// the number of engine instances when the version loads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionPolicy {
    /// Requests admitted to the version and not yet answered, waiting or
    /// running. Default: `max_queue` plus what the instances run at once
    /// (one request each, or `max_batch` each with batching on).
    pub max_in_flight: Option<usize>,
    /// Requests waiting for a session thread, beyond those an idle thread
    /// is about to take. Default: [`crate::run::admission::QUEUE_PER_INSTANCE`]
    /// per instance. 0 admits a request only when a thread is idle.
    pub max_queue: Option<usize>,
    /// A request whose estimated run time is at most this many
    /// microseconds runs inline on the thread that submits it when an
    /// instance is free and nobody waits, instead of being handed to a
    /// session thread. Default [`crate::run::admission::INLINE_US`]; 0 hands
    /// every request over.
    pub inline_us: Option<u64>,
}

impl ModelSpec {
    /// Parses `model.toml` text.
    pub fn parse(text: &str) -> Result<ModelSpec, String> {
        let spec: ModelSpec = toml::from_str(text).map_err(|e| e.to_string())?;
        if spec.validation.max_abs.is_some_and(|m| !m.is_finite() || m <= 0.0) {
            return Err("validation.max_abs must be a positive finite number".into());
        }
        if !spec.validation.max_ratio.is_finite() || spec.validation.max_ratio < 2.0 {
            return Err("validation.max_ratio must be a finite number of at least 2".into());
        }
        if spec.admission.max_in_flight == Some(0) {
            return Err("admission.max_in_flight must be at least 1".into());
        }
        Ok(spec)
    }

    /// Reads and parses `dir/model.toml`.
    pub fn read(dir: &Path) -> Result<ModelSpec, String> {
        let path = dir.join("model.toml");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        ModelSpec::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The signature `model.toml` declares.
    pub fn declared_signature(&self) -> Signature {
        Signature { inputs: self.inputs.clone(), outputs: self.outputs.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_a_minimal_spec() {
        let spec = ModelSpec::parse("").unwrap();
        assert_eq!(spec.backend, "onnx");
        assert_eq!(spec.policy.keep_previous, 1);
        assert_eq!(spec.warmup.batch_sizes, vec![1, 8, 32, 64]);
        assert_eq!(spec.validation.max_abs, None, "no absolute bound unless asked for");
        assert_eq!(spec.validation.max_ratio, 1e6);
    }

    #[test]
    fn full_spec_parses_and_typos_are_refused() {
        let spec = ModelSpec::parse(
            r#"
            inputs = [{ name = "x", datatype = "FP32", shape = [-1, 4] }]
            [policy]
            keep_previous = 3
            allow_symlinks_outside_version = true
            [validation]
            nan = false
            max_abs = 10.0
            [engine]
            sessions = 4
            "#,
        )
        .unwrap();
        assert_eq!(spec.inputs[0].shape, vec![-1, 4]);
        assert_eq!(spec.policy.keep_previous, 3);
        assert!(spec.policy.verify_options().allow_symlinks_outside_version);
        assert!(!ModelSpec::parse("").unwrap().policy.allow_symlinks_outside_version);
        assert!(!spec.validation.nan && spec.validation.inf);
        assert_eq!(spec.engine.get("sessions").and_then(|v| v.as_integer()), Some(4));
        let err = ModelSpec::parse("[policy]\nkeep_prevous = 2").unwrap_err();
        assert!(err.contains("keep_prevous"), "{err}");
        assert_eq!(spec.validation.max_abs, Some(10.0));
        assert!(ModelSpec::parse("[validation]\nmax_abs = -1.0").is_err());
        assert!(ModelSpec::parse("[validation]\nmax_ratio = 1.5").is_err());
        assert!(ModelSpec::parse("[validation]\nmax_ratio = inf").is_err());
        let admission = ModelSpec::parse("[admission]\nmax_queue = 0\nmax_in_flight = 3").unwrap().admission;
        assert_eq!((admission.max_queue, admission.max_in_flight), (Some(0), Some(3)));
        assert!(ModelSpec::parse("[admission]\nmax_in_flight = 0").is_err());
        assert!(ModelSpec::parse("[admission]\nmax_queu = 1").is_err());
    }

    #[test]
    fn the_memory_budget_takes_units_and_the_swap_policy_two_names() {
        let policy = ModelSpec::parse("").unwrap().policy;
        assert_eq!((policy.memory_budget, policy.swap), (None, SwapPolicy::Availability));
        let policy = ModelSpec::parse("[policy]\nmemory_budget = \"2GiB\"\nswap = \"resource\"").unwrap().policy;
        assert_eq!((policy.memory_budget, policy.swap), (Some(2 << 30), SwapPolicy::Resource));
        assert_eq!(ModelSpec::parse("[policy]\nmemory_budget = 4096").unwrap().policy.memory_budget, Some(4096));
        assert!(ModelSpec::parse("[policy]\nmemory_budget = \"2GB\"").is_err());
        assert!(ModelSpec::parse("[policy]\nswap = \"fast\"").is_err());
    }
}
