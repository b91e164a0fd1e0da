//! The worker's side, run by `baton worker`: takes the descriptors the
//! server left, loads the version it is handed, answers the server's
//! requests for the weights and its calls, and ends with the server.

use std::sync::Arc;
use std::time::Duration;

use baton_core::backend::{Backend, BackendError, Model, WeightRole};
use baton_core::manifest;
use baton_core::spec::ModelSpec;
use baton_core::verified::{HandedFile, Verified};

use crate::channel::Channel;
use crate::region::Region;
use crate::wire::{CGROUP_ENV, FDS_ENV, MEMORY_ENV, NICE_ENV, PARENT_ENV, Report, SPIN_ENV, Setup, WEIGHTS_REGION};

/// What makes the engine a worker loads with. Called once the version is
/// handed over, so that an engine that cannot start (a runtime library
/// missing) is reported as the load's failure, with its reason.
pub type MakeBackend = Box<dyn FnOnce() -> Result<Arc<dyn Backend>, BackendError>>;

/// The worker's side: run by `baton worker`. Takes the descriptors the
/// server left, loads the version it is handed with the engine `make`
/// makes, answers setup requests and calls until the server closes the
/// channels, then returns. Ends with the server, however the server ends.
pub fn serve(make: MakeBackend) -> Result<(), String> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|e| format!("asking to end with the server: {e}"))?;
    // The server may have ended before the request above: then this
    // process was handed to another parent already.
    let server = std::env::var(PARENT_ENV).ok().and_then(|pid| pid.parse::<i32>().ok());
    let parent = rustix::process::getppid().map(|pid| pid.as_raw_nonzero().get());
    if server.is_none() || parent != server {
        return Err("the server ended before its worker started".into());
    }
    limit_resources()?;
    let fds = std::env::var(FDS_ENV).map_err(|_| format!("{FDS_ENV} is not set: baton starts workers itself"))?;
    let mut channels = Vec::new();
    for fd in fds.split(',') {
        let fd = fd.parse().map_err(|_| format!("{FDS_ENV}: '{fd}' is not a descriptor"))?;
        // SAFETY: the server left these sockets open for this process alone.
        #[allow(unsafe_code)]
        channels.push(unsafe { Channel::inherited(fd) }.map_err(|e| format!("descriptor {fd}: {e}"))?);
    }
    if channels.len() < 3 {
        return Err(format!("{FDS_ENV} names no slot"));
    }
    let setup = channels.remove(0);
    answer_heartbeats(channels.remove(0))?;
    baton_core::executor::start_spawner();
    let Some(model) = receive_and_load(&setup, make)? else { return Ok(()) };
    let model: Arc<dyn Model> = Arc::from(model);
    let weights = Arc::clone(&model);
    std::thread::Builder::new()
        .name("baton-worker-setup".into())
        .spawn(move || answer_setup(&setup, weights.as_ref()))
        .map_err(|e| e.to_string())?;
    // The server's choice; a worker started by another means sleeps at once.
    let spin =
        std::env::var(SPIN_ENV).ok().and_then(|us| us.parse().ok()).map_or(Duration::ZERO, Duration::from_micros);
    crate::hop::answer(channels, spin, |instance, inputs, out| {
        model.run_borrowed(instance, inputs, out).map_err(|e| (e.kind.to_owned(), e.message))
    })
    .map_err(|e| format!("answering calls: {e}"))
}

/// Answers the server's heartbeats on the life channel, on a thread of
/// their own, from before the load on. The channel stays open until this
/// process ends, however it ends: the server reads its close.
fn answer_heartbeats(life: Channel) -> Result<(), String> {
    let answer = move || {
        let mut buffer = Vec::new();
        while let Ok(Some(_)) = life.recv(&mut buffer) {
            if buffer == crate::life::PING && life.send(crate::life::PONG, &[]).is_err() {
                break;
            }
        }
        // The server is going, or reading failed: the end stays open until
        // this process ends, so that its close still means the end.
        loop {
            std::thread::park();
        }
    };
    std::thread::Builder::new().name("baton-worker-life".into()).spawn(answer).map(drop).map_err(|e| e.to_string())
}

/// Applies the nice level and the memory limit the server passed, before
/// any thread starts: every thread the worker starts inherits them. The
/// memory limit is the memory cgroup the server made, which this process
/// joins (past its limit, the kernel kills the worker); or, where the
/// machine has none, a bound on the address space (`RLIMIT_AS`: an
/// allocation past it fails, and the engine's error or abort ends the load
/// or the worker).
fn limit_resources() -> Result<(), String> {
    if let Some(dir) = std::env::var_os(CGROUP_ENV) {
        let dir = std::path::PathBuf::from(dir);
        crate::cgroup::join(&dir).map_err(|e| format!("joining the memory cgroup {}: {e}", dir.display()))?;
    }
    let read = |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().map_err(|_| format!("{name}: '{v}'")));
    if let Some(nice) = read(NICE_ENV).transpose()? {
        let nice = i32::try_from(nice).map_err(|_| format!("{NICE_ENV}: {nice}"))?;
        rustix::process::setpriority_process(None, nice).map_err(|e| format!("setting nice {nice}: {e}"))?;
    }
    if let Some(bytes) = read(MEMORY_ENV).transpose()? {
        let limit = rustix::process::Rlimit { current: Some(bytes), maximum: Some(bytes) };
        rustix::process::setrlimit(rustix::process::Resource::As, limit)
            .map_err(|e| format!("limiting memory to {bytes} bytes: {e}"))?;
    }
    Ok(())
}

/// Receives the files and the load, loads on a lowered thread, and
/// reports; `None` when the server went away first.
fn receive_and_load(setup: &Channel, make: MakeBackend) -> Result<Option<Box<dyn Model>>, String> {
    let mut handed = Vec::new();
    let mut buffer = Vec::new();
    let (dir, manifest, engine) = loop {
        let Some(fds) = setup.recv(&mut buffer).map_err(|e| e.to_string())? else { return Ok(None) };
        match serde_json::from_slice::<Setup>(&buffer).map_err(|e| e.to_string())? {
            Setup::Files { files } => {
                if files.len() != fds.len() {
                    return Err(format!("{} files came with {} descriptors", files.len(), fds.len()));
                }
                handed.extend(files.into_iter().zip(fds).map(|(info, fd)| HandedFile {
                    path: info.path,
                    file: std::fs::File::from(fd),
                    sealed: info.sealed,
                    copied_into: info.copied_into,
                }));
            }
            Setup::Load { dir, manifest, engine } => break (dir, manifest, engine),
            other => return Err(format!("the server asked {other:?} before the load")),
        }
    };
    // The engine starts here, at the priority the worker started with,
    // so that the threads it keeps for serving run at that priority.
    let loaded = make().and_then(|backend| load_lowered(backend.as_ref(), dir, &manifest, &engine, handed));
    let (report, model) = match loaded {
        Ok(model) => {
            let info = model.weights();
            let report = Report::Loaded {
                signature: model.signature().clone(),
                instances: model.instances(),
                shared: info.shared,
                reused: info.reused,
                update: info.update,
            };
            (report, Some(model))
        }
        Err(e) => (Report::LoadFailed { kind: e.kind.to_owned(), message: e.message, tensor: e.tensor }, None),
    };
    setup.send(&serde_json::to_vec(&report).map_err(|e| e.to_string())?, &[]).map_err(|e| e.to_string())?;
    Ok(model)
}

/// Loads the version on a thread lowered below this worker's serving, as
/// the server loads its own versions.
fn load_lowered(
    backend: &dyn Backend,
    dir: std::path::PathBuf,
    manifest: &str,
    engine: &str,
    handed: Vec<HandedFile>,
) -> Result<Box<dyn Model>, BackendError> {
    std::thread::scope(|scope| {
        let load = scope.spawn(|| -> Result<Box<dyn Model>, BackendError> {
            let _ = baton_core::sys::lower_current_thread(19, true);
            let invalid = |e: String| BackendError::new("model_invalid", e);
            let manifest = manifest::parse(manifest).map_err(|e| invalid(e.to_string()))?;
            let version = Verified::handed_over(dir, manifest, handed).map_err(|e| invalid(e.to_string()))?;
            let spec = ModelSpec::parse(&format!("[engine]\n{engine}")).map_err(invalid)?;
            backend.load(&version, &spec)
        });
        load.join().unwrap_or_else(|_| Err(BackendError::new("worker_panicked", "the engine panicked while loading")))
    })
}

/// Answers the server's requests for the weights until it closes the channel.
fn answer_setup(setup: &Channel, model: &dyn Model) {
    let mut buffer = Vec::new();
    let mut region: Option<Region> = None;
    while let Ok(Some(_)) = setup.recv(&mut buffer) {
        if !matches!(serde_json::from_slice::<Setup>(&buffer), Ok(Setup::Weights)) {
            continue;
        }
        let mut stopped = false;
        let visited = model.visit_weights(&mut |weight| {
            let grown = region.as_ref().is_none_or(|r| r.len() < weight.data.len());
            if grown {
                region = Some(Region::named(WEIGHTS_REGION, weight.data.len()).map_err(|e| e.to_string())?);
            }
            let target = region.as_mut().expect("a region was just made");
            target.bytes_mut()[..weight.data.len()].copy_from_slice(weight.data);
            let report = Report::Weight {
                name: weight.name.to_owned(),
                datatype: weight.datatype,
                shape: weight.shape.to_vec(),
                compute: weight.role == WeightRole::Compute,
                len: weight.data.len(),
                region: grown,
            };
            let fds = if grown { vec![target.fd()] } else { Vec::new() };
            let bytes = serde_json::to_vec(&report).map_err(|e| e.to_string())?;
            setup.send(&bytes, &fds).map_err(|e| e.to_string())?;
            match setup.recv(&mut buffer) {
                Ok(Some(_)) if matches!(serde_json::from_slice::<Setup>(&buffer), Ok(Setup::Next)) => Ok(()),
                _ => {
                    stopped = true;
                    Err("the server stopped reading weights".to_owned())
                }
            }
        });
        // The server lets go of its side once the pass ends.
        region = None;
        if stopped {
            continue;
        }
        let report = match visited {
            Ok(()) => Report::WeightsEnd,
            Err(e) => Report::WeightsFailed { message: e.to_string() },
        };
        let Ok(bytes) = serde_json::to_vec(&report) else { return };
        if setup.send(&bytes, &[]).is_err() {
            return;
        }
    }
}
