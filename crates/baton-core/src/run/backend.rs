//! The contract between baton's core and an inference engine.
//!
//! The core drives every stage of a load and decides what is checked; a
//! backend only turns files into something that runs, reports what the model
//! declares, and lets the core see its weights. That keeps the core free of
//! any engine, and lets a test run the whole load transaction on a fake one.

use thiserror::Error;

use crate::files::spec::ModelSpec;
use crate::files::verified::Verified;
use crate::tensors::signature::Signature;
use crate::tensors::tensor::{DataType, Tensor, TensorView};

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
    /// ([`VerifiedFile::unchanged`](crate::files::verified::VerifiedFile::unchanged))
    /// and refuses the load if one was (`file_changed`). An engine that must
    /// be given a path gets [`VerifiedFile::fd_path`](crate::files::verified::VerifiedFile::fd_path).
    fn load(&self, version: &Verified, spec: &ModelSpec) -> Result<Box<dyn Model>, BackendError>;

    /// Like [`Backend::load`], but the model shares no weights with other
    /// loaded versions, in either direction: it takes none of theirs, and
    /// later versions take none of its own. For a rollout's twin of the
    /// stable version, whose point is weights of its own. The default is a
    /// plain load, for a backend that shares nothing between versions.
    fn load_alone(&self, version: &Verified, spec: &ModelSpec) -> Result<Box<dyn Model>, BackendError> {
        self.load(version, spec)
    }

    /// Whether this backend maps the file at `path` of a version (of `size`
    /// bytes) as it is, rather than reading it: an engine that reads a
    /// weights file's tensors in place. The verify stage then copies such a
    /// file into a directory of baton's while it hashes it, and hands on the
    /// copy ([`crate::files::copied`]): one pass over the bytes, and a file that
    /// nobody else can truncate under a live version. None by default.
    fn maps_as_is(&self, _path: &str, _size: u64) -> bool {
        false
    }
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

    /// What the backend knows of the values each integer input may take,
    /// read from the model (see [`ValueRange`]); warmup generates integer
    /// inputs from it. An integer input left out counts as
    /// [`ValueRange::Unknown`]. The default knows nothing.
    fn input_ranges(&self) -> Vec<InputRange> {
        Vec::new()
    }

    /// Runs one inference on any free instance.
    fn infer(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError>;

    /// Whether a cheap request may run inline, on the thread that submits
    /// it (`[admission] inline_us`), rather than on a session thread. False
    /// for a model whose run does work its past runs cannot bound, such as
    /// tokenizing texts of any length, which must never hold an async
    /// worker. True by default.
    fn runs_inline(&self) -> bool {
        true
    }

    /// How many independent instances serve requests (sessions in a pool).
    fn instances(&self) -> usize {
        1
    }

    /// Runs one inference on a given instance, so warmup reaches each one.
    fn infer_on(&self, instance: usize, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let _ = instance;
        self.infer(inputs)
    }

    /// Runs one inference on borrowed inputs, on `instance` when one is
    /// named, and lends each output to `out` in turn: how a worker runs
    /// inputs that lie in shared memory and writes the outputs there. By
    /// default the inputs are copied into tensors and the outputs lent
    /// from the engine's answer; an engine that reads borrowed inputs and
    /// lends outputs from its own buffers overrides it, so that a worker
    /// adds no copy of its own.
    fn run_borrowed(
        &self,
        instance: Option<usize>,
        inputs: &[TensorView<'_>],
        out: &mut dyn FnMut(&TensorView<'_>),
    ) -> Result<(), BackendError> {
        let inputs: Vec<Tensor> = inputs.iter().map(TensorView::to_tensor).collect();
        let outputs = match instance {
            Some(instance) => self.infer_on(instance, &inputs)?,
            None => self.infer(&inputs)?,
        };
        outputs.iter().for_each(|output| out(&output.view()));
        Ok(())
    }

    /// What the version's weights cost and what kind of update it was, as
    /// far as the engine knows; the default knows nothing.
    fn weights(&self) -> WeightsInfo {
        WeightsInfo::default()
    }

    /// Whether the engine can still answer: false once a version that runs
    /// in a process of its own has lost that process. True by default.
    fn alive(&self) -> bool {
        true
    }

    /// Asks to be told, once and from another thread, when the engine ends
    /// by itself (a worker process killed, aborted, out of memory), with
    /// why. Not called when the version is dropped. By default the engine
    /// never ends by itself, and `notify` is dropped.
    fn on_exit(&self, notify: Box<dyn FnOnce(String) + Send>) {
        drop(notify);
    }

    /// The process the engine runs in, when it is not the server's.
    fn process(&self) -> Option<ProcessInfo> {
        None
    }
}

/// The worker process a version runs in, as status shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProcessInfo {
    /// Its process id.
    pub pid: u32,
    /// Its resident memory now, in bytes, when it could be read.
    pub rss: Option<u64>,
    /// When it started, in seconds since the Unix epoch.
    pub started_at: u64,
    /// The limit on its memory, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<MemoryLimit>,
}

/// The limit on a worker process's memory, and how it is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemoryLimit {
    /// The limit, in bytes.
    pub bytes: u64,
    /// What keeps it: `cgroup_v2` or `cgroup_v1` (resident memory, through
    /// a memory cgroup of the worker's own), or `address_space`
    /// (`RLIMIT_AS`, where the machine offers no memory cgroup).
    pub by: &'static str,
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
    /// What the tensor is for in the model, as the backend reads it from
    /// the graph; decides which checks apply to it.
    pub role: WeightRole,
}

/// What a weight tensor is for, which decides how validation treats its
/// values (`baton_core::files::spec::ValidationPolicy` says how).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightRole {
    /// A parameter the model computes with: a matrix multiplied, a
    /// convolution kernel, an embedding table, a recurrent cell's weights,
    /// a normalization's scale or bias, reached directly or through
    /// operations that only move or convert it (a transpose, a cast). A
    /// backend that cannot tell says this, the strictest.
    Compute,
    /// Any other constant: masks and fill values, scalars of element-wise
    /// arithmetic, shape and index constants, operands of additions.
    Constant,
}

/// The values an integer input may take, as far as the backend can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueRange {
    /// Any value is safe: the input is never used as an index or a shape
    /// (it is, say, converted to floating point, or only its shape is read).
    Any,
    /// Values in `[low, high)`: the input indexes a table of known size.
    Within {
        /// The smallest valid value.
        low: i64,
        /// One past the largest valid value.
        high: i64,
    },
    /// The input is used as an index or a shape whose valid values the
    /// backend cannot tell; says where.
    Unknown(String),
}

/// The value range of one input, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputRange {
    /// The input's name, as in the signature.
    pub name: String,
    /// What its values may be.
    pub range: ValueRange,
}

/// Which kind of update a version is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateKind {
    /// New weights for a graph the server already knows (a weights-only
    /// version).
    Weights,
    /// A whole model: graph and weights.
    #[default]
    Graph,
    /// A version that runs in a process of its own, because what it needs
    /// cannot change inside the server's process (another runtime library)
    /// or because the operator asked for one.
    Runtime,
    /// The graph and weights of the version before it, with other
    /// processing around them (a tokenizer, post-processing).
    Processing,
}

impl UpdateKind {
    /// `weights`, `graph`, `runtime` or `processing`.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateKind::Weights => "weights",
            UpdateKind::Graph => "graph",
            UpdateKind::Runtime => "runtime",
            UpdateKind::Processing => "processing",
        }
    }
}

/// Why a version is the kind of update it is: a stable code for metrics
/// and clients, and a sentence for people.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateReason {
    /// New tensors for a graph the engine already holds.
    WeightsOnly,
    /// A whole model, loaded in the server's process.
    NewGraph,
    /// Its `[engine] runtime` names a runtime library of its own, which
    /// only a process of its own can load beside the server's.
    RuntimeLibrary,
    /// Its `[engine] isolation = "process"` asks for a process of its own.
    OperatorChoice,
    /// Its graph and weights are those of the version loaded before it;
    /// only the processing files around them changed.
    ProcessingOnly,
}

impl UpdateReason {
    /// The stable code: `weights_only`, `new_graph`, `runtime_library`,
    /// `operator_choice` or `processing_only`.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateReason::WeightsOnly => "weights_only",
            UpdateReason::NewGraph => "new_graph",
            UpdateReason::RuntimeLibrary => "runtime_library",
            UpdateReason::OperatorChoice => "operator_choice",
            UpdateReason::ProcessingOnly => "processing_only",
        }
    }

    /// The kind of update the reason makes.
    pub fn kind(self) -> UpdateKind {
        match self {
            UpdateReason::WeightsOnly => UpdateKind::Weights,
            UpdateReason::NewGraph => UpdateKind::Graph,
            UpdateReason::RuntimeLibrary | UpdateReason::OperatorChoice => UpdateKind::Runtime,
            UpdateReason::ProcessingOnly => UpdateKind::Processing,
        }
    }

    /// The reason an engine's own kind of update has when nothing else
    /// decided it.
    pub fn of(kind: UpdateKind) -> UpdateReason {
        match kind {
            UpdateKind::Weights => UpdateReason::WeightsOnly,
            UpdateKind::Graph => UpdateReason::NewGraph,
            UpdateKind::Runtime => UpdateReason::OperatorChoice,
            UpdateKind::Processing => UpdateReason::ProcessingOnly,
        }
    }
}

/// A loaded version's weights as the engine holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightsInfo {
    /// Bytes of the weights every instance shares (one copy for all).
    pub shared: u64,
    /// Of those, bytes taken from another live version of the same model
    /// because the tensors are identical, and so not held again.
    pub reused: u64,
    /// Which kind of update the engine saw in the version's files; what
    /// the version is, once a reason overrides it, is [`WeightsInfo::kind`].
    pub update: UpdateKind,
    /// Why, when something other than the engine decided it (a worker
    /// process); else the engine's kind's own reason ([`UpdateReason::of`]).
    pub reason: Option<UpdateReason>,
    /// The container of packed weights the version shares with other
    /// versions of its model, if any.
    pub container: Option<SharedContainer>,
}

impl WeightsInfo {
    /// Why the version is the kind of update it is.
    pub fn why(&self) -> UpdateReason {
        self.reason.unwrap_or(UpdateReason::of(self.update))
    }

    /// Which kind of update the version is: the one its reason makes.
    pub fn kind(&self) -> UpdateKind {
        self.why().kind()
    }
}

/// A container of packed weights that successive versions of a model
/// share. It keeps the packed matrices of every version that joined it,
/// the gone ones' included, until the last version using it goes; what
/// it holds beyond the live versions' own additions is memory no live
/// version's measurement counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedContainer {
    /// Which container: the same for every version sharing it.
    pub id: u64,
    /// What it holds in all, estimated as the bytes of the tensors each
    /// version added when it joined.
    pub holds: u64,
}

/// An engine failure while loading or running a model.
#[derive(Debug, Error)]
#[error("{message}")]
pub struct BackendError {
    /// Stable kind string, e.g. `model_invalid`, `runtime_missing`.
    pub kind: &'static str,
    /// What happened, for people.
    pub message: String,
    /// The tensor the engine refused while loading, when the version's
    /// weights disagree with its graph: the load transaction reports such a
    /// refusal as a failure of the validate stage, which it is.
    pub tensor: Option<String>,
}

impl BackendError {
    /// A new error.
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        BackendError { kind, message: message.into(), tensor: None }
    }

    /// A tensor of the version refused while loading (see [`BackendError::tensor`]).
    pub fn refused_tensor(kind: &'static str, tensor: impl Into<String>, message: impl Into<String>) -> Self {
        BackendError { kind, message: message.into(), tensor: Some(tensor.into()) }
    }
}

impl From<crate::files::manifest::VerifyError> for BackendError {
    /// A verified file that could not be read, or changed after it was
    /// verified; the kind is the verify error's (`file_changed`, `io`).
    fn from(error: crate::files::manifest::VerifyError) -> Self {
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
