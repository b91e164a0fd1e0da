//! The worker's side, run by `baton worker`: takes the descriptors the
//! server left, loads the version it is handed, answers the server's
//! requests for the weights and its calls, and ends with the server.

use std::sync::Arc;
use std::time::Duration;

use baton_core::files::manifest;
use baton_core::files::spec::ModelSpec;
use baton_core::files::verified::{HandedFile, Verified};
use baton_core::run::backend::{Backend, BackendError, Model, WeightRole};

use crate::channel::{Channel, MAX_MESSAGE, take_handed};
use crate::hop::{Answering, REGION_DEFAULT, page_floor};
use crate::region::{PeerRegion, Region};
use crate::wire::{
    CGROUP_ENV, FDS_ENV, MANIFEST_MOST, MEMORY_ENV, NICE_ENV, PARENT_ENV, REGION_ENV, REPORT_MOST, REPORT_REGION,
    Report, SPIN_ENV, Setup, WEIGHTS_REGION,
};

/// The most slots a server opens to one worker.
const MOST_SLOTS: usize = 16;

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
    let mut channels = handed_channels()?;
    let how = answering()?;
    let setup = channels.remove(0);
    answer_heartbeats(channels.remove(0))?;
    baton_core::run::executor::start_spawner();
    let Some(model) = receive_and_load(&setup, make)? else { return Ok(()) };
    let model: Arc<dyn Model> = Arc::from(model);
    let weights = Arc::clone(&model);
    std::thread::Builder::new()
        .name("baton-worker-setup".into())
        .spawn(move || answer_setup(&setup, weights.as_ref()))
        .map_err(|e| e.to_string())?;
    // A slot that fails ends the worker (an error here ends the process),
    // and the server replaces it.
    crate::hop::answer(channels, how, |instance, inputs, out| {
        model.run_borrowed(instance, inputs, out).map_err(|e| (e.kind.to_owned(), e.message))
    })
    .map_err(|e| format!("answering calls: {e}"))
}

/// The channels the server handed this process, at the descriptors
/// [`FDS_ENV`] names: the setup channel's, the life channel's, then one to
/// [`MOST_SLOTS`] slots'. Every number is checked before it is taken.
fn handed_channels() -> Result<Vec<Channel>, String> {
    let fds = std::env::var(FDS_ENV).map_err(|_| format!("{FDS_ENV} is not set: baton starts workers itself"))?;
    let numbers = fds
        .split(',')
        .map(|fd| fd.parse::<i32>().map_err(|_| format!("{FDS_ENV}: '{fd}' is not a descriptor")))
        .collect::<Result<Vec<_>, _>>()?;
    if !(3..=2 + MOST_SLOTS).contains(&numbers.len()) {
        return Err(format!("{FDS_ENV} names {} descriptors: 2 channels and 1 to {MOST_SLOTS} slots", numbers.len()));
    }
    take_handed(&numbers).map_err(|e| format!("{FDS_ENV}: {e}"))
}

/// A number from the environment variable `name`, when it is set; an error
/// when it is not a number within `range`.
fn env_number(name: &str, range: std::ops::RangeInclusive<u64>) -> Result<Option<u64>, String> {
    let Ok(text) = std::env::var(name) else { return Ok(None) };
    let number = text.parse::<u64>().ok().filter(|n| range.contains(n));
    number
        .map(Some)
        .ok_or_else(|| format!("{name} = '{text}': give a number from {} to {}", range.start(), range.end()))
}

/// How the slots answer, as the server said: how long they look for the
/// next call, how large a region may be.
fn answering() -> Result<Answering, String> {
    // The server always says; a worker started by other means sleeps at once.
    let spin = env_number(SPIN_ENV, 0..=10_000)?.map_or(Duration::ZERO, Duration::from_micros);
    let most = env_number(REGION_ENV, 1 << 20..=4095 << 20)?.map_or(REGION_DEFAULT, |bytes| page_floor(bytes as usize));
    Ok(Answering { spin, most })
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
    if let Some(nice) = env_number(NICE_ENV, 0..=19)? {
        let nice = nice as i32;
        rustix::process::setpriority_process(None, nice).map_err(|e| format!("setting nice {nice}: {e}"))?;
    }
    if let Some(bytes) = env_number(MEMORY_ENV, 1..=u64::MAX)? {
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
            Setup::Load { dir, manifest, engine } => {
                let manifest = read_manifest(fds, manifest)?;
                break (dir, manifest, engine);
            }
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
        Err(e) => {
            let message = crate::hop::bounded(&e.message);
            (Report::LoadFailed { kind: e.kind.to_owned(), message, tensor: e.tensor }, None)
        }
    };
    send_report(setup, &report)?;
    Ok(model)
}

/// Sends `report` (a load's) on the setup channel: in the message when it
/// fits, else in a region of its own; a report past even that is sent as
/// the load's failure, saying why.
fn send_report(setup: &Channel, report: &Report) -> Result<(), String> {
    let bytes = serde_json::to_vec(report).map_err(|e| e.to_string())?;
    if bytes.len() <= MAX_MESSAGE {
        return setup.send(&bytes, &[]).map_err(|e| e.to_string());
    }
    if bytes.len() > REPORT_MOST {
        let message = format!(
            "the version's signature takes {} bytes as a worker reports it, more than the {} MiB a worker may \
             report: too many inputs or outputs, or names too long",
            bytes.len(),
            REPORT_MOST >> 20
        );
        let failed = Report::LoadFailed { kind: "model_invalid".into(), message, tensor: None };
        return setup.send(&serde_json::to_vec(&failed).map_err(|e| e.to_string())?, &[]).map_err(|e| e.to_string());
    }
    let mut region = Region::named(REPORT_REGION, bytes.len()).map_err(|e| format!("a region for the report: {e}"))?;
    region.bytes_mut()[..bytes.len()].copy_from_slice(&bytes);
    let pointer = serde_json::to_vec(&Report::InRegion { len: bytes.len() }).map_err(|e| e.to_string())?;
    setup.send(&pointer, &[region.fd()]).map_err(|e| e.to_string())
}

/// The manifest of `len` bytes in the region attached to the load.
fn read_manifest(fds: Vec<std::os::fd::OwnedFd>, len: usize) -> Result<String, String> {
    let fd = fds.into_iter().next().ok_or("the load came without its manifest")?;
    let region = PeerRegion::open(fd, MANIFEST_MOST).map_err(|e| format!("the manifest's region: {e}"))?;
    let bytes = region.read(0, len).ok_or_else(|| format!("a manifest of {len} bytes outside its region"))?;
    String::from_utf8(bytes).map_err(|_| "the manifest is not UTF-8".to_owned())
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
            let _ = baton_core::threads::sys::lower_current_thread(19, true);
            let invalid = |e: String| BackendError::new("model_invalid", e);
            let manifest = manifest::parse(manifest).map_err(|e| invalid(e.to_string()))?;
            let version = Verified::handed_over(dir, manifest, handed).map_err(|e| invalid(e.to_string()))?;
            let spec = ModelSpec::parse(&format!("[engine]\n{engine}")).map_err(invalid)?;
            backend.load(&version, &spec)
        });
        load.join().unwrap_or_else(|_| Err(BackendError::new("engine_panicked", "the engine panicked while loading")))
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
            Err(e) => Report::WeightsFailed { message: crate::hop::bounded(&e.to_string()) },
        };
        let Ok(bytes) = serde_json::to_vec(&report) else { return };
        if setup.send(&bytes, &[]).is_err() {
            return;
        }
    }
}
