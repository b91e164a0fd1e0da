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
use baton_core::registry::{Registry, RegistryConfig};
use baton_core::source::LocalRepository;
use baton_core::step_aside::StepAside;
use tokio::sync::broadcast::error::RecvError;

use crate::app::App;

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
    /// Polls in a row a model directory (or `model.toml`) or a kept
    /// version must be found missing ("no such file") before the watcher
    /// unloads or retires it. Other errors reading the repository never
    /// count: they change nothing.
    #[arg(long, default_value_t = watch::MISSING_POLLS, value_parser = clap::value_parser!(u32).range(1..))]
    pub missing_polls: u32,
    /// How long shutdown waits for requests in flight, in seconds.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 64 << 20)]
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
    /// Let threads building or freeing a version step off the CPU while
    /// other threads wait for one, interrupted by a timer signal (Linux
    /// only; off by default, see docs/hot-swap.md). The three options
    /// below tune it and do nothing without it.
    #[arg(long)]
    pub loader_step_aside: bool,
    /// With --loader-step-aside: CPU time, in microseconds, such a thread
    /// uses before it looks whether other threads wait for a CPU, and how
    /// often it is interrupted to look (at least 100). 0 never looks.
    #[arg(long, default_value_t = 250)]
    pub loader_quantum_us: u64,
    /// With --loader-step-aside: how long, in microseconds, it then steps
    /// off the CPU when more threads are runnable than there are CPUs.
    #[arg(long, default_value_t = 200)]
    pub loader_pause_us: u64,
    /// With --loader-step-aside: the share of one CPU, in percent (10–100),
    /// such a thread keeps while requests are being served; 100 does not
    /// limit it.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(10..=100))]
    pub loader_serving_share: u8,
}

impl ServeArgs {
    /// The loading threads' step-aside policy the flags ask for: off unless
    /// `--loader-step-aside` is given.
    pub fn step_aside(&self) -> StepAside {
        if !self.loader_step_aside {
            return StepAside::OFF;
        }
        StepAside {
            quantum: Duration::from_micros(self.loader_quantum_us),
            pause: Duration::from_micros(self.loader_pause_us),
            serving_share: self.loader_serving_share,
        }
    }
}

/// Runs the server until SIGTERM or SIGINT.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let root = match &args.repo {
        Some(root) => root.clone(),
        None => {
            let root = demo::prepare(std::path::Path::new(".baton/demo")).context("preparing the demo repository")?;
            tracing::info!(repo = %root.display(), "No --repo given; serving the demo repository.");
            root
        }
    };
    anyhow::ensure!(root.is_dir(), "the model repository {} is not a directory", root.display());
    baton_core::sys::keep_large_allocations_mapped();
    match baton_core::sys::raise_open_files_limit() {
        Ok(limit) => tracing::debug!(limit, "Open files limit."),
        Err(error) => tracing::warn!(%error, "Could not raise the limit on open files."),
    }
    // ONNX Runtime is started here, on the main thread, at serving priority.
    let onnx = baton_onnx::OnnxBackend::new().map_err(|e| anyhow::anyhow!("{e}"))?;
    let registry = Registry::new(
        Arc::new(LocalRepository::new(&root)),
        vec![Arc::new(onnx)],
        RegistryConfig {
            loader_nice: args.loader_nice,
            loader_idle: args.loader_idle,
            step_aside: args.step_aside(),
            ..RegistryConfig::default()
        },
    );
    let app = Arc::new(App::new(registry, args.max_request_bytes));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(serve(app, root, args))
}

async fn serve(app: Arc<App>, root: PathBuf, args: ServeArgs) -> anyhow::Result<()> {
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
    let missing_polls = args.missing_polls;
    let watcher = std::thread::Builder::new().name("baton-watch".into()).spawn(move || {
        let mut watcher = watch::Watcher::new(watcher_app, root, missing_polls);
        watcher.scan();
        if watch {
            watcher.run(poll, &stop);
        }
    })?;

    {
        // Both lines at once, REST first: scripts and tests read them. A
        // closed stdout is no reason to stop serving.
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "Listening on http://{address} (KServe V2 REST).");
        let _ = writeln!(out, "Listening on grpc://{grpc_address} (KServe V2 gRPC).");
        let _ = out.flush();
    }
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
        shutdown_signal().await;
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
    fn loading_threads_step_aside_only_when_asked_and_zero_turns_it_off() {
        assert_eq!(parse(&[]).step_aside(), StepAside::OFF);
        assert_eq!(
            parse(&["--loader-quantum-us", "500"]).step_aside(),
            StepAside::OFF,
            "tuning alone turns nothing on"
        );
        assert_eq!(parse(&["--loader-step-aside"]).step_aside(), StepAside::STANDARD);
        assert!(!parse(&["--loader-step-aside", "--loader-quantum-us", "0"]).step_aside().is_on());
        let custom =
            parse(&["--loader-step-aside", "--loader-quantum-us", "500", "--loader-pause-us", "100"]).step_aside();
        assert_eq!(
            custom,
            StepAside { quantum: Duration::from_micros(500), pause: Duration::from_micros(100), serving_share: 50 }
        );
        let unshared = parse(&["--loader-step-aside", "--loader-serving-share", "100"]).step_aside();
        assert_eq!(unshared.serving_share, 100);
        for bad in ["5", "101"] {
            let args = ["baton", "--loader-serving-share", bad];
            assert!(Cli::try_parse_from(args).is_err(), "a share of {bad} % was accepted");
        }
    }

    #[test]
    fn three_polls_in_a_row_unless_told_otherwise_and_never_zero() {
        assert_eq!(parse(&[]).missing_polls, 3);
        assert_eq!(parse(&["--missing-polls", "1"]).missing_polls, 1);
        assert!(Cli::try_parse_from(["baton", "--missing-polls", "0"]).is_err(), "zero polls was accepted");
    }

    #[test]
    fn the_loader_runs_under_sched_idle_unless_told_otherwise() {
        assert!(loader_idle(&[]));
        assert!(loader_idle(&["--loader-idle"]));
        assert!(loader_idle(&["--loader-idle=true"]));
        assert!(!loader_idle(&["--loader-idle=false"]));
    }
}
