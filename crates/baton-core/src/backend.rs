//! The contract between baton's core and an inference engine.
//!
//! The core drives every stage of a load and decides what is checked; a
//! backend only turns files into something that runs, reports what the model
//! declares, and lets the core see its weights. That keeps the core free of
//! any engine, and lets a test run the whole load transaction on a fake one.

use thiserror::Error;

use crate::signature::Signature;
use crate::spec::ModelSpec;
use crate::tensor::{DataType, Tensor};
use crate::verified::Verified;

/// An engine that can load model versions.
pub trait Backend: Send + Sync + 'static {
    /// The name `model.toml` uses to pick this backend.
    fn name(&self) -> &'static str;

    /// Creates a runnable model from a verified version. Called on baton's
    /// loader thread, which runs at lower CPU priority than serving;
    /// whatever threads the backend creates for serving must not inherit it.
    ///
    /// The backend reads the version's files through `version`'s open files
    /// ([`Verified::file`]), never by path: those are the files the verify
    /// stage hashed, whatever has been renamed over their paths since. Once
    /// it has read what it needs, it checks that none was written to since
    /// ([`VerifiedFile::unchanged`](crate::verified::VerifiedFile::unchanged))
    /// and refuses the load if one was (`file_changed`). An engine that must
    /// be given a path gets [`VerifiedFile::fd_path`](crate::verified::VerifiedFile::fd_path).
    fn load(&self, version: &Verified, spec: &ModelSpec) -> Result<Box<dyn Model>, BackendError>;
}

/// A loaded model version, ready to run.
pub trait Model: Send + Sync + 'static {
    /// The inputs and outputs as the model file declares them.
    fn signature(&self) -> &Signature;

    /// Calls `visit` once per weight tensor of the model file, reading the
    /// tensors from the file itself (external data included), not from the
    /// engine's copy of them; a backend may hand over the bytes it built the
    /// engine from instead of reading the file again. Stops at the first
    /// error `visit` returns.
    fn visit_weights(&self, visit: &mut dyn FnMut(&Weight<'_>) -> Result<(), String>) -> Result<(), WeightsError>;

    /// Runs one inference on any free instance.
    fn infer(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError>;

    /// How many independent instances serve requests (sessions in a pool).
    fn instances(&self) -> usize {
        1
    }

    /// Runs one inference on a given instance, so warmup reaches each one.
    fn infer_on(&self, instance: usize, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let _ = instance;
        self.infer(inputs)
    }
}

/// One weight tensor, borrowed from the backend while it is checked.
#[derive(Debug)]
pub struct Weight<'a> {
    /// Tensor name in the model file.
    pub name: &'a str,
    /// Element datatype, or `None` for a type baton cannot check.
    pub datatype: Option<DataType>,
    /// Dimensions.
    pub shape: &'a [i64],
    /// Little-endian element bytes.
    pub data: &'a [u8],
}

/// An engine failure while loading or running a model.
#[derive(Debug, Error)]
#[error("{message}")]
pub struct BackendError {
    /// Stable kind string, e.g. `model_invalid`, `runtime_missing`.
    pub kind: &'static str,
    /// What happened, for people.
    pub message: String,
}

impl BackendError {
    /// A new error.
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        BackendError { kind, message: message.into() }
    }
}

impl From<crate::manifest::VerifyError> for BackendError {
    /// A verified file that could not be read, or changed after it was
    /// verified; the kind is the verify error's (`file_changed`, `io`).
    fn from(error: crate::manifest::VerifyError) -> Self {
        BackendError::new(error.kind(), error.to_string())
    }
}

/// Failure to read the weights, or a weight refused by the visitor.
#[derive(Debug, Error)]
pub enum WeightsError {
    /// The model file could not be read or parsed.
    #[error("reading weights: {0}")]
    Read(String),
    /// The visitor refused a tensor.
    #[error("{0}")]
    Refused(String),
}
