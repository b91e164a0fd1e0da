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
//!
//! [validation]
//! nan = true
//! inf = true
//! magnitude = true
//! max_abs = 1e6
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
//! [engine]                   # passed to the backend as is
//! sessions = 2
//! ```

use std::path::Path;

use serde::Deserialize;

use crate::signature::{Signature, TensorSpec};

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
}

impl Default for Policy {
    fn default() -> Self {
        Policy { keep_previous: 1, drain_timeout_ms: 30_000 }
    }
}

/// Which tensor checks run on a candidate's weights.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationPolicy {
    /// Refuse NaN in floating-point weights.
    pub nan: bool,
    /// Refuse infinities in floating-point weights.
    pub inf: bool,
    /// Refuse any element with absolute value above `max_abs`.
    pub magnitude: bool,
    /// The bound for `magnitude`.
    pub max_abs: f64,
    /// Refuse weight tensors of rank 2 or more that are entirely zero. A zero
    /// bias vector can be legitimate, so rank-1 tensors are not checked.
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
            max_abs: 1e6,
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
/// refused at once (see [`crate::admission`]). Unset bounds are derived from
/// the number of engine instances when the version loads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionPolicy {
    /// Requests admitted to the version and not yet answered, waiting or
    /// running. Default: `max_queue` plus what the instances run at once
    /// (one request each, or `max_batch` each with batching on).
    pub max_in_flight: Option<usize>,
    /// Requests waiting for a session thread, beyond those an idle thread
    /// is about to take. Default: [`crate::admission::QUEUE_PER_INSTANCE`]
    /// per instance. 0 admits a request only when a thread is idle.
    pub max_queue: Option<usize>,
    /// A request whose estimated run time is at most this many
    /// microseconds runs inline on the thread that submits it when an
    /// instance is free and nobody waits, instead of being handed to a
    /// session thread. Default [`crate::admission::INLINE_US`]; 0 hands
    /// every request over.
    pub inline_us: Option<u64>,
}

impl ModelSpec {
    /// Parses `model.toml` text.
    pub fn parse(text: &str) -> Result<ModelSpec, String> {
        let spec: ModelSpec = toml::from_str(text).map_err(|e| e.to_string())?;
        if !spec.validation.max_abs.is_finite() || spec.validation.max_abs <= 0.0 {
            return Err("validation.max_abs must be a positive finite number".into());
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
        assert_eq!(spec.validation.max_abs, 1e6);
    }

    #[test]
    fn full_spec_parses_and_typos_are_refused() {
        let spec = ModelSpec::parse(
            r#"
            inputs = [{ name = "x", datatype = "FP32", shape = [-1, 4] }]
            [policy]
            keep_previous = 3
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
        assert!(!spec.validation.nan && spec.validation.inf);
        assert_eq!(spec.engine.get("sessions").and_then(|v| v.as_integer()), Some(4));
        let err = ModelSpec::parse("[policy]\nkeep_prevous = 2").unwrap_err();
        assert!(err.contains("keep_prevous"), "{err}");
        assert!(ModelSpec::parse("[validation]\nmax_abs = -1.0").is_err());
        let admission = ModelSpec::parse("[admission]\nmax_queue = 0\nmax_in_flight = 3").unwrap().admission;
        assert_eq!((admission.max_queue, admission.max_in_flight), (Some(0), Some(3)));
        assert!(ModelSpec::parse("[admission]\nmax_in_flight = 0").is_err());
        assert!(ModelSpec::parse("[admission]\nmax_queu = 1").is_err());
    }
}
