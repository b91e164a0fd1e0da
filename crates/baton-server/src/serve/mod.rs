//! `baton serve`: the registry, the REST and gRPC front ends, the
//! repository watcher and graceful shutdown.

pub mod demo;
pub mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::serve::ListenerExt;
use baton_core::backend::Backend;
use baton_core::registry::{Registry, RegistryConfig};
use baton_core::source::LocalRepository;
use baton_core::step_aside::StepAside;
use tokio::sync::broadcast::error::RecvError;

use crate::app::{App, ServerLimits};

/// Options of `baton serve`. An option given twice takes its last value, so
/// wrappers can set defaults that their callers override.
#[derive(clap::Args, Debug)]
#[command(args_override_self = true)]
pub struct ServeArgs {
    /// The model repository. Without it, baton serves a demo repository it
    /// generates under .baton/demo.
    #[arg(long)]
    pub repo: Option<PathBuf>,
    /// Address of the KServe V2 REST API (Triton's port, so habits carry over).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub http: SocketAddr,
    /// Address of the KServe V2 gRPC API (Triton's port).
    #[arg(long, default_value = "127.0.0.1:8001")]
    pub grpc: SocketAddr,
    /// Do not poll the repository for new and removed versions.
    #[arg(long)]
    pub no_watch: bool,
    /// How often the repository is polled, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub poll_ms: u64,
    /// How long shutdown waits for requests in flight, in seconds.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Largest request body accepted, in bytes (or with a unit: 64MiB).
    #[arg(long, default_value = "64MiB", value_parser = parse_usize_bytes)]
    pub max_request_bytes: usize,
    /// Nice value of the threads that load and free versions.
    #[arg(long, default_value_t = 19)]
    pub loader_nice: i32,
    /// Also run the loading threads under SCHED_IDLE (the default;
    /// `--loader-idle=false` keeps them at their nice value only): a serving
    /// thread that wakes where the loader runs gets the core at once, and
    /// under sustained full load a load waits for idle moments.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub loader_idle: bool,
    /// CPU time, in microseconds, a thread building or freeing a version
    /// uses before it looks whether other threads wait for a CPU, and how
    /// often it is interrupted to look (at least 100). 0 never looks.
    #[arg(long, default_value_t = 250)]
    pub loader_quantum_us: u64,
    /// How long, in microseconds, it then steps off the CPU when more
    /// threads are runnable than there are CPUs.
    #[arg(long, default_value_t = 200)]
    pub loader_pause_us: u64,
    /// The share of one CPU, in percent (10–100), a thread building or
    /// freeing a version keeps while requests are being served; 100 does
    /// not limit it.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(10..=100))]
    pub loader_serving_share: u8,
    /// Inference requests the server holds at once, from arrival to answer;
    /// more are refused at once (503, gRPC UNAVAILABLE).
    #[arg(long, default_value_t = 1024)]
    pub max_in_flight: usize,
    /// Bytes that request bodies, decoded tensors and outputs may hold at
    /// once, e.g. 512MiB or 2GiB; a request that does not fit waits up to
    /// 100 ms, then is refused (503, gRPC UNAVAILABLE).
    #[arg(long, default_value = "512MiB", value_parser = parse_bytes)]
    pub request_memory_budget: u64,
    /// The deadline of a request whose client sets none, e.g. 30s or
    /// 500ms; 0 for none.
    #[arg(long, default_value = "30s", value_parser = parse_timeout)]
    pub request_timeout: Timeout,
}

/// A `--request-timeout`: a duration, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeout(pub Option<Duration>);

/// Parses a byte count with an optional binary unit: `1048576`, `512KiB`,
/// `64MiB`, `2GiB`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("'{text}' is not a byte count"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        other => return Err(format!("unknown unit '{other}'; use B, KiB, MiB or GiB")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("'{text}' is too large"))
}

/// [`parse_bytes`], for a size held in a `usize`.
pub fn parse_usize_bytes(text: &str) -> Result<usize, String> {
    usize::try_from(parse_bytes(text)?).map_err(|_| format!("'{text}' is too large"))
}

/// Parses a timeout: `0` for none, else a number with `ms` or `s`.
pub fn parse_timeout(text: &str) -> Result<Timeout, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Timeout(None));
    }
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = digits.parse().map_err(|_| format!("'{text}' is not a timeout"))?;
    match unit {
        "ms" => Ok(Timeout(Some(Duration::from_millis(n)))),
        "s" => Ok(Timeout(Some(Duration::from_secs(n)))),
        _ => Err(format!("'{text}' needs a unit, ms or s (or is 0 for none)")),
    }
}

impl ServeArgs {
    /// Parses `baton serve`'s options (without `baton serve` itself), as
    /// the command line would.
    pub fn from_options<I: IntoIterator<Item = T>, T: Into<std::ffi::OsString> + Clone>(
        options: I,
    ) -> Result<ServeArgs, clap::Error> {
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let options = options.into_iter().map(Into::into);
        <Serve as clap::Parser>::try_parse_from(std::iter::once("serve".into()).chain(options)).map(|s| s.serve)
    }

    /// The server-wide bounds on requests the flags ask for.
    pub fn limits(&self) -> ServerLimits {
        ServerLimits {
            max_request_bytes: self.max_request_bytes,
            max_in_flight: self.max_in_flight.max(1),
            memory_budget: self.request_memory_budget,
            request_timeout: self.request_timeout.0,
        }
    }

    /// The loading threads' step-aside policy the flags ask for.
    pub fn step_aside(&self) -> StepAside {
        StepAside {
            quantum: Duration::from_micros(self.loader_quantum_us),
            pause: Duration::from_micros(self.loader_pause_us),
            serving_share: self.loader_serving_share,
        }
    }
}

/// Runs the server until SIGTERM or SIGINT.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let root = repository_root(&args)?;
    baton_core::sys::keep_large_allocations_mapped();
    // Session threads are started from here, at serving priority.
    baton_core::executor::start_spawner();
    // ONNX Runtime is started here, on the main thread, at serving priority.
    let onnx = baton_onnx::OnnxBackend::new().map_err(|e| anyhow::anyhow!("{e}"))?;
    let app = app(&root, &args, vec![Arc::new(onnx)]);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(serve(app, root, args, shutdown_signal(), |address, grpc_address| {
        // Both lines at once, REST first: scripts and tests read them. A
        // closed stdout is no reason to stop serving.
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "Listening on http://{address} (KServe V2 REST).");
        let _ = writeln!(out, "Listening on grpc://{grpc_address} (KServe V2 gRPC).");
        let _ = out.flush();
    }))
}

fn repository_root(args: &ServeArgs) -> anyhow::Result<PathBuf> {
    let root = match &args.repo {
        Some(root) => root.clone(),
        None => {
            let root = demo::prepare(std::path::Path::new(".baton/demo")).context("preparing the demo repository")?;
            tracing::info!(repo = %root.display(), "No --repo given; serving the demo repository.");
            root
        }
    };
    anyhow::ensure!(root.is_dir(), "the model repository {} is not a directory", root.display());
    Ok(root)
}

fn app(root: &std::path::Path, args: &ServeArgs, backends: Vec<Arc<dyn Backend>>) -> Arc<App> {
    let registry = Registry::new(
        Arc::new(LocalRepository::new(root)),
        backends,
        RegistryConfig {
            loader_nice: args.loader_nice,
            loader_idle: args.loader_idle,
            step_aside: args.step_aside(),
            ..RegistryConfig::default()
        },
    );
    let limits = args.limits();
    if limits.memory_budget < 2 * limits.max_request_bytes as u64 {
        tracing::warn!(
            budget = limits.memory_budget,
            max_request_bytes = limits.max_request_bytes,
            "The request memory budget holds less than two of the largest requests (body and tensors); such requests may be refused."
        );
    }
    Arc::new(App::new(registry, limits))
}

/// A server running inside this process on given backends, for tests that
/// need a backend the binary does not have (the test kit's fake one). It
/// serves exactly as `baton serve` does, on an async runtime of its own
/// with `workers` threads, until stopped or dropped.
pub struct InProcess {
    /// The REST address.
    pub http: SocketAddr,
    /// The gRPC address.
    pub grpc: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl InProcess {
    /// Starts serving `args.repo` with `backends`; returns once both front
    /// ends listen.
    pub fn start(args: ServeArgs, backends: Vec<Arc<dyn Backend>>, workers: usize) -> anyhow::Result<InProcess> {
        let root = args.repo.clone().context("an in-process server needs --repo")?;
        baton_core::executor::start_spawner();
        let app = app(&root, &args, backends);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (listening, addresses) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name("baton-in-process".into()).spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers.max(1))
                .enable_all()
                .build()
                .context("starting the runtime")?;
            let stop = async move {
                let _ = stopped.await;
            };
            runtime.block_on(serve(app, root, args, stop, move |http, grpc| {
                let _ = listening.send((http, grpc));
            }))
        })?;
        if let Ok((http, grpc)) = addresses.recv() {
            return Ok(InProcess { http, grpc, stop: Some(stop), thread: Some(thread) });
        }
        // The thread ended before it listened: say why.
        match thread.join() {
            Ok(Err(error)) => Err(error),
            Ok(Ok(())) => Err(anyhow::anyhow!("the server stopped before it listened")),
            Err(_) => Err(anyhow::anyhow!("the server thread panicked")),
        }
    }

    /// Shuts the server down as SIGTERM would, and waits until it has.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shut_down()
    }

    fn shut_down(&mut self) -> anyhow::Result<()> {
        drop(self.stop.take());
        match self.thread.take() {
            Some(thread) => thread.join().map_err(|_| anyhow::anyhow!("the server thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        let _ = self.shut_down();
    }
}

async fn serve(
    app: Arc<App>,
    root: PathBuf,
    args: ServeArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    listening: impl FnOnce(SocketAddr, SocketAddr),
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.http).await.with_context(|| format!("binding {}", args.http))?;
    let address = listener.local_addr()?;
    let grpc_listener =
        tokio::net::TcpListener::bind(args.grpc).await.with_context(|| format!("binding {}", args.grpc))?;
    let grpc_address = grpc_listener.local_addr()?;
    // Subscribed before the first load starts, so every load is counted.
    tokio::spawn(feed_metrics(Arc::clone(&app), app.registry.subscribe()));

    let (stop_watching, stop) = std::sync::mpsc::channel::<()>();
    let watcher_app = Arc::clone(&app);
    let poll = Duration::from_millis(args.poll_ms.max(10));
    let watch = !args.no_watch;
    let watcher = std::thread::Builder::new().name("baton-watch".into()).spawn(move || {
        let mut watcher = watch::Watcher::new(watcher_app, root);
        watcher.scan();
        if watch {
            watcher.run(poll, &stop);
        }
    })?;

    listening(address, grpc_address);
    tracing::info!(%address, %grpc_address, watch, "baton is serving.");
    let signal_app = Arc::clone(&app);
    let mut stopped = app.shutdown_signal();
    // Answers go out the moment they are written, not after Nagle's wait
    // for the previous segment's ACK (up to 40 ms with delayed ACKs).
    let listener = listener.tap_io(|tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "Could not set TCP_NODELAY on a connection.");
        }
    });
    let server = axum::serve(listener, crate::http::router(Arc::clone(&app))).with_graceful_shutdown(async move {
        shutdown.await;
        // Not ready first, then say so: whoever reads the line can rely on it.
        signal_app.start_draining();
        tracing::info!("Shutting down: not ready from now on, finishing requests in flight.");
    });
    // Stops accepting when the app starts draining (the REST side's signal
    // handler starts it), then finishes the RPCs in flight.
    let grpc = crate::grpc::serve(Arc::clone(&app), grpc_listener);
    let both = async {
        tokio::try_join!(async { server.await.context("serving HTTP") }, async { grpc.await.context("serving gRPC") })
    };
    let grace = Duration::from_secs(args.shutdown_timeout);
    tokio::select! {
        result = both => { result?; }
        () = async {
            let _ = stopped.wait_for(|stop| *stop).await;
            tokio::time::sleep(grace).await;
        } => tracing::warn!(timeout_s = grace.as_secs(), "Shutdown timed out with requests still in flight."),
    }
    drop(stop_watching);
    let _ = watcher.join();
    tracing::info!("baton stopped.");
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

async fn feed_metrics(app: Arc<App>, mut events: baton_core::events::EventReceiver) {
    loop {
        match events.recv().await {
            Ok(event) => app.metrics.on_event(&event),
            Err(RecvError::Lagged(n)) => app.metrics.missed_events(n),
            Err(RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use baton_core::step_aside::StepAside;
    use clap::Parser;

    use super::ServeArgs;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(args: &[&str]) -> ServeArgs {
        Cli::try_parse_from(std::iter::once("baton").chain(args.iter().copied())).unwrap().serve
    }

    fn loader_idle(args: &[&str]) -> bool {
        parse(args).loader_idle
    }

    #[test]
    fn loading_threads_step_aside_by_default_and_zero_turns_it_off() {
        assert_eq!(parse(&[]).step_aside(), StepAside::DEFAULT);
        assert!(!parse(&["--loader-quantum-us", "0"]).step_aside().is_on());
        let custom = parse(&["--loader-quantum-us", "500", "--loader-pause-us", "100"]).step_aside();
        assert_eq!(
            custom,
            StepAside { quantum: Duration::from_micros(500), pause: Duration::from_micros(100), serving_share: 50 }
        );
        assert_eq!(parse(&["--loader-serving-share", "100"]).step_aside().serving_share, 100);
        for bad in ["5", "101"] {
            let args = ["baton", "--loader-serving-share", bad];
            assert!(Cli::try_parse_from(args).is_err(), "a share of {bad} % was accepted");
        }
    }

    #[test]
    fn request_bounds_take_units_and_have_defaults() {
        let defaults = parse(&[]).limits();
        assert_eq!(defaults, crate::app::ServerLimits::default());
        let args = ["--max-request-bytes", "1MiB", "--request-memory-budget", "2GiB", "--request-timeout", "250ms"];
        let limits = parse(&args).limits();
        assert_eq!((limits.max_request_bytes, limits.memory_budget), (1 << 20, 2 << 30));
        assert_eq!(limits.request_timeout, Some(Duration::from_millis(250)));
        assert_eq!(parse(&["--request-timeout", "0"]).limits().request_timeout, None);
        assert_eq!(parse(&["--max-request-bytes", "4096"]).max_request_bytes, 4096);
        for bad in [["--request-timeout", "30"], ["--request-memory-budget", "1MB"], ["--max-request-bytes", "x"]] {
            assert!(Cli::try_parse_from(std::iter::once("baton").chain(bad)).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn the_loader_runs_under_sched_idle_unless_told_otherwise() {
        assert!(loader_idle(&[]));
        assert!(loader_idle(&["--loader-idle"]));
        assert!(loader_idle(&["--loader-idle=true"]));
        assert!(!loader_idle(&["--loader-idle=false"]));
    }
}
