//! The `[engine]` keys that are baton's, not the engine's: where a
//! version runs, and what its worker is given. Read once per load, strictly
//! (a typo or a wrong type is `invalid_engine_options`), and taken out of
//! the table before the engine sees it.

use std::time::Duration;

use baton_core::files::spec::ModelSpec;
use baton_core::run::backend::{BackendError, UpdateReason};

use crate::hop::{REGION_DEFAULT, SPIN_DEFAULT};

/// The key that chooses where a version runs: `"process"` or `"none"`.
pub const ISOLATION: &str = "isolation";

/// The key naming the runtime library a worker loads its engine from: a
/// new runtime for one version, beside the server's.
pub const RUNTIME: &str = "runtime";

/// The key bounding how long one call may take in a worker, in
/// milliseconds, before the worker counts as hung and is replaced.
pub const TIMEOUT: &str = "worker_timeout_ms";

/// The key giving how often, in milliseconds, the server asks a worker
/// whether it still runs; 0 asks never. A worker that does not answer
/// within [`TIMEOUT`] counts as hung and is replaced.
pub const HEARTBEAT: &str = "worker_heartbeat_ms";

/// The key giving a worker's nice level, 0 to 19.
pub const NICE: &str = "worker_nice";

/// The key bounding a worker's memory, in MiB.
pub const MEMORY: &str = "worker_memory_mb";

/// The key giving how long, in microseconds, each side of the hop looks
/// for the other's message before its thread sleeps; 0 sleeps at once.
pub const SPIN: &str = "worker_spin_us";

/// The key bounding each shared region of a worker's slots, in MiB: a
/// call's inputs, or its answer, must fit one.
pub const REGION: &str = "worker_region_mb";

/// Every key of baton's in `[engine]`.
pub const KEYS: [&str; 8] = [ISOLATION, RUNTIME, TIMEOUT, HEARTBEAT, NICE, MEMORY, SPIN, REGION];

/// The largest [`REGION`], in MiB: a `BYTES` element's length crosses as
/// 32 bits.
const REGION_MOST_MB: i64 = 4095;

/// How long one call may take in a worker by default.
const CALL_LIMIT: Duration = Duration::from_secs(60);

/// How often a worker is asked whether it still runs, by default.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// The longest look [`SPIN`] allows: beyond it, sleeping costs less.
const SPIN_MOST_US: i64 = 10_000;

/// What `[engine]` says of where a version runs and with what.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct WorkerOptions {
    /// Whether the version runs in a worker process.
    pub(crate) in_worker: bool,
    /// Why it runs in one, when it does.
    pub(crate) reason: Option<UpdateReason>,
    /// The runtime library the worker loads, when not the server's.
    pub(crate) runtime: Option<String>,
    /// The bound on one call in the worker, and on an answer to a heartbeat.
    pub(crate) call_limit: Duration,
    /// How often the worker is asked whether it still runs; never if none.
    pub(crate) heartbeat: Option<Duration>,
    /// The worker's nice level.
    pub(crate) nice: Option<i32>,
    /// The worker's memory limit, in bytes.
    pub(crate) memory: Option<u64>,
    /// How long each side of the hop looks for the other's message before
    /// it sleeps.
    pub(crate) spin: Duration,
    /// The largest shared region of a slot, in bytes.
    pub(crate) region: usize,
}

impl WorkerOptions {
    /// Reads baton's keys of `spec`'s `[engine]` table.
    pub(crate) fn read(spec: &ModelSpec) -> Result<WorkerOptions, BackendError> {
        let invalid = |key: &str, value: &toml::Value, what: &str| {
            BackendError::new("invalid_engine_options", format!("[engine] {key} = {value}: {what}"))
        };
        let engine = &spec.engine;
        let isolation = match engine.get(ISOLATION) {
            None => None,
            Some(toml::Value::String(s)) if s == "process" => Some(true),
            Some(toml::Value::String(s)) if s == "none" => Some(false),
            Some(other) => {
                return Err(invalid(ISOLATION, other, "use \"process\" (a worker process) or \"none\" (the server's)"));
            }
        };
        let runtime = match engine.get(RUNTIME) {
            None => None,
            Some(value @ toml::Value::String(_)) if isolation == Some(false) => {
                let why = format!(
                    "contradicts {ISOLATION} = \"none\": the server's process has one runtime, loaded at start, \
                     so another one runs only in a worker process"
                );
                return Err(invalid(RUNTIME, value, &why));
            }
            Some(toml::Value::String(path)) => Some(path.clone()),
            Some(other) => return Err(invalid(RUNTIME, other, "give the library's path")),
        };
        // A runtime of its own can only be loaded in a process of its own:
        // naming one is enough to choose a worker.
        let reason = match (isolation, &runtime) {
            (_, Some(_)) => Some(UpdateReason::RuntimeLibrary),
            (Some(true), None) => Some(UpdateReason::OperatorChoice),
            _ => None,
        };
        let in_worker = reason.is_some();
        let call_limit = match engine.get(TIMEOUT) {
            None => CALL_LIMIT,
            Some(toml::Value::Integer(ms)) if *ms > 0 => Duration::from_millis(ms.unsigned_abs()),
            Some(other) => return Err(invalid(TIMEOUT, other, "give a number of milliseconds above 0")),
        };
        let heartbeat = match engine.get(HEARTBEAT) {
            None => Some(HEARTBEAT_EVERY),
            Some(toml::Value::Integer(0)) => None,
            Some(toml::Value::Integer(ms)) if *ms > 0 => Some(Duration::from_millis(ms.unsigned_abs())),
            Some(other) => return Err(invalid(HEARTBEAT, other, "give a number of milliseconds, or 0 for none")),
        };
        let nice = match engine.get(NICE) {
            None => None,
            Some(toml::Value::Integer(n)) if (0..=19).contains(n) => i32::try_from(*n).ok(),
            Some(other) => return Err(invalid(NICE, other, "give a nice level from 0 (serving's) to 19 (the lowest)")),
        };
        let memory = match engine.get(MEMORY) {
            None => None,
            Some(toml::Value::Integer(mb)) if *mb > 0 => Some(mb.unsigned_abs() << 20),
            Some(other) => return Err(invalid(MEMORY, other, "give a number of MiB above 0")),
        };
        let spin = match engine.get(SPIN) {
            None => SPIN_DEFAULT,
            Some(toml::Value::Integer(us)) if (0..=SPIN_MOST_US).contains(us) => {
                Duration::from_micros(us.unsigned_abs())
            }
            Some(other) => {
                return Err(invalid(
                    SPIN,
                    other,
                    &format!("give microseconds from 0 (sleep at once) to {SPIN_MOST_US}"),
                ));
            }
        };
        let region = match engine.get(REGION) {
            None => REGION_DEFAULT,
            Some(toml::Value::Integer(mb)) if (1..=REGION_MOST_MB).contains(mb) => (mb.unsigned_abs() as usize) << 20,
            Some(other) => return Err(invalid(REGION, other, &format!("give MiB from 1 to {REGION_MOST_MB}"))),
        };
        Ok(WorkerOptions { in_worker, reason, runtime, call_limit, heartbeat, nice, memory, spin, region })
    }
}

/// Whether baton's `[engine]` keys in `spec` read as their absence does
/// (the reference's test holds each documented default to this); an
/// invalid value is an error.
pub fn reads_as_default(spec: &ModelSpec) -> Result<bool, BackendError> {
    let absent = engine_spec(spec);
    Ok(WorkerOptions::read(spec)? == WorkerOptions::read(&absent)?)
}

/// The spec as the engine reads it: without the keys that are baton's.
pub(crate) fn engine_spec(spec: &ModelSpec) -> ModelSpec {
    let mut spec = spec.clone();
    for key in KEYS {
        spec.engine.remove(key);
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(engine: &str) -> ModelSpec {
        ModelSpec::parse(&format!("[engine]\n{engine}")).unwrap()
    }

    #[test]
    fn isolation_and_runtime_are_read_strictly_and_never_reach_the_engine() {
        assert!(!WorkerOptions::read(&spec("sessions = 2")).unwrap().in_worker);
        assert!(!WorkerOptions::read(&spec("isolation = \"none\"")).unwrap().in_worker);
        assert!(WorkerOptions::read(&spec("isolation = \"process\"\nruntime = \"/lib/ort.so\"")).unwrap().in_worker);
        let chosen = |engine: &str| WorkerOptions::read(&spec(engine)).unwrap().reason;
        assert_eq!(chosen("sessions = 2"), None);
        assert_eq!(chosen("isolation = \"process\""), Some(UpdateReason::OperatorChoice));
        assert_eq!(chosen("runtime = \"/lib/ort.so\""), Some(UpdateReason::RuntimeLibrary));
        assert_eq!(chosen("isolation = \"process\"\nruntime = \"/lib/ort.so\""), Some(UpdateReason::RuntimeLibrary));
        for (engine, needle) in [
            ("isolation = \"container\"", "container"),
            ("isolation = true", "isolation"),
            ("isolation = \"none\"\nruntime = \"/lib/ort.so\"", "contradicts isolation"),
            ("isolation = \"process\"\nruntime = 3", "the library's path"),
            ("isolation = \"process\"\nworker_timeout_ms = 0", "milliseconds"),
            ("isolation = \"process\"\nworker_nice = 20", "nice level"),
            ("isolation = \"process\"\nworker_heartbeat_ms = -5", "or 0 for none"),
            ("isolation = \"process\"\nworker_memory_mb = -1", "MiB"),
            ("isolation = \"process\"\nworker_spin_us = 20000", "microseconds"),
            ("isolation = \"process\"\nworker_region_mb = 0", "MiB from 1"),
            ("isolation = \"process\"\nworker_region_mb = 4096", "MiB from 1"),
        ] {
            let error = WorkerOptions::read(&spec(engine)).unwrap_err();
            assert_eq!(error.kind, "invalid_engine_options");
            assert!(error.message.contains(needle), "{engine}: {}", error.message);
        }
        let engine = "isolation = \"process\"\nruntime = \"/lib/ort.so\"\nworker_timeout_ms = 5\nsessions = 2\n\
                      worker_nice = 7\nworker_memory_mb = 3\nworker_heartbeat_ms = 250\nworker_spin_us = 0\n\
                      worker_region_mb = 2";
        let options = WorkerOptions::read(&spec(engine)).unwrap();
        let want = WorkerOptions {
            in_worker: true,
            reason: Some(UpdateReason::RuntimeLibrary),
            runtime: Some("/lib/ort.so".into()),
            call_limit: Duration::from_millis(5),
            heartbeat: Some(Duration::from_millis(250)),
            nice: Some(7),
            memory: Some(3 << 20),
            spin: Duration::ZERO,
            region: 2 << 20,
        };
        assert_eq!(options, want);
        let engine = engine_spec(&spec(engine)).engine;
        assert_eq!(engine.keys().collect::<Vec<_>>(), ["sessions"]);
        let spin = WorkerOptions::read(&spec("isolation = \"process\"")).unwrap().spin;
        assert_eq!(spin, SPIN_DEFAULT);
        let beats = |engine: &str| WorkerOptions::read(&spec(engine)).unwrap().heartbeat;
        assert_eq!(beats("isolation = \"process\""), Some(HEARTBEAT_EVERY));
        assert_eq!(beats("isolation = \"process\"\nworker_heartbeat_ms = 0"), None);
    }
}
