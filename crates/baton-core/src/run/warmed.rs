//! What a version keeps of its warmup: the samples it was warmed with
//! (a rollout's twin is warmed with them again) and what warmup measured.
//! The warmup stage itself is part of the load transaction
//! (`registry::load::warmup`).

use std::time::Duration;

use crate::tensors::tensor::Tensor;

/// One warmup request.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Where it came from: the file name, or `generated-b{batch}`.
    pub name: String,
    /// Its inputs.
    pub inputs: Vec<Tensor>,
}

/// What warmup did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Warmed {
    /// Inference runs made.
    pub runs: usize,
    /// The slowest run.
    pub slowest: Duration,
    /// The fastest run: about what the smallest request costs.
    pub fastest: Duration,
    /// Why no inputs were generated although `warmup.generated` is on: an
    /// integer input whose valid values the backend cannot tell.
    pub generated_skipped: Option<String>,
}
