//! Finding and starting ONNX Runtime, once per process, and the threads it
//! runs on.
//!
//! ONNX Runtime is loaded at run time from a shared library
//! (`libonnxruntime.so`), so building baton needs no C++ toolchain and the
//! library can be updated without a rebuild.
//!
//! Why worker threads are spawned the way they are: see the crate's
//! [thread priority](crate#thread-priority) section.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, mpsc};
use std::thread::{self, JoinHandle};

use baton_core::run::backend::BackendError;
use ort::environment::{Environment, ThreadManager};
use ort::logging::LogLevel;

/// Where [`runtime_path`] looks for the library, relative to the repository
/// root (or any directory above the current directory or executable).
pub const RUNTIME_RELATIVE_PATH: &str = ".baton/lib/libonnxruntime.so";

/// Where [`runtime_path`] looks for the library relative to the directory
/// above the executable's: `/usr/lib/baton/libonnxruntime.so` for
/// `/usr/bin/baton`.
pub const INSTALLED_RELATIVE_PATH: &str = "lib/baton/libonnxruntime.so";

/// The name of the ONNX Runtime worker threads baton creates.
pub const WORKER_THREAD_NAME: &str = "baton-ort-pool";

/// The name of the thread that spawns the workers (Linux tools show its
/// first 15 bytes, `baton-ort-spawn`).
pub const SPAWNER_THREAD_NAME: &str = "baton-ort-spawner";

/// How to get the library, repeated in every "not found" message.
const HOW_TO_GET_IT: &str = "run scripts/fetch-onnxruntime.sh or set ORT_DYLIB_PATH";

/// Stack size of worker threads: glibc's default for threads, which is what
/// ONNX Runtime's own threads would get. Only touched pages use memory.
const WORKER_STACK_SIZE: usize = 8 << 20;

/// Finds the ONNX Runtime shared library.
///
/// In order: the `ORT_DYLIB_PATH` environment variable when set (the file
/// must exist); else `../lib/baton/libonnxruntime.so` beside the current
/// executable (the installed layout: `/usr/bin/baton` and
/// `/usr/lib/baton/libonnxruntime.so`, as the container image and the
/// Debian package have it); else `.baton/lib/libonnxruntime.so` in the
/// current directory or any directory above it; else the same above the
/// directory of the current executable (so tests under `target/` and an
/// installed binary next to a `.baton` directory find it). The installed
/// library comes before the walks because it is the one shipped with the
/// binary: a `.baton` directory that happens to lie above the working
/// directory must not swap it for another. Fails with kind
/// `runtime_missing`, whose message says how to get the library.
pub fn runtime_path() -> Result<PathBuf, BackendError> {
    if let Some(value) = std::env::var_os("ORT_DYLIB_PATH").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        if path.is_file() {
            return Ok(std::path::absolute(&path).unwrap_or(path));
        }
        return Err(BackendError::new(
            "runtime_missing",
            format!(
                "ONNX Runtime library not found: ORT_DYLIB_PATH is {} but there is no such file; {HOW_TO_GET_IT}",
                path.display()
            ),
        ));
    }
    let exe_dir = std::env::current_exe().ok().and_then(|exe| exe.parent().map(Path::to_path_buf));
    if let Some(installed) = exe_dir.as_deref().and_then(Path::parent).map(|dir| dir.join(INSTALLED_RELATIVE_PATH))
        && installed.is_file()
    {
        return Ok(installed);
    }
    for start in [std::env::current_dir().ok(), exe_dir].into_iter().flatten() {
        for dir in start.ancestors() {
            let candidate = dir.join(RUNTIME_RELATIVE_PATH);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err(BackendError::new(
        "runtime_missing",
        format!(
            "ONNX Runtime library not found (no ../{INSTALLED_RELATIVE_PATH} beside the executable, \
             no {RUNTIME_RELATIVE_PATH} above the current directory or the executable, \
             and ORT_DYLIB_PATH is not set): {HOW_TO_GET_IT}"
        ),
    ))
}

/// The process-wide ONNX Runtime state.
pub(crate) struct Runtime {
    /// The one ORT environment sessions are created in.
    pub(crate) env: Environment,
    /// Spawns worker threads at the priority `init` ran at.
    spawner: Spawner,
}

/// A failed start, kept so that later calls report the same error.
struct StartError {
    kind: &'static str,
    message: String,
}

static RUNTIME: OnceLock<Result<Runtime, StartError>> = OnceLock::new();

/// Loads ONNX Runtime and starts baton's ORT threads, once per process; later
/// calls return the result of the first.
///
/// Call it from a thread at serving priority, normally the main thread at
/// startup, before any thread lowers its priority: the `baton-ort-spawner`
/// thread started here, and through it every ONNX Runtime worker thread,
/// inherits the calling thread's priority (see [thread
/// priority](crate#thread-priority)). [`OnnxBackend::new`](crate::OnnxBackend::new)
/// calls it.
///
/// Errors: kind `runtime_missing` when the library is not found (see
/// [`runtime_path`]), `runtime_unusable` when it cannot be loaded or is older
/// than ONNX Runtime 1.24 (C API 24, which baton is built against).
pub fn init() -> Result<(), BackendError> {
    runtime().map(|_| ())
}

/// The process's ONNX Runtime environment, started by [`init`] if needed:
/// for code that runs ONNX Runtime directly beside baton, such as a test
/// comparing baton's answers with a session of its own (a process has one
/// environment, which baton creates).
pub fn environment() -> Result<&'static Environment, BackendError> {
    runtime().map(|runtime| &runtime.env)
}

/// The runtime, started on first use.
pub(crate) fn runtime() -> Result<&'static Runtime, BackendError> {
    match RUNTIME.get_or_init(start) {
        Ok(runtime) => Ok(runtime),
        Err(e) => Err(BackendError::new(e.kind, e.message.clone())),
    }
}

fn start() -> Result<Runtime, StartError> {
    let path = runtime_path().map_err(|e| StartError { kind: e.kind, message: e.message })?;
    warn_if_lowered_priority();
    let unusable = |message: String| StartError { kind: "runtime_unusable", message };
    // The ort binding may panic on a library it cannot make sense of; that
    // must become an error, not take the process down.
    let loaded = std::panic::catch_unwind(|| -> Result<Environment, String> {
        let builder = ort::init_from(&path).map_err(|e| e.to_string())?;
        let env = builder
            .with_name("baton")
            .with_telemetry(false)
            .with_logger(Arc::new(forward_log))
            .build()
            .map_err(|e| e.to_string())?;
        // A custom logger is registered at verbose level; only warnings and
        // errors are worth formatting.
        env.set_log_level(LogLevel::Warning);
        Ok(env)
    });
    let env = match loaded {
        Ok(Ok(env)) => env,
        Ok(Err(message)) => {
            return Err(unusable(format!(
                "cannot load ONNX Runtime from {}: {message}; {HOW_TO_GET_IT}",
                path.display()
            )));
        }
        Err(_) => {
            return Err(unusable(format!(
                "loading ONNX Runtime from {} failed unexpectedly; {HOW_TO_GET_IT}",
                path.display()
            )));
        }
    };
    let spawner = Spawner::start().map_err(|e| StartError {
        kind: "runtime_unusable",
        message: format!("cannot start {SPAWNER_THREAD_NAME}: {e}"),
    })?;
    tracing::info!(path = %path.display(), "ONNX Runtime loaded");
    Ok(Runtime { env, spawner })
}

/// Forwards ONNX Runtime's log messages to `tracing`, at serving priority:
/// ONNX Runtime logs on whichever thread calls it, a lowered loading thread
/// among them, which must not take the log writer's lock
/// ([`baton_core::threads::agent::at_serving_priority`]). Called from C, so it must
/// not panic; neither `tracing` macros nor the hand-off do.
fn forward_log(level: LogLevel, category: &str, id: &str, location: &str, message: &str) {
    let (category, id, location, message) =
        (category.to_owned(), id.to_owned(), location.to_owned(), message.to_owned());
    baton_core::threads::agent::at_serving_priority(move || match level {
        LogLevel::Verbose => tracing::trace!(target: "onnxruntime", category, id, location, "{message}"),
        LogLevel::Info => tracing::debug!(target: "onnxruntime", category, id, location, "{message}"),
        LogLevel::Warning => tracing::warn!(target: "onnxruntime", category, id, location, "{message}"),
        LogLevel::Error | LogLevel::Fatal => {
            tracing::error!(target: "onnxruntime", category, id, location, "{message}")
        }
    });
}

/// Warns when `init` runs on a thread whose priority is below the main
/// thread's: the ORT worker threads would inherit it for good.
fn warn_if_lowered_priority() {
    let Ok(current) = baton_core::threads::sys::current_thread_nice() else { return };
    // Field 19 of /proc/self/stat is the nice value of the main thread.
    let main = std::fs::read_to_string("/proc/self/stat").ok().and_then(|stat| {
        let after_comm = &stat[stat.rfind(')')? + 1..];
        after_comm.split_whitespace().nth(16)?.parse::<i32>().ok()
    });
    if let Some(main) = main
        && current > main
    {
        tracing::warn!(
            thread_nice = current,
            main_nice = main,
            "baton_onnx::init runs on a thread with lower CPU priority than the main thread; \
             ONNX Runtime worker threads will inherit it"
        );
    }
}

/// A request to the spawner thread.
struct SpawnRequest {
    work: Box<dyn FnOnce() + Send + 'static>,
    reply: mpsc::SyncSender<io::Result<JoinHandle<()>>>,
}

/// The handle of the `baton-ort-spawner` thread.
struct Spawner {
    requests: mpsc::Sender<SpawnRequest>,
}

impl Spawner {
    /// Starts the spawner thread; it inherits the calling thread's priority.
    fn start() -> io::Result<Spawner> {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new().name(SPAWNER_THREAD_NAME.into()).spawn(move || {
            for request in incoming {
                let spawned = thread::Builder::new()
                    .name(WORKER_THREAD_NAME.into())
                    .stack_size(WORKER_STACK_SIZE)
                    .spawn(request.work);
                // The requester waits for the answer; if it is gone, the
                // thread runs its work and ends on its own.
                let _ = request.reply.send(spawned);
            }
        })?;
        Ok(Spawner { requests })
    }

    /// Spawns a thread running `work` from the spawner thread and returns its handle.
    fn spawn(&self, work: Box<dyn FnOnce() + Send + 'static>) -> io::Result<JoinHandle<()>> {
        let gone = || io::Error::other(format!("the {SPAWNER_THREAD_NAME} thread has stopped"));
        let (reply, answer) = mpsc::sync_channel(1);
        self.requests.send(SpawnRequest { work, reply }).map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }
}

/// The [`ThreadManager`] of every session with worker threads: threads are
/// spawned by the `baton-ort-spawner` thread, so they run at the priority
/// [`init`] ran at, whichever thread creates the session.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolThreads;

impl ThreadManager for PoolThreads {
    type Thread = JoinHandle<()>;

    fn create(&self, work: impl FnOnce() + Send + 'static) -> ort::Result<Self::Thread> {
        let runtime = runtime().map_err(|e| ort::Error::new(e.message))?;
        runtime
            .spawner
            .spawn(Box::new(work))
            .map_err(|e| ort::Error::new(format!("cannot create an ONNX Runtime worker thread: {e}")))
    }

    fn join(thread: Self::Thread) -> ort::Result<()> {
        thread.join().map_err(|_| ort::Error::new("an ONNX Runtime worker thread panicked"))
    }
}
