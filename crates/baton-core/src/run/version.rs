//! An immutable, loaded model version.
//!
//! A version owns its engine model and the session threads that run it
//! ([`crate::run::executor`]), and dropping its last `Arc` frees both. The free
//! itself does not happen on whatever thread let go last — often a serving
//! thread finishing a request — but is handed to the memory keeper, which
//! frees the engine off the serving path and measures what came back.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::files::manifest::Manifest;
use crate::files::spec::ModelSpec;
use crate::run::admission::Limits;
use crate::run::backend::Model;
use crate::run::batcher::Batching;
use crate::run::error::{Expired, InferError};
use crate::run::executor::{Executor, Pending, Refusal};
use crate::run::release::Releaser;
use crate::run::warmed::{Sample, Warmed};
use crate::tensors::signature::Signature;
use crate::tensors::tensor::Tensor;
use crate::threads::heap::HeapLease;

/// One loaded version of a model.
pub struct Version {
    model: String,
    number: u64,
    spec: Arc<ModelSpec>,
    manifest: Manifest,
    warmup: Vec<Sample>,
    warmed: Warmed,
    bytes_held: u64,
    twin: bool,
    loaded_at: SystemTime,
    engine: Option<Arc<dyn Model>>,
    executor: Option<Executor>,
    releaser: Option<Releaser>,
    /// Declared last, so that without a releaser it is dropped after the engine.
    heap: Option<HeapLease>,
}

/// A live version's memory, as status shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VersionMemory {
    /// Bytes of its weights: the tensors its instances share, or, for an
    /// engine that does not share them, the size of the version's files.
    pub weights: u64,
    /// Of those, bytes held once for this version and another live version
    /// of the model, whose tensors are identical.
    pub shared: u64,
    /// What it holds beyond its own weights (`total` minus `weights` plus
    /// `shared`): the engine's sessions, their packed weights' padding,
    /// arenas and threads.
    pub session_overhead: u64,
    /// Everything it holds (`bytes_held`, measured while it loaded).
    pub total: u64,
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
    /// Whether it is a rollout's twin of the stable version (see
    /// [`Version::is_twin`]) rather than a version that serves.
    pub twin: bool,
    /// The lease on the thread whose arena holds the engine's memory; see
    /// [`crate::threads::heap`]. Released after the engine is freed.
    pub heap: Option<HeapLease>,
}

impl Version {
    /// Builds a version and starts its session threads. With a releaser,
    /// dropping it hands the engine to the memory keeper; without one
    /// (tests), the engine is dropped in place.
    pub fn new(parts: VersionParts, releaser: Option<Releaser>) -> Version {
        let engine: Arc<dyn Model> = Arc::from(parts.engine);
        let batching = (parts.spec.batching.enabled && engine.signature().is_batched())
            .then(|| Batching::new(&parts.spec.batching));
        let per_run = batching.map_or(1, |b| b.max_batch);
        let limits = Limits::resolve(&parts.spec.admission, engine.instances(), per_run);
        // Until its runs are measured, a model that ran no warmup is taken
        // to be too costly to run inline.
        let first_cost = if parts.warmed.runs > 0 { parts.warmed.fastest } else { Duration::from_secs(1) };
        let executor = Executor::start(Arc::clone(&engine), limits, batching, first_cost);
        Version {
            model: parts.model,
            number: parts.number,
            spec: parts.spec,
            manifest: parts.manifest,
            warmup: parts.warmup,
            warmed: parts.warmed,
            bytes_held: parts.bytes_held,
            twin: parts.twin,
            loaded_at: SystemTime::now(),
            engine: Some(engine),
            executor: Some(executor),
            releaser,
            heap: parts.heap,
        }
    }

    /// Whether its engine can still answer (see [`Model::alive`]).
    pub fn alive(&self) -> bool {
        self.engine.as_ref().is_none_or(|engine| engine.alive())
    }

    /// The worker process it runs in, if it runs in one.
    pub fn process(&self) -> Option<crate::run::backend::ProcessInfo> {
        self.engine.as_ref().and_then(|engine| engine.process())
    }

    /// See [`Model::on_exit`].
    pub(crate) fn on_exit(&self, notify: Box<dyn FnOnce(String) + Send>) {
        if let Some(engine) = &self.engine {
            engine.on_exit(notify);
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

    /// How its warmup went: runs, the fastest and slowest of them, and
    /// why no inputs were generated, if none were.
    pub fn warmed(&self) -> &Warmed {
        &self.warmed
    }

    /// Memory held in this process, measured while loading.
    pub fn bytes_held(&self) -> u64 {
        self.bytes_held
    }

    /// Everything the version holds, as the memory budgets count it:
    /// [`Version::bytes_held`], plus its worker process's resident memory
    /// now when it runs in one.
    pub fn holds(&self) -> u64 {
        let worker = self.engine().process().and_then(|p| p.rss).unwrap_or(0);
        self.bytes_held.saturating_add(worker)
    }

    /// Whether this is a rollout's twin of its stable version: a second
    /// instance of the same files, loaded for the rollout, that runs only
    /// the paired comparison copies and never answers a request (see
    /// [`crate::rollout::Rollout::twin`]).
    pub fn is_twin(&self) -> bool {
        self.twin
    }

    /// When the version was committed to memory.
    pub fn loaded_at(&self) -> SystemTime {
        self.loaded_at
    }

    /// What the engine says of the version's weights.
    pub fn weights(&self) -> crate::run::backend::WeightsInfo {
        self.engine().weights()
    }

    /// The version's memory, split into its weights, what it shares with
    /// another version and what its sessions add (see [`VersionMemory`]).
    pub fn memory(&self) -> VersionMemory {
        let info = self.weights();
        let weights = if info.shared > 0 { info.shared } else { self.manifest.total_bytes() };
        VersionMemory {
            weights,
            shared: info.reused,
            session_overhead: self.bytes_held.saturating_sub(weights - info.reused.min(weights)),
            total: self.bytes_held,
        }
    }

    fn engine(&self) -> &dyn Model {
        // The engine is only taken out in `drop`.
        self.engine.as_deref().expect("engine present until drop")
    }

    /// The signature the model file declares.
    pub fn signature(&self) -> &Signature {
        self.engine().signature()
    }

    /// The session threads and the queue that feed them: their bounds,
    /// what they hold now.
    pub fn executor(&self) -> &Executor {
        // The executor is only taken out in `drop`.
        self.executor.as_ref().expect("executor present until drop")
    }

    /// Whether requests to this version are batched dynamically.
    pub fn batches(&self) -> bool {
        self.executor().batching().is_some()
    }

    /// Checks the inputs, then queues them for a session thread (or runs a
    /// cheap request inline when an instance is free; see
    /// [`crate::run::admission::INLINE_US`]), or refuses them at once:
    /// [`InferError::Overloaded`] when the version holds as many requests
    /// as its `[admission]` bounds allow,
    /// [`InferError::DeadlineExceeded`] when `deadline` has passed. The
    /// future resolves to this request's own outputs; dropping it withdraws
    /// the request if it has not started. Never blocks beyond a short lock.
    pub fn submit(&self, inputs: Vec<Tensor>, deadline: Option<Instant>) -> Result<Pending, InferError> {
        self.signature().check_inputs(&inputs).map_err(InferError::InvalidInput)?;
        crate::threads::step_aside::note_request();
        let inline = self.cheap(&inputs);
        self.executor().submit(inputs, deadline, inline).map_err(|refusal| match refusal {
            Refusal::Shed(shed) => InferError::Overloaded { model: self.model.clone(), version: self.number, shed },
            Refusal::Expired => InferError::DeadlineExceeded { at: Expired::Arrival },
            Refusal::Stopped => InferError::Stopped,
        })
    }

    /// Whether a request is cheap enough to run inline on the caller's
    /// thread when an instance is free: its estimated run time (learnt from
    /// the version's runs, starting from its fastest warmup run, and scaled
    /// up for more rows than its runs average) is at most
    /// `[admission] inline_us`. Never with dynamic batching, whose window a
    /// request alone must wait out, nor for an engine that asks not to
    /// ([`crate::run::backend::Model::runs_inline`]).
    fn cheap(&self, inputs: &[Tensor]) -> bool {
        let limit = Duration::from_micros(self.spec.admission.inline_us.unwrap_or(crate::run::admission::INLINE_US));
        let rows = if self.signature().is_batched() { crate::run::batcher::rows_of(inputs) } else { 1 };
        !limit.is_zero() && !self.batches() && self.engine().runs_inline() && self.executor().estimate(rows) <= limit
    }

    /// Runs one inference on the calling thread, on whichever of the
    /// engine's instances is free, waiting for one if none is. For a
    /// lowered thread running comparison copies on a rollout's shadow
    /// candidate, whose instances serve no one else: it runs at that
    /// thread's priority, below serving. Returns the answer and the time
    /// the run took, as a session thread times its runs
    /// ([`crate::run::executor::timing`]): its wait for a CPU at that priority
    /// is not in it.
    pub fn run_here(&self, inputs: &[Tensor]) -> crate::run::executor::Timed {
        if let Err(e) = self.signature().check_inputs(inputs) {
            return (Err(InferError::InvalidInput(e)), None);
        }
        let watch = crate::run::executor::timing::Stopwatch::start();
        let answer = self.engine().infer(inputs).map_err(InferError::from);
        (answer, Some(watch.stop()))
    }

    /// Queues a comparison copy only when the version has an instance free
    /// and nobody waiting, and gives it that instance in the same step, so
    /// that it never holds up a request of its own; refused with
    /// [`InferError::Overloaded`] otherwise. It never runs on the caller's
    /// thread, however cheap.
    pub fn submit_spare(&self, inputs: Vec<Tensor>) -> Result<Pending, InferError> {
        self.signature().check_inputs(&inputs).map_err(InferError::InvalidInput)?;
        self.executor().submit_spare(inputs).map_err(|refusal| match refusal {
            Refusal::Shed(shed) => InferError::Overloaded { model: self.model.clone(), version: self.number, shed },
            Refusal::Expired => InferError::DeadlineExceeded { at: Expired::Arrival },
            Refusal::Stopped => InferError::Stopped,
        })
    }

    /// Runs one inference through the session threads and blocks the
    /// calling thread until it is answered. For synchronous callers (tools,
    /// tests); never call it from an async task, which awaits
    /// [`Version::submit`] instead.
    pub fn infer(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, InferError> {
        self.submit(inputs.to_vec(), None)?.wait()
    }

    /// [`Version::infer`], with the time of the engine's run ([`crate::run::executor::timing`]).
    pub fn infer_timed(&self, inputs: &[Tensor]) -> crate::run::executor::Timed {
        match self.submit(inputs.to_vec(), None) {
            Ok(pending) => pending.wait_timed(),
            Err(e) => (Err(e), None),
        }
    }
}

impl Drop for Version {
    fn drop(&mut self) {
        // The session threads share the engine and stop once they finish
        // what they run. The memory keeper waits for them to let go of it
        // before it frees the engine, so this thread (perhaps an async
        // worker) need not; without a keeper they are joined here.
        if let Some(executor) = self.executor.take() {
            executor.stop(self.releaser.is_none());
        }
        if let (Some(engine), Some(releaser)) = (self.engine.take(), self.releaser.take()) {
            let (files, heap) = (self.manifest.total_bytes(), self.heap.take());
            let freed = crate::run::release::Freeing { model: &self.model, version: self.number, twin: self.twin };
            releaser.release(freed, files, self.bytes_held, engine, heap);
        }
    }
}

impl std::fmt::Debug for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Version")
            .field("model", &self.model)
            .field("number", &self.number)
            .field("bytes_held", &self.bytes_held)
            .field("twin", &self.twin)
            .finish_non_exhaustive()
    }
}
