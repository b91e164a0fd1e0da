//! [`OnnxBackend`]: loads `model.onnx` into a pool of ONNX Runtime sessions.

use std::borrow::Cow;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};

use baton_core::files::spec::ModelSpec;
use baton_core::files::verified::Verified;
use baton_core::run::backend::{
    Backend, BackendError, InputRange, Model, UpdateKind, ValueRange, Weight, WeightsError, WeightsInfo,
};
use baton_core::tensors::signature::{Signature, TensorSpec};
use baton_core::tensors::tensor::{Tensor, TensorView};
use ort::session::builder::{AutoDevicePolicy, PrepackedWeights, SessionBuilder};
use ort::session::{Session, SessionInputValue};
use ort::value::{Outlet, ValueType};

use crate::convert::{datatype_of, datatype_of_onnx, from_ort, lend_ort, to_ort};
use crate::graph::Graph;
use crate::model_file::{KeptFile, ModelFile, SessionSource, Weights};
use crate::options::EngineOptions;
use crate::pool::Pool;
use crate::proto::ExternalFiles;
use crate::runtime::{PoolThreads, runtime};
use crate::shared::{Chain, OverMapping, SharedTensor, SharedWeights};

/// The model file a version directory must hold.
pub const MODEL_FILE: &str = "model.onnx";

/// The ONNX Runtime backend (`backend = "onnx"` in `model.toml`).
#[derive(Debug)]
pub struct OnnxBackend {
    _private: (),
}

impl OnnxBackend {
    /// Creates the backend, starting ONNX Runtime if this is the first use
    /// (see [`init`](crate::init), including which thread to call it from).
    pub fn new() -> Result<OnnxBackend, BackendError> {
        crate::init()?;
        prime()?;
        crate::staged::remove_stale(&std::env::temp_dir());
        Ok(OnnxBackend { _private: () })
    }
}

impl Backend for OnnxBackend {
    fn name(&self) -> &'static str {
        "onnx"
    }

    /// Creates `sessions` ORT sessions of the version's `model.onnx` with
    /// the `[engine]` options of `spec`, from the files the verify stage
    /// hashed. Runs on the loader thread at low priority; worker threads, if
    /// any, are created at serving priority.
    fn load(&self, version: &Verified, spec: &ModelSpec) -> Result<Box<dyn Model>, BackendError> {
        Ok(Box::new(OnnxModel::load(version, spec, Sharing::WithLive)?))
    }

    /// Every file but the graph and the warmup requests may be external
    /// data (a weights-only version's `weights.safetensors`, a model's data
    /// files), which is mapped where it is when it is one aligned file
    /// (`staged::InPlace`) and staged by copying from it otherwise.
    fn maps_as_is(&self, path: &str, _size: u64) -> bool {
        path != crate::MODEL_FILE && !path.starts_with("warmup/")
    }

    /// A load whose tensors and packed matrices are its own: none taken
    /// from a live version, none offered to later ones.
    fn load_alone(&self, version: &Verified, spec: &ModelSpec) -> Result<Box<dyn Model>, BackendError> {
        Ok(Box::new(OnnxModel::load(version, spec, Sharing::Alone)?))
    }
}

/// Whether a version shares weights with the model's other live versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// Identical tensors and packed matrices are held once for all.
    WithLive,
    /// Nothing is shared: the version holds every weight itself.
    Alone,
}

impl OnnxModel {
    fn load(version: &Verified, spec: &ModelSpec, sharing: Sharing) -> Result<OnnxModel, BackendError> {
        let options = EngineOptions::parse(&spec.engine)?;
        // Staged under the temporary directory ($TMPDIR, else /tmp).
        let file = ModelFile::read(version, &std::env::temp_dir(), options.stage_weights)?;
        let path = file.path().to_path_buf();
        let shared = share(&file, version, sharing)?;
        // One container of packed weights for the pool, and for later
        // versions with identical matrices: the sessions after the first
        // use what the first packed from the shared tensors.
        let chain = Chain::for_version(&shared, sharing);
        let mut sessions = Vec::with_capacity(options.sessions);
        for _ in 0..options.sessions {
            let session = guarded(
                || create_session(&file, &options, chain.container(), &shared),
                "model_invalid",
                "creating an ONNX Runtime session",
            )?;
            // The session reads the shared tensors' mappings: it holds them.
            sessions.push(OverMapping::new(session, shared.mappings()));
        }
        shared.release();
        // Whatever the sessions were built from has been read by now, be it
        // by baton or by ONNX Runtime: the files must still be the hashed ones.
        file.unchanged()?;
        let signature = match sessions.first() {
            Some(first) => signature_of(first)?,
            None => return Err(BackendError::new("invalid_engine_options", "a pool needs at least one session")),
        };
        // Loads run on a lowered thread, which logs through the registry's agent.
        let (shown, from_memory, staged, in_place) = (
            path.display().to_string(),
            matches!(file.source(), SessionSource::Bytes(_)),
            file.is_staged(),
            file.is_in_place(),
        );
        let (count, intra, inter) = (options.sessions, options.intra_op_threads, options.inter_op_threads);
        let optimization = options.optimization.as_str();
        baton_core::threads::agent::at_serving_priority(move || {
            tracing::debug!(
                path = %shown,
                sessions = count,
                from_memory,
                staged,
                in_place,
                intra_op_threads = intra,
                inter_op_threads = inter,
                optimization,
                "ONNX model loaded"
            );
        });
        if sharing == Sharing::WithLive {
            shared.publish();
        }
        Ok(OnnxModel {
            file: file.keep(),
            signature,
            sessions: Pool::new(sessions),
            chain,
            alone: sharing == Sharing::Alone,
            shared,
            ranges: OnceLock::new(),
        })
    }
}

/// Creates and runs one tiny generated model, so that ONNX Runtime's
/// one-time start-up allocations (kernel registries, allocators) happen now
/// and are not counted in the memory the first real version is measured to
/// hold.
fn prime() -> Result<(), BackendError> {
    use crate::mlp::{Mlp, OnnxOptions, encode_mlp};
    let (bytes, _) = encode_mlp(&Mlp::new(&[4, 8, 1], 0), &OnnxOptions::default());
    let env = &runtime()?.env;
    let failed = |e: String| BackendError::new("runtime_unusable", format!("priming ONNX Runtime: {e}"));
    let mut session = Session::builder(env)
        .map_err(|e| failed(e.to_string()))?
        .with_intra_threads(1)
        .map_err(|e| failed(e.to_string()))?
        .commit_from_memory(&bytes)
        .map_err(|e| failed(e.to_string()))?;
    let input = ort::value::Tensor::from_array((vec![1i64, 4], vec![0f32; 4])).map_err(|e| failed(e.to_string()))?;
    session.run(ort::inputs!["input" => input]).map_err(|e| failed(e.to_string()))?;
    Ok(())
}

/// The staged weights mapped once for every session; none when the model
/// was not staged (small models, `stage_weights = false`).
fn share(file: &ModelFile, version: &Verified, sharing: Sharing) -> Result<SharedWeights, BackendError> {
    let Some((data, len, placed)) = file.mapped() else {
        return Ok(SharedWeights::default());
    };
    SharedWeights::new(&crate::shared::model_dir(version.dir()), data, len, placed, sharing)
        .map_err(|e| BackendError::new("staging_failed", format!("{}: {e}", file.path().display())))
}

/// The session settings that let the engine's intra-op and inter-op
/// threads (and a thread waiting for them) sleep rather than busy-wait.
const INTRA_SPINNING: &str = "session.intra_op.allow_spinning";
const INTER_SPINNING: &str = "session.inter_op.allow_spinning";

/// The session setting that says where external data files are, for a
/// model given as bytes.
const EXTERNAL_FOLDER: &str = "session.model_external_initializers_file_folder_path";

fn create_session(
    file: &ModelFile,
    options: &EngineOptions,
    packed: &PrepackedWeights,
    shared: &SharedWeights,
) -> Result<Session, BackendError> {
    let env = &runtime()?.env;
    let setup = |e: ort::Error<SessionBuilder>| {
        BackendError::new("invalid_engine_options", format!("configuring the ONNX Runtime session: {e}"))
    };
    let mut builder = Session::builder(env)
        .map_err(|e| {
            BackendError::new("invalid_engine_options", format!("creating ONNX Runtime session options: {e}"))
        })?
        .with_auto_device(AutoDevicePolicy::PreferCPU)
        .map_err(setup)?
        .with_optimization_level(options.optimization.level())
        .map_err(setup)?
        .with_intra_threads(options.intra_op_threads)
        .map_err(setup)?
        .with_inter_threads(options.inter_op_threads)
        .map_err(setup)?
        .with_parallel_execution(options.inter_op_threads > 1)
        .map_err(setup)?
        .with_prepacked_weights(packed)
        .map_err(setup)?;
    if !options.prepack {
        builder = builder.with_prepacking(false).map_err(setup)?;
    }
    if !options.allow_spinning {
        for pool in [INTRA_SPINNING, INTER_SPINNING] {
            builder = builder.with_config_entry(pool, "0").map_err(setup)?;
        }
    }
    for (name, value) in shared.values() {
        builder = builder.with_initializer(name, value).map_err(setup)?;
    }
    if let Some(folder) = file.external_folder() {
        let folder = folder.to_string_lossy();
        builder = builder.with_config_entry(EXTERNAL_FOLDER, folder).map_err(setup)?;
    }
    if options.has_worker_threads() {
        // Created on this (low-priority loader) thread, the workers would
        // inherit its priority; PoolThreads has them spawned elsewhere.
        builder = builder.with_thread_manager(PoolThreads).map_err(setup)?;
    }
    match file.source() {
        SessionSource::Bytes(bytes) => builder.commit_from_memory(bytes),
        SessionSource::File(path) => builder.commit_from_file(path),
    }
    .map_err(|e| BackendError::new("model_invalid", format!("{}: {e}", file.path().display())))
}

/// The signature the session declares.
fn signature_of(session: &Session) -> Result<Signature, BackendError> {
    let spec = |kind: &str, outlet: &Outlet| -> Result<TensorSpec, BackendError> {
        let name = outlet.name();
        let unsupported = |what: String| {
            BackendError::new("unsupported_datatype", format!("{kind} '{name}' is {what}, which baton cannot serve"))
        };
        match outlet.dtype() {
            ValueType::Tensor { ty, shape, .. } => Ok(TensorSpec {
                name: name.to_owned(),
                datatype: datatype_of(*ty).ok_or_else(|| unsupported(format!("a tensor of {ty}")))?,
                shape: shape.iter().map(|&d| if d < 0 { -1 } else { d }).collect(),
            }),
            other => Err(unsupported(format!("a {other}"))),
        }
    };
    Ok(Signature {
        inputs: session.inputs().iter().map(|o| spec("input", o)).collect::<Result<_, _>>()?,
        outputs: session.outputs().iter().map(|o| spec("output", o)).collect::<Result<_, _>>()?,
    })
}

/// A loaded model: a pool of sessions, each serving one request at a time.
/// baton's serving path runs each session from a session thread of its own
/// ([`Model::infer_on`]); [`Model::infer`] lends whichever is free, first
/// come first served (see [`Pool`]), to callers that run inferences
/// themselves.
struct OnnxModel {
    /// The verified model and data files, and the model file's bytes as the
    /// sessions were built from them, kept for validation.
    file: KeptFile,
    signature: Signature,
    sessions: Pool<OverMapping<Session>>,
    /// The container of packed weights the sessions use. The sessions hold
    /// the container itself; this keeps the chain alive for as long as the
    /// version, so that the model's next version can join it.
    chain: Arc<Chain>,
    /// Loaded alone: its container is its own, shared with no version.
    alone: bool,
    /// The weights the sessions share. Each session holds the mappings it
    /// reads ([`OverMapping`]), so no order of drops can unmap them first.
    shared: SharedWeights,
    /// The integer inputs' ranges, read from the graph when the weights
    /// are visited, or when first asked for.
    ranges: OnceLock<Vec<InputRange>>,
}

impl OnnxModel {
    /// The model file, read and parsed (see [`KeptFile::take`]).
    fn read(&self) -> Result<(Weights, crate::proto::OnnxModel), String> {
        let path = self.file.files().name();
        let unreadable = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let weights = self.file.take().map_err(|e| unreadable(&e))?;
        let model = crate::proto::parse(weights.bytes()).map_err(|e| unreadable(&e))?;
        Ok((weights, model))
    }
}

impl Model for OnnxModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Visits the initializers, then the tensors of `Constant` nodes, each
    /// with its role in the graph.
    fn visit_weights(&self, visit: &mut dyn FnMut(&Weight<'_>) -> Result<(), String>) -> Result<(), WeightsError> {
        let (weights, model) = self.read().map_err(WeightsError::Read)?;
        let graph = Graph::new(&model);
        let _ = self.ranges.set(graph.input_ranges(&model));
        let files = self.file.files();
        let unreadable = |e: &dyn std::fmt::Display| WeightsError::Read(format!("{}: {e}", files.name().display()));
        let external = |location: &str| files.external(location);
        let mut scratch = weights.scratch(&model);
        let constants = model.nodes.iter().filter_map(|n| n.constant.as_ref());
        // Shared tensors are read where the sessions read them, in place.
        let shared: HashMap<&str, &SharedTensor> =
            self.shared.tensors().iter().map(|t| (t.name(), t.as_ref())).collect();
        for tensor in model.initializers.iter().chain(constants) {
            let datatype = datatype_of_onnx(tensor.data_type).filter(|d| d.size().is_some());
            let in_place = shared
                .get(tensor.name.as_str())
                .filter(|t| t.data_type() == tensor.data_type && t.dims() == tensor.dims.as_slice());
            let data: &[u8] = match (datatype, in_place) {
                (Some(_), Some(t)) => t.bytes(),
                (Some(_), None) => {
                    crate::proto::initializer_bytes(tensor, weights.raw(), ExternalFiles::Open(&external), &mut scratch)
                        .map_err(|e| unreadable(&e))?
                }
                // STRING, bfloat16 and types baton has no datatype for.
                (None, _) => &[],
            };
            let role = graph.role(&tensor.name);
            let weight = Weight { name: &tensor.name, datatype, shape: &tensor.dims, data, role };
            visit(&weight).map_err(WeightsError::Refused)?;
        }
        self.shared.release();
        // What was visited was read from the verified files; they must
        // still be as they were hashed.
        files.unchanged().map_err(|e| WeightsError::Read(e.to_string()))
    }

    fn input_ranges(&self) -> Vec<InputRange> {
        let ranges = self.ranges.get_or_init(|| match self.read() {
            Ok((_, model)) => Graph::new(&model).input_ranges(&model),
            Err(reason) => self
                .signature
                .inputs
                .iter()
                .map(|input| InputRange {
                    name: input.name.clone(),
                    range: ValueRange::Unknown(format!("the model's graph could not be read: {reason}")),
                })
                .collect(),
        });
        ranges.clone()
    }

    fn infer(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        // Converted before a session is taken, so a session is held only
        // for the run itself.
        let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
        let values = prepare(&views)?;
        run(&mut self.sessions.take(), values)
    }

    fn instances(&self) -> usize {
        self.sessions.len()
    }

    fn weights(&self) -> WeightsInfo {
        let update = if self.file.is_weights_only() { UpdateKind::Weights } else { UpdateKind::Graph };
        // Only a container versions share keeps what a gone version packed.
        let container = (self.shared.bytes() > 0 && !self.alone).then(|| self.chain.share());
        WeightsInfo { shared: self.shared.bytes(), reused: self.shared.reused(), update, reason: None, container }
    }

    fn infer_on(&self, instance: usize, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
        let values = prepare(&views)?;
        let mut session = self.instance(instance)?;
        run(&mut session, values)
    }

    /// Reads the inputs where they lie and lends the outputs from ONNX
    /// Runtime's own buffers: a worker copies neither.
    fn run_borrowed(
        &self,
        instance: Option<usize>,
        inputs: &[TensorView<'_>],
        out: &mut dyn FnMut(&TensorView<'_>),
    ) -> Result<(), BackendError> {
        let values = prepare(inputs)?;
        match instance {
            Some(instance) => {
                let mut session = self.instance(instance)?;
                run_lending(&mut session, values, out)
            }
            None => run_lending(&mut self.sessions.take(), values, out),
        }
    }
}

impl OnnxModel {
    /// The session of `instance`, held for a run.
    fn instance(&self, instance: usize) -> Result<std::sync::MutexGuard<'_, OverMapping<Session>>, BackendError> {
        self.sessions.item(instance).ok_or_else(|| {
            BackendError::new(
                "invalid_input",
                format!("instance {instance} does not exist; the model has {} sessions", self.sessions.len()),
            )
        })
    }
}

/// Named ORT input values.
type Inputs<'a> = Vec<(Cow<'a, str>, SessionInputValue<'static>)>;

/// Converts request tensors to ORT values.
fn prepare<'a>(inputs: &[TensorView<'a>]) -> Result<Inputs<'a>, BackendError> {
    // ORT would quietly take one of two same-named inputs.
    let mut names = inputs.iter().enumerate().map(|(i, t)| (i, t.name));
    if let Some((_, dup)) = names.find(|&(i, name)| inputs[..i].iter().any(|u| u.name == name)) {
        return Err(BackendError::new("invalid_input", format!("input '{dup}' given more than once")));
    }
    guarded(
        || inputs.iter().map(|t| Ok((Cow::Borrowed(t.name), SessionInputValue::from(to_ort(t)?)))).collect(),
        "invalid_input",
        "converting the inputs",
    )
}

/// Runs one inference on a session held for it. A panic in the run (in the
/// ORT binding or the conversion of its outputs) fails this request with
/// kind `engine_panicked` and leaves the session usable: no panic escapes
/// while its lock is held, so the lock is never poisoned.
fn run(session: &mut Session, values: Inputs<'_>) -> Result<Vec<Tensor>, BackendError> {
    guarded(
        || {
            let outputs = session.run(values).map_err(|e| BackendError::new("inference_failed", e.to_string()))?;
            outputs.iter().map(|(name, value)| from_ort(name, &value)).collect()
        },
        "engine_panicked",
        "running the model",
    )
}

/// [`run`], lending each output to `out` from ORT's buffer.
fn run_lending(
    session: &mut Session,
    values: Inputs<'_>,
    out: &mut dyn FnMut(&TensorView<'_>),
) -> Result<(), BackendError> {
    guarded(
        || {
            let outputs = session.run(values).map_err(|e| BackendError::new("inference_failed", e.to_string()))?;
            outputs.iter().try_for_each(|(name, value)| lend_ort(name, &value, out))
        },
        "engine_panicked",
        "running the model",
    )
}

/// Runs `f`, turning a panic in the ORT binding into an error of `kind`.
fn guarded<T>(f: impl FnOnce() -> Result<T, BackendError>, kind: &'static str, doing: &str) -> Result<T, BackendError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let detail = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned());
        Err(BackendError::new(kind, format!("internal error while {doing}: {detail}")))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use crate::mlp::{Mlp, OnnxOptions, encode_mlp};

    use super::*;

    #[test]
    fn a_request_never_waits_while_a_session_is_free() {
        if let Err(e) = crate::init() {
            panic!("ONNX Runtime is required for this test [{}]: {}", e.kind, e.message);
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(MODEL_FILE), encode_mlp(&Mlp::new(&[4, 2], 1), &OnnxOptions::default()).0)
            .unwrap();
        baton_core::files::manifest::write(dir.path()).unwrap();
        let version = baton_core::files::manifest::verify(dir.path()).unwrap();
        let spec = ModelSpec::parse("[engine]\nsessions = 3").unwrap();
        let model = std::sync::Arc::new(OnnxModel::load(&version, &spec, Sharing::WithLive).unwrap());
        // Two of the three sessions are busy for the whole test.
        let busy = (model.sessions.take(), model.sessions.take());
        let (done, finished) = mpsc::channel();
        let requester = std::sync::Arc::clone(&model);
        std::thread::spawn(move || {
            for _ in 0..10 {
                let out = requester.infer(&[Tensor::from_f32("input", vec![1, 4], &[0.5; 4])]);
                done.send(out.map(|o| o.len())).unwrap();
            }
        });
        for i in 0..10 {
            match finished.recv_timeout(Duration::from_secs(30)) {
                Ok(result) => assert_eq!(result.unwrap(), 1),
                Err(_) => panic!("request {i} waited for a busy session while session 2 was free"),
            }
        }
        drop(busy);
    }

    #[test]
    fn a_session_keeps_the_mapped_weights_it_reads_whatever_is_dropped_first() {
        if let Err(e) = crate::init() {
            panic!("ONNX Runtime is required for this test [{}]: {}", e.kind, e.message);
        }
        // External data is always staged and mapped: the shared path.
        let dir = tempfile::tempdir().unwrap();
        let mlp = Mlp::new(&[16, 64, 4], 3);
        let options = OnnxOptions { external_data: Some("weights.bin".into()), ..OnnxOptions::default() };
        let (bytes, data) = encode_mlp(&mlp, &options);
        std::fs::write(dir.path().join(MODEL_FILE), bytes).unwrap();
        std::fs::write(dir.path().join("weights.bin"), data.unwrap()).unwrap();
        baton_core::files::manifest::write(dir.path()).unwrap();
        let version = baton_core::files::manifest::verify(dir.path()).unwrap();
        let spec = ModelSpec::parse("[engine]\nsessions = 1\nprepack = false").unwrap();
        let model = OnnxModel::load(&version, &spec, Sharing::WithLive).unwrap();
        assert!(model.shared.bytes() > 0, "the weights are mapped and shared");
        let input = [Tensor::from_f32("input", vec![1, 16], &[0.25; 16])];
        let before = model.infer(&input).unwrap();
        // The shared weights go first, then everything else but the sessions.
        let OnnxModel { sessions, shared, file, chain, .. } = model;
        drop((shared, file, chain));
        let values = prepare(&[input[0].view()]).unwrap();
        let after = run(&mut sessions.take(), values).unwrap();
        assert_eq!(after[0].to_f32(), before[0].to_f32(), "the session still reads the weights it was given");
    }
}
