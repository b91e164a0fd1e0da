//! [`OnnxBackend`]: loads `model.onnx` into a pool of ONNX Runtime sessions.

use std::borrow::Cow;
use std::ops::DerefMut;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use baton_core::backend::{Backend, BackendError, Model, Weight, WeightsError};
use baton_core::signature::{Signature, TensorSpec};
use baton_core::spec::ModelSpec;
use baton_core::tensor::Tensor;
use ort::session::builder::{AutoDevicePolicy, SessionBuilder};
use ort::session::{Session, SessionInputValue};
use ort::value::{Outlet, ValueType};

use crate::convert::{datatype_of, datatype_of_onnx, from_ort, to_ort};
use crate::model_file::{KeptFile, ModelFile, SessionSource};
use crate::options::EngineOptions;
use crate::pool::Pool;
use crate::runtime::{PoolThreads, runtime};

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

    /// Creates `sessions` ORT sessions of `dir/model.onnx` with the
    /// `[engine]` options of `spec`. Runs on the loader thread at low
    /// priority; worker threads, if any, are created at serving priority.
    fn load(&self, dir: &Path, spec: &ModelSpec) -> Result<Box<dyn Model>, BackendError> {
        Ok(Box::new(OnnxModel::load(dir, spec)?))
    }
}

impl OnnxModel {
    fn load(dir: &Path, spec: &ModelSpec) -> Result<OnnxModel, BackendError> {
        let options = EngineOptions::parse(&spec.engine)?;
        let path = dir.join(MODEL_FILE);
        if !path.is_file() {
            return Err(BackendError::new("model_invalid", format!("{} does not exist", path.display())));
        }
        // Staged under the temporary directory ($TMPDIR, else /tmp).
        let stage_in = options.stage_weights.then(std::env::temp_dir);
        let file = ModelFile::read(&path, stage_in.as_deref())?;
        let mut sessions = Vec::with_capacity(options.sessions);
        for _ in 0..options.sessions {
            let session =
                guarded(|| create_session(&file, &options), "model_invalid", "creating an ONNX Runtime session")?;
            sessions.push(session);
        }
        let signature = match sessions.first() {
            Some(first) => signature_of(first)?,
            None => return Err(BackendError::new("invalid_engine_options", "a pool needs at least one session")),
        };
        tracing::debug!(
            path = %path.display(),
            sessions = options.sessions,
            from_memory = matches!(file.source(), SessionSource::Bytes(_)),
            staged = file.is_staged(),
            intra_op_threads = options.intra_op_threads,
            inter_op_threads = options.inter_op_threads,
            optimization = options.optimization.as_str(),
            "ONNX model loaded"
        );
        Ok(OnnxModel { dir: dir.to_path_buf(), file: file.keep(), signature, sessions: Pool::new(sessions) })
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

fn create_session(file: &ModelFile, options: &EngineOptions) -> Result<Session, BackendError> {
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
        .map_err(setup)?;
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
    /// The version directory, where external data is read from.
    dir: PathBuf,
    /// The model file's bytes as the sessions were built from them, kept
    /// for validation.
    file: KeptFile,
    signature: Signature,
    sessions: Pool<Session>,
}

impl Model for OnnxModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn visit_weights(&self, visit: &mut dyn FnMut(&Weight<'_>) -> Result<(), String>) -> Result<(), WeightsError> {
        let path = self.file.path();
        let unreadable = |e: &dyn std::fmt::Display| WeightsError::Read(format!("{}: {e}", path.display()));
        let weights = self.file.take().map_err(|e| unreadable(&e))?;
        let model = crate::proto::parse(weights.bytes()).map_err(|e| unreadable(&e))?;
        let mut scratch = weights.scratch(&model);
        for init in &model.initializers {
            let datatype = datatype_of_onnx(init.data_type).filter(|d| d.size().is_some());
            let data: &[u8] = match datatype {
                Some(_) => crate::proto::initializer_bytes(init, weights.raw(), &self.dir, &mut scratch)
                    .map_err(|e| unreadable(&e))?,
                // STRING, bfloat16 and types baton has no datatype for.
                None => &[],
            };
            let weight = Weight { name: &init.name, datatype, shape: &init.dims, data };
            visit(&weight).map_err(WeightsError::Refused)?;
        }
        Ok(())
    }

    fn infer(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        // Converted before a session is taken, so a session is held only
        // for the run itself.
        let values = prepare(inputs)?;
        run(self.sessions.take(), values)
    }

    fn instances(&self) -> usize {
        self.sessions.len()
    }

    fn infer_on(&self, instance: usize, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let session = self.sessions.item(instance).ok_or_else(|| {
            BackendError::new(
                "invalid_input",
                format!("instance {instance} does not exist; the model has {} sessions", self.sessions.len()),
            )
        })?;
        let values = prepare(inputs)?;
        run(session, values)
    }
}

/// Named ORT input values.
type Inputs<'a> = Vec<(Cow<'a, str>, SessionInputValue<'static>)>;

/// Converts request tensors to ORT values.
fn prepare(inputs: &[Tensor]) -> Result<Inputs<'_>, BackendError> {
    // ORT would quietly take one of two same-named inputs.
    let mut names = inputs.iter().enumerate().map(|(i, t)| (i, t.name.as_str()));
    if let Some((_, dup)) = names.find(|&(i, name)| inputs[..i].iter().any(|u| u.name == name)) {
        return Err(BackendError::new("invalid_input", format!("input '{dup}' given more than once")));
    }
    guarded(
        || inputs.iter().map(|t| Ok((Cow::Borrowed(t.name.as_str()), SessionInputValue::from(to_ort(t)?)))).collect(),
        "invalid_input",
        "converting the inputs",
    )
}

/// Runs one inference on a session held for it. A panic in the run (in the
/// ORT binding or the conversion of its outputs) fails this request with
/// kind `engine_panicked` and leaves the session usable: no panic escapes
/// while its lock is held, so the lock is never poisoned.
fn run(mut session: impl DerefMut<Target = Session>, values: Inputs<'_>) -> Result<Vec<Tensor>, BackendError> {
    guarded(
        || {
            let outputs = session.run(values).map_err(|e| BackendError::new("inference_failed", e.to_string()))?;
            outputs.iter().map(|(name, value)| from_ort(name, &value)).collect()
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
        let spec = ModelSpec::parse("[engine]\nsessions = 3").unwrap();
        let model = std::sync::Arc::new(OnnxModel::load(dir.path(), &spec).unwrap());
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
}
