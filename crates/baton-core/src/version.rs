//! An immutable, loaded model version.
//!
//! A version owns its engine model, and dropping its last `Arc` frees it.
//! The free itself does not happen on whatever thread let go last — often a
//! serving thread finishing a request — but is handed to the memory keeper,
//! which frees the engine off the serving path and measures what came back.

use std::sync::Arc;
use std::time::SystemTime;

use crate::backend::{BackendError, Model};
use crate::batcher::Batcher;
use crate::error::InferError;
use crate::heap::HeapLease;
use crate::manifest::Manifest;
use crate::memory::Releaser;
use crate::pipeline::warmup::{Sample, Warmed};
use crate::signature::Signature;
use crate::spec::ModelSpec;
use crate::tensor::Tensor;

/// One loaded version of a model.
pub struct Version {
    model: String,
    number: u64,
    spec: Arc<ModelSpec>,
    manifest: Manifest,
    warmup: Vec<Sample>,
    warmed: Warmed,
    bytes_held: u64,
    loaded_at: SystemTime,
    engine: Option<Arc<dyn Model>>,
    batcher: Option<Batcher>,
    releaser: Option<Releaser>,
    /// Declared last, so that without a releaser it is dropped after the engine.
    heap: Option<HeapLease>,
}

/// Everything a version is built from; see [`Version::new`].
pub struct VersionParts {
    /// Model name.
    pub model: String,
    /// Version number.
    pub number: u64,
    /// The `model.toml` it was loaded with.
    pub spec: Arc<ModelSpec>,
    /// Its verified manifest.
    pub manifest: Manifest,
    /// The warmup samples it passed.
    pub warmup: Vec<Sample>,
    /// How its warmup went.
    pub warmed: Warmed,
    /// Memory it holds, as measured while it loaded.
    pub bytes_held: u64,
    /// The engine model.
    pub engine: Box<dyn Model>,
    /// The lease on the thread whose arena holds the engine's memory; see
    /// [`crate::heap`]. Released after the engine is freed.
    pub heap: Option<HeapLease>,
}

impl Version {
    /// Builds a version. With a releaser, dropping it hands the engine to the
    /// memory keeper; without one (tests), the engine is dropped in place.
    pub fn new(parts: VersionParts, releaser: Option<Releaser>) -> Version {
        let engine: Arc<dyn Model> = Arc::from(parts.engine);
        let heavy = parts.warmed.fastest >= crate::batcher::HEAVY_INFERENCE;
        let batcher = (parts.spec.batching.enabled && engine.signature().is_batched())
            .then(|| Batcher::new(Arc::clone(&engine), &parts.spec.batching, heavy));
        Version {
            model: parts.model,
            number: parts.number,
            spec: parts.spec,
            manifest: parts.manifest,
            warmup: parts.warmup,
            warmed: parts.warmed,
            bytes_held: parts.bytes_held,
            loaded_at: SystemTime::now(),
            engine: Some(engine),
            batcher,
            releaser,
            heap: parts.heap,
        }
    }

    /// Model name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Version number.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The `model.toml` this version was loaded with.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The verified manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The warmup samples this version passed.
    pub fn warmup(&self) -> &[Sample] {
        &self.warmup
    }

    /// Whether an inference is expected to take long enough to move it off
    /// an async worker (its fastest warmup run took at least
    /// [`crate::batcher::HEAVY_INFERENCE`]).
    pub fn heavy(&self) -> bool {
        self.warmed.fastest >= crate::batcher::HEAVY_INFERENCE
    }

    /// How its warmup went: runs, the fastest and slowest of them, and
    /// why no inputs were generated, if none were.
    pub fn warmed(&self) -> &Warmed {
        &self.warmed
    }

    /// Memory held, measured while loading.
    pub fn bytes_held(&self) -> u64 {
        self.bytes_held
    }

    /// When the version was committed to memory.
    pub fn loaded_at(&self) -> SystemTime {
        self.loaded_at
    }

    fn engine(&self) -> &dyn Model {
        // The engine is only taken out in `drop`.
        self.engine.as_deref().expect("engine present until drop")
    }

    /// The signature the model file declares.
    pub fn signature(&self) -> &Signature {
        self.engine().signature()
    }

    /// Runs one inference after checking the inputs against the signature.
    /// Bypasses dynamic batching; see [`Version::submit`].
    pub fn infer(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, InferError> {
        self.signature().check_inputs(inputs).map_err(InferError::InvalidInput)?;
        crate::step_aside::note_request();
        Ok(self.engine().infer(inputs)?)
    }

    /// Whether requests to this version are batched dynamically.
    pub fn batches(&self) -> bool {
        self.batcher.is_some()
    }

    /// Checks the inputs, then queues them for dynamic batching; the future
    /// resolves to this request's own outputs. Without batching, runs the
    /// inference now and returns a future that is already resolved.
    pub fn submit(&self, inputs: Vec<Tensor>) -> Result<Pending, InferError> {
        self.signature().check_inputs(&inputs).map_err(InferError::InvalidInput)?;
        crate::step_aside::note_request();
        Ok(match &self.batcher {
            Some(batcher) => Pending::Queued(batcher.submit(inputs)),
            None => Pending::Done(Some(self.engine().infer(&inputs).map_err(InferError::from))),
        })
    }
}

/// The outputs of a request given to [`Version::submit`].
pub enum Pending {
    /// Waiting in the batcher's queue.
    Queued(tokio::sync::oneshot::Receiver<crate::batcher::Answer>),
    /// Already answered.
    Done(Option<Result<Vec<Tensor>, InferError>>),
}

impl std::future::Future for Pending {
    type Output = Result<Vec<Tensor>, InferError>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            Pending::Done(answer) => std::task::Poll::Ready(
                answer
                    .take()
                    .unwrap_or_else(|| Err(InferError::Backend(BackendError::new("internal", "polled twice")))),
            ),
            Pending::Queued(rx) => std::pin::Pin::new(rx).poll(cx).map(|answer| match answer {
                Ok(result) => result.map_err(InferError::from),
                Err(_) => Err(InferError::Backend(BackendError::new("internal", "the batcher stopped"))),
            }),
        }
    }
}

impl Drop for Version {
    fn drop(&mut self) {
        // The batcher's threads share the engine; they are joined first so
        // the engine's last reference goes to the releaser.
        drop(self.batcher.take());
        if let (Some(engine), Some(releaser)) = (self.engine.take(), self.releaser.take()) {
            let (files, heap) = (self.manifest.total_bytes(), self.heap.take());
            releaser.release(&self.model, self.number, files, self.bytes_held, engine, heap);
        }
    }
}

impl std::fmt::Debug for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Version")
            .field("model", &self.model)
            .field("number", &self.number)
            .field("bytes_held", &self.bytes_held)
            .finish_non_exhaustive()
    }
}
