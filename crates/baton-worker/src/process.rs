//! A version in a worker process. [`ProcessBackend`] wraps an engine's
//! backend: a model whose `[engine]` table says `isolation = "process"`
//! is loaded by a child process (`baton worker`), any other in this
//! process as before. The server hands the child the version's verified
//! files by descriptor, so the child maps the very bytes the server
//! verified; the child loads them with the same engine, reports the
//! signature, streams the weights for validation on request, and answers
//! calls over the hop ([`crate::hop`]). The child's exit is the unload.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, mpsc};
use std::time::Duration;

use baton_core::files::manifest;
use baton_core::files::spec::ModelSpec;
use baton_core::files::verified::Verified;
use baton_core::run::backend::{Backend, BackendError, Model, ProcessInfo, Weight, WeightsError, WeightsInfo};
use baton_core::tensors::signature::Signature;
use baton_core::tensors::tensor::Tensor;

use crate::cgroup::Group;
use crate::channel::{Channel, MAX_FDS, hand_to_child};
use crate::hop::{Caller, HopError};
use crate::life::{Heartbeat, Memory, Worker};
use crate::options::{self, RUNTIME, TIMEOUT, WorkerOptions};
use crate::region::{PeerRegion, Region};
use crate::weights::{self, Broke, Pass, SetupChannel};
use crate::wire::{
    CGROUP_ENV, FDS_ENV, FileInfo, MANIFEST_REGION, MEMORY_ENV, NICE_ENV, PARENT_ENV, REGION_ENV, REPORT_MOST, Report,
    SPIN_ENV, Setup,
};

/// How long a worker may take to load a version.
const LOAD_LIMIT: Duration = Duration::from_secs(600);

/// The most engine instances a worker may report.
const MOST_INSTANCES: usize = 1024;

/// An engine's backend whose models run in worker processes when their
/// `[engine]` table asks for it.
pub struct ProcessBackend {
    inner: Arc<dyn Backend>,
    program: PathBuf,
    args: Vec<String>,
    runtime_env: Option<&'static str>,
}

impl ProcessBackend {
    /// Wraps `inner`; a worker is `program` run with `args` (for baton,
    /// its own executable and `worker`).
    pub fn new(inner: Arc<dyn Backend>, program: PathBuf, args: Vec<String>) -> ProcessBackend {
        ProcessBackend { inner, program, args, runtime_env: None }
    }

    /// Names the environment variable through which a worker is given the
    /// runtime library a version's `[engine] runtime` names (for ONNX
    /// Runtime, `ORT_DYLIB_PATH`).
    pub fn with_runtime_env(mut self, name: &'static str) -> ProcessBackend {
        self.runtime_env = Some(name);
        self
    }

    fn start(
        &self,
        version: &Verified,
        spec: &ModelSpec,
        options: WorkerOptions,
    ) -> Result<Box<dyn Model>, BackendError> {
        let failed = |what: &str, e: std::io::Error| BackendError::new("worker_failed", format!("{what}: {e}"));
        let sessions = spec.engine.get("sessions").and_then(toml::Value::as_integer).unwrap_or(4);
        let slots = usize::try_from(sessions).unwrap_or(1).clamp(1, 8) * 2;
        let (setup, their_setup) = Channel::pair().map_err(|e| failed("opening the worker's channel", e))?;
        let (life, their_life) = Channel::pair().map_err(|e| failed("opening the worker's channel", e))?;
        let (ours, theirs): (Vec<_>, Vec<_>) = (0..slots)
            .map(|_| Channel::pair())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| failed("opening the worker's slots", e))?
            .into_iter()
            .unzip();
        // The worker's ends go with the command, which is dropped once the
        // worker is started: then only the worker holds them.
        let ends: Vec<OwnedFd> = [their_setup, their_life].into_iter().chain(theirs).map(OwnedFd::from).collect();
        let (child, memory) = self.spawn(ends, &options)?;
        let heartbeat = options.heartbeat.map(|every| Heartbeat { every, within: options.call_limit });
        let mut worker = Worker::new(child, life, heartbeat, memory).map_err(|e| failed("watching the worker", e))?;
        let loaded = hand_over(&setup, version, spec).and_then(|()| await_loaded(&setup, &mut worker));
        let (signature, instances, mut info) = loaded?;
        // Whatever the files are, a version in a process of its own is a
        // runtime update (its reason makes it one): it shares nothing with
        // the server's versions.
        info.reason = options.reason;
        Ok(Box::new(WorkerModel {
            call_limit: options.call_limit,
            instances,
            info,
            caller: Caller::new(ours, options.spin)
                .with_region_limit(options.region)
                .with_tensor_limit(signature.outputs.len()),
            signature,
            setup: Mutex::new(SetupChannel::new(setup)),
            weights: weights::Bounds::of(version.files().iter().map(|f| f.size()).fold(0, u64::saturating_add)),
            worker,
        }))
    }

    /// Starts the worker through the starter thread, handing it `ends` at
    /// fixed descriptors, with its memory limit: a memory cgroup of its own
    /// where the machine offers one, else a bound on its address space.
    fn spawn(&self, ends: Vec<OwnedFd>, options: &WorkerOptions) -> Result<(Child, Memory), BackendError> {
        let mut command = Command::new(&self.program);
        let fds = hand_to_child(&mut command, ends)
            .map_err(|e| BackendError::new("worker_failed", format!("handing the worker its channels: {e}")))?;
        let fds: Vec<String> = fds.iter().map(ToString::to_string).collect();
        // A worker never speaks for the service to a service manager (or
        // `baton init`): it is not given the server's notification socket.
        command.env_remove("NOTIFY_SOCKET");
        if let Some(nice) = options.nice {
            command.env(NICE_ENV, nice.to_string());
        }
        let memory = match options.memory.map(|bytes| (bytes, Group::make(bytes))) {
            None => Memory::Unlimited,
            Some((_, Ok(group))) => {
                command.env(CGROUP_ENV, group.dir());
                Memory::Group(group)
            }
            Some((bytes, Err(why))) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::warn!(
                        %why,
                        "No memory cgroup can be made for workers; their memory limits bound their address space instead."
                    );
                });
                command.env(MEMORY_ENV, bytes.to_string());
                Memory::AddressSpace { bytes }
            }
        };
        if let Some(runtime) = &options.runtime {
            let Some(name) = self.runtime_env else {
                return Err(BackendError::new(
                    "invalid_engine_options",
                    format!("[engine] {RUNTIME}: the {} engine cannot be given another runtime", self.inner.name()),
                ));
            };
            command.env(name, runtime);
        }
        command.env(SPIN_ENV, options.spin.as_micros().to_string()).env(REGION_ENV, options.region.to_string());
        command.args(&self.args).env(FDS_ENV, fds.join(",")).env(PARENT_ENV, std::process::id().to_string());
        command.stdin(Stdio::null());
        let child = start_process(command).map_err(|e| {
            BackendError::new("worker_failed", format!("starting the worker {}: {e}", self.program.display()))
        })?;
        Ok((child, memory))
    }
}

type Start = (Command, mpsc::SyncSender<std::io::Result<Child>>);

/// The thread that starts every worker process, for as long as the server
/// runs. A child inherits the priority of the thread that starts it, so
/// this one runs at serving priority (a load's thread is lowered). And a
/// worker asks to be killed when the thread that started it ends, which
/// must be when the server ends, not when some short-lived thread does.
static STARTER: OnceLock<Mutex<Option<mpsc::Sender<Start>>>> = OnceLock::new();

fn start_process(command: Command) -> std::io::Result<Child> {
    let starter = STARTER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Start>();
        let started = baton_core::run::executor::spawn_at_serving_priority(move || {
            for (mut command, reply) in rx {
                let child = command.spawn();
                // The command holds the worker's ends: closed here first.
                drop(command);
                let _ = reply.send(child);
            }
        });
        Mutex::new(started.ok().map(|_| tx))
    });
    let (reply, answer) = mpsc::sync_channel(1);
    let sender = starter.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let sender = sender.ok_or_else(|| std::io::Error::other("the thread that starts workers could not be started"))?;
    sender.send((command, reply)).map_err(|_| std::io::Error::other("the thread that starts workers stopped"))?;
    answer.recv().map_err(|_| std::io::Error::other("the thread that starts workers stopped"))?
}

/// Sends the version's files and the load.
fn hand_over(setup: &Channel, version: &Verified, spec: &ModelSpec) -> Result<(), BackendError> {
    let broken = |e: std::io::Error| BackendError::new("worker_failed", format!("handing the version over: {e}"));
    for files in version.files().chunks(MAX_FDS) {
        let infos: Vec<FileInfo> = files
            .iter()
            .map(|f| FileInfo {
                path: f.path().to_owned(),
                sealed: f.sealed(),
                copied_into: f.copied_into().map(PathBuf::from),
            })
            .collect();
        let message =
            serde_json::to_vec(&Setup::Files { files: infos }).map_err(std::io::Error::other).map_err(broken)?;
        let fds: Vec<_> = files.iter().map(|f| f.file().as_fd()).collect();
        setup.send(&message, &fds).map_err(broken)?;
    }
    let engine = toml::to_string(&options::engine_spec(spec).engine).map_err(std::io::Error::other).map_err(broken)?;
    let text = manifest::render(version.manifest());
    let mut region = Region::named(MANIFEST_REGION, text.len()).map_err(broken)?;
    region.bytes_mut()[..text.len()].copy_from_slice(text.as_bytes());
    let load = Setup::Load { dir: version.dir().to_owned(), manifest: text.len(), engine };
    let message = serde_json::to_vec(&load).map_err(std::io::Error::other).map_err(broken)?;
    setup.send(&message, &[region.fd()]).map_err(broken)
}

/// Waits for the worker's report of its load.
fn await_loaded(setup: &Channel, worker: &mut Worker) -> Result<(Signature, usize, WeightsInfo), BackendError> {
    let gone = |worker: &mut Worker, why: String| {
        let status = worker.stop();
        BackendError::new("worker_failed", format!("the worker exited before it loaded the version ({status}): {why}"))
    };
    // A report baton does not take: the worker is stopped.
    let refused = |worker: &mut Worker, why: String| {
        worker.stop();
        BackendError::new("worker_failed", format!("the worker's report of its load was refused: {why}"))
    };
    match setup.readable_within(LOAD_LIMIT) {
        Ok(true) => {}
        Ok(false) => {
            worker.stop();
            return Err(BackendError::new("worker_failed", format!("the worker did not load within {LOAD_LIMIT:?}")));
        }
        Err(e) => return Err(gone(worker, e.to_string())),
    }
    let mut buffer = Vec::new();
    let fds = match setup.recv(&mut buffer) {
        Ok(Some(fds)) => fds,
        Ok(None) => return Err(gone(worker, "it closed its channel".into())),
        Err(e) => return Err(gone(worker, e.to_string())),
    };
    // A report too large for a message (a signature of many thousands of
    // inputs or outputs) comes in a region.
    if let Ok(Report::InRegion { len }) = serde_json::from_slice::<Report>(&buffer) {
        match report_in_region(fds, len) {
            Ok(bytes) => buffer = bytes,
            Err(why) => return Err(refused(worker, why)),
        }
    }
    match serde_json::from_slice::<Report>(&buffer) {
        // Warmup runs a call on each instance: a number past any engine's
        // is no number to act on.
        Ok(Report::Loaded { instances, .. }) if !(1..=MOST_INSTANCES).contains(&instances) => {
            Err(refused(worker, format!("it reported {instances} engine instances (1 to {MOST_INSTANCES} are taken)")))
        }
        Ok(Report::Loaded { signature, instances, shared, reused, update }) => {
            Ok((signature, instances, WeightsInfo { shared, reused, update, reason: None, container: None }))
        }
        Ok(Report::LoadFailed { kind, message, tensor }) => {
            worker.stop();
            let kind = known_kind(&kind);
            Err(match tensor {
                Some(tensor) => BackendError::refused_tensor(kind, tensor, message),
                None => BackendError::new(kind, message),
            })
        }
        Ok(other) => Err(refused(worker, format!("it reported {other:?} before loading"))),
        Err(e) => Err(refused(worker, format!("it sent a report baton does not read: {e}"))),
    }
}

/// The `len` bytes of a report in the region attached to it.
fn report_in_region(fds: Vec<OwnedFd>, len: usize) -> Result<Vec<u8>, String> {
    let fd = fds.into_iter().next().ok_or("a report in a region came without it")?;
    let region = PeerRegion::open(fd, REPORT_MOST).map_err(|e| format!("the report's region: {e}"))?;
    region.read(0, len).ok_or_else(|| format!("a report of {len} bytes outside its region"))
}

/// The engine's kind strings a worker may report, as the static strings
/// errors carry; any other reads `worker_failed`.
fn known_kind(kind: &str) -> &'static str {
    const KINDS: [&str; 14] = [
        "model_invalid",
        "weights_invalid",
        "invalid_input",
        "inference_failed",
        "unsupported_datatype",
        "staging_failed",
        "invalid_engine_options",
        "runtime_unusable",
        "runtime_missing",
        "file_changed",
        "io",
        "engine_panicked",
        crate::hop::REGION_EXCEEDED,
        crate::hop::HOP_FAILED,
    ];
    KINDS.into_iter().find(|k| *k == kind).unwrap_or("worker_failed")
}

/// A version running in a worker.
struct WorkerModel {
    call_limit: Duration,
    signature: Signature,
    instances: usize,
    info: WeightsInfo,
    caller: Caller,
    /// The setup channel, and what a pass over the weights holds.
    setup: Mutex<SetupChannel>,
    /// What a pass over the weights may hold, from the version's files.
    weights: weights::Bounds,
    worker: Worker,
}

impl Drop for WorkerModel {
    fn drop(&mut self) {
        // Closing every channel tells the worker to exit.
        let slots = std::mem::replace(&mut self.caller, Caller::new(Vec::new(), Duration::ZERO));
        drop(slots);
        self.setup.lock().unwrap_or_else(PoisonError::into_inner).channel.shutdown();
        self.worker.stop();
    }
}

impl WorkerModel {
    /// One call across the hop, on `instance` of the worker's engine when
    /// named, with the hop's failures as the engine's errors.
    fn call(&self, instance: Option<usize>, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        self.caller.call_on(instance, inputs, self.call_limit).map_err(|e| {
            match &e {
                // A worker that does not answer within the bound is hung:
                // killed, it is replaced as one that ended by itself.
                HopError::TimedOut(limit) => {
                    self.worker.kill(format!("a call did not answer within {limit:?} ({TIMEOUT})"));
                }
                // A worker whose slot broke the protocol cannot be trusted
                // with another call on any slot: replaced the same way.
                HopError::Broken(why) => self.worker.kill(format!("its hop broke: {why}")),
                // The worker counts as gone: no call reaches it again. One
                // whose process still runs (a slot of it read as closed, or
                // it shut its slots down and waits on a run) is ended, so
                // that it is replaced rather than refuse calls for good.
                HopError::Gone(why) => self.worker.end_if_running(format!("it can no longer be called: {why}")),
                _ => {}
            }
            let kind = match &e {
                HopError::Failed { kind, .. } => known_kind(kind),
                HopError::Gone(_) => "worker_gone",
                HopError::TimedOut(_) => "worker_timed_out",
                HopError::Busy(_) => "worker_busy",
                HopError::TooLarge { .. } => crate::hop::REGION_EXCEEDED,
                HopError::System(_) => crate::hop::HOP_FAILED,
                HopError::Broken(_) => "worker_hop_broken",
            };
            let pid = self.worker.pid();
            BackendError::new(kind, format!("worker {pid}: {e}"))
        })
    }
}

impl Model for WorkerModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn visit_weights(&self, visit: &mut dyn FnMut(&Weight<'_>) -> Result<(), String>) -> Result<(), WeightsError> {
        let mut setup = self.setup.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(why) = &setup.broken {
            return Err(WeightsError::Read(format!("the worker's setup channel broke earlier: {why}")));
        }
        let pass = Pass { within: self.call_limit, bounds: self.weights, setup: &mut setup };
        let passed = pass.run(visit);
        // The region and the copy are as large as the largest tensor: let
        // go once the pass ends, on both sides, so that they cost nothing
        // after.
        (setup.region, setup.weight) = (None, Vec::new());
        if let Err(Broke(why)) = &passed {
            // What the worker sends next is no longer known: it is ended,
            // and replaced as one that ended by itself.
            setup.broken = Some(why.clone());
            self.worker.kill(format!("its weights stopped midway: {why}"));
        }
        passed.map_err(|Broke(why)| WeightsError::Read(why)).and_then(|refused| refused)
    }

    fn infer(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        self.call(None, inputs)
    }

    fn infer_on(&self, instance: usize, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        self.call(Some(instance), inputs)
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn weights(&self) -> WeightsInfo {
        self.info
    }

    fn alive(&self) -> bool {
        self.worker.alive() && self.caller.gone().is_none()
    }

    fn on_exit(&self, notify: Box<dyn FnOnce(String) + Send>) {
        self.worker.on_exit(notify);
    }

    fn process(&self) -> Option<ProcessInfo> {
        Some(self.worker.info())
    }
}

impl Backend for ProcessBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn load(&self, version: &Verified, spec: &ModelSpec) -> Result<Box<dyn Model>, BackendError> {
        match WorkerOptions::read(spec)? {
            options if options.in_worker => self.start(version, spec, options),
            _ => self.inner.load(version, &options::engine_spec(spec)),
        }
    }

    fn load_alone(&self, version: &Verified, spec: &ModelSpec) -> Result<Box<dyn Model>, BackendError> {
        // A worker shares no weights with any other process's versions.
        match WorkerOptions::read(spec)? {
            options if options.in_worker => self.start(version, spec, options),
            _ => self.inner.load_alone(version, &options::engine_spec(spec)),
        }
    }

    fn maps_as_is(&self, path: &str, size: u64) -> bool {
        self.inner.maps_as_is(path, size)
    }
}
