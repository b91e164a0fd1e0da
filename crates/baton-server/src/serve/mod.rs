//! `baton serve`: the registry, the REST and gRPC front ends (inference
//! and, when asked, admin listeners), the repository watcher as the model
//! control mode wants it, and graceful shutdown.

pub mod demo;
pub mod shutdown;
pub mod watch;

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::serve::ListenerExt;
use baton_core::registry::{Registry, RegistryConfig};
use baton_core::source::LocalRepository;
use baton_core::step_aside::StepAside;
use tokio::sync::broadcast::error::RecvError;

use crate::access::{Access, Exposed, Listener, ModelControl, Token};
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
    /// Do not poll the repository: the same as `--model-control explicit`
    /// with every model (or only the `--load-model` ones) loaded at start.
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
    /// How long shutdown waits, in seconds, once the listeners have closed,
    /// for requests in flight and operations running on models; past it
    /// baton exits without them.
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
    /// How models come and go, as in Triton: `poll` loads every model at
    /// start and polls the repository, `explicit` loads only the
    /// `--load-model` models at start and does not poll, `none` loads every
    /// model at start, does not poll and refuses the API's model operations.
    /// In `poll` and `explicit` the API loads, unloads, rolls back, retires.
    #[arg(long, value_enum, default_value_t = ModelControl::Poll, conflicts_with = "no_watch")]
    pub model_control: ModelControl,
    /// With `--model-control explicit`, a model to load at start; repeat it
    /// for more; `*` loads every model.
    #[arg(long = "load-model", value_name = "NAME")]
    pub load_model: Vec<String>,
    /// Serve the management operations (load, unload, rollback, retire) on
    /// this REST address instead of the inference ports, which then refuse
    /// them. Status, events and health are served here too.
    #[arg(long, value_name = "ADDR")]
    pub admin_http: Option<SocketAddr>,
    /// The same for gRPC: `baton.v1.Management` and the repository RPCs of
    /// `inference.GRPCInferenceService` are served on this address.
    #[arg(long, value_name = "ADDR")]
    pub admin_grpc: Option<SocketAddr>,
    /// A file holding the token the management operations need (as
    /// `Authorization: Bearer <token>`), read once at start.
    #[arg(long, value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>,
    /// Start even when management operations would be open to anyone who
    /// can reach a non-loopback address (no token, no loopback admin
    /// listener).
    #[arg(long)]
    pub insecure_management: bool,
    /// On SIGTERM, how long to keep serving and accepting, in seconds, after
    /// turning not ready, before closing the listeners: time for load
    /// balancers (a Kubernetes Service's endpoints) to stop sending traffic.
    #[arg(long, default_value_t = 0, value_name = "SECONDS")]
    pub shutdown_delay: u64,
}

/// How models come and go, resolved from `--model-control`, `--load-model`
/// and `--no-watch`.
#[derive(Debug, PartialEq, Eq)]
pub struct Control {
    /// The mode.
    pub mode: ModelControl,
    /// The models loaded at start; `None`: every model.
    pub at_start: Option<BTreeSet<String>>,
}

impl Control {
    /// Whether the repository is polled after the first scan.
    pub fn polls(&self) -> bool {
        self.mode == ModelControl::Poll
    }
}

impl ServeArgs {
    /// The model control the flags ask for. `--no-watch` is explicit control
    /// with every model loaded at start, unless `--load-model` names some.
    pub fn control(&self) -> anyhow::Result<Control> {
        let mode = if self.no_watch { ModelControl::Explicit } else { self.model_control };
        let named = !self.load_model.is_empty();
        anyhow::ensure!(
            mode == ModelControl::Explicit || !named,
            "--load-model applies to --model-control explicit only (with {} every model loads at start)",
            mode.as_str()
        );
        let all =
            mode != ModelControl::Explicit || self.load_model.iter().any(|m| m == "*") || (self.no_watch && !named);
        Ok(Control { mode, at_start: (!all).then(|| self.load_model.iter().cloned().collect()) })
    }

    /// The listeners that serve management operations: the admin ones when
    /// there are any, else the inference ones.
    fn management_listeners(&self) -> Vec<Exposed<'static>> {
        if self.admin_http.is_some() || self.admin_grpc.is_some() {
            let admin = [(self.admin_http, "--admin-http"), (self.admin_grpc, "--admin-grpc")];
            admin
                .into_iter()
                .filter_map(|(address, flag)| Some(Exposed { address: address?, flag, listener: Listener::Admin }))
                .collect()
        } else {
            vec![
                Exposed { address: self.http, flag: "--http", listener: Listener::Inference },
                Exposed { address: self.grpc, flag: "--grpc", listener: Listener::Inference },
            ]
        }
    }

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
    let control = args.control()?;
    let token = args.admin_token_file.as_deref().map(crate::access::read_token_file).transpose()?;
    crate::access::check_exposure(
        &args.management_listeners(),
        token.is_some(),
        control.mode,
        args.insecure_management,
    )?;
    let admin_listener = args.admin_http.is_some() || args.admin_grpc.is_some();
    let access = Arc::new(Access::new(token.as_deref().map(Token::new), admin_listener, control.mode));
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
    if let Some(named) = &control.at_start {
        let models = registry.source().models().map_err(|e| anyhow::anyhow!("listing {}: {e}", root.display()))?;
        if let Some(missing) = named.iter().find(|m| !models.contains(m)) {
            anyhow::bail!("--load-model {missing}: the repository {} has no such model", root.display());
        }
    }
    let app = Arc::new(App::new(registry, args.max_request_bytes));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let result = runtime.block_on(serve(app, root, args, control, access));
    // A request the shutdown timeout gave up on may still run on a worker
    // thread; the process does not wait for it.
    runtime.shutdown_background();
    result
}

type Served = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

async fn bind(address: SocketAddr) -> anyhow::Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(address).await.with_context(|| format!("binding {address}"))?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

async fn serve(
    app: Arc<App>,
    root: PathBuf,
    args: ServeArgs,
    control: Control,
    access: Arc<Access>,
) -> anyhow::Result<()> {
    let (listener, address) = bind(args.http).await?;
    let (grpc_listener, grpc_address) = bind(args.grpc).await?;
    let admin_http = match args.admin_http {
        Some(address) => Some(bind(address).await?),
        None => None,
    };
    let admin_grpc = match args.admin_grpc {
        Some(address) => Some(bind(address).await?),
        None => None,
    };
    // Installed before the first line is printed: from then on a signal
    // starts the shutdown sequence instead of killing the process.
    let signals = shutdown::Signals::install()?;
    // Subscribed before the first load starts, so every load is counted.
    tokio::spawn(feed_metrics(Arc::clone(&app), app.registry.subscribe()));

    let (stop_watching, stop) = std::sync::mpsc::channel::<()>();
    let watcher_app = Arc::clone(&app);
    let poll = Duration::from_millis(args.poll_ms.max(10));
    let (polls, at_start) = (control.polls(), control.at_start.clone());
    let missing_polls = args.missing_polls;
    let watcher = std::thread::Builder::new().name("baton-watch".into()).spawn(move || {
        let mut watcher = watch::Watcher::new(watcher_app, root, missing_polls);
        if let Some(models) = at_start {
            watcher = watcher.only(models);
        }
        watcher.scan();
        if polls {
            watcher.run(poll, &stop);
        }
    })?;

    {
        // Every line at once, REST first, then gRPC, then the admin
        // listeners: scripts and tests read them. A closed stdout is no
        // reason to stop serving.
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "Listening on http://{address} (KServe V2 REST).");
        let _ = writeln!(out, "Listening on grpc://{grpc_address} (KServe V2 gRPC).");
        if let Some((_, admin)) = &admin_http {
            let _ = writeln!(out, "Listening on http://{admin} (baton admin REST).");
        }
        if let Some((_, admin)) = &admin_grpc {
            let _ = writeln!(out, "Listening on grpc://{admin} (baton admin gRPC).");
        }
        let _ = out.flush();
    }
    tracing::info!(
        %address,
        %grpc_address,
        admin_http = ?admin_http.as_ref().map(|(_, a)| *a),
        admin_grpc = ?admin_grpc.as_ref().map(|(_, a)| *a),
        model_control = control.mode.as_str(),
        admin_token = args.admin_token_file.is_some(),
        "baton is serving."
    );
    let delay = Duration::from_secs(args.shutdown_delay);
    tokio::spawn(shutdown::on_signals(signals, Arc::clone(&app), delay, stop_watching));

    let mut servers: Vec<Served> = vec![
        Box::pin(serve_http(Arc::clone(&app), listener, Arc::clone(&access), Listener::Inference)),
        Box::pin(serve_grpc(Arc::clone(&app), grpc_listener, Arc::clone(&access), Listener::Inference)),
    ];
    if let Some((admin, _)) = admin_http {
        servers.push(Box::pin(serve_http(Arc::clone(&app), admin, Arc::clone(&access), Listener::Admin)));
    }
    if let Some((admin, _)) = admin_grpc {
        servers.push(Box::pin(serve_grpc(Arc::clone(&app), admin, Arc::clone(&access), Listener::Admin)));
    }
    let servers = async { futures_util::future::try_join_all(servers).await.map(drop) };
    let grace = Duration::from_secs(args.shutdown_timeout);
    shutdown::drain(&app, servers, watcher, grace).await?;
    tracing::info!("baton stopped.");
    Ok(())
}

/// Serves REST on `listener` until the app starts draining, then finishes
/// the requests in flight.
async fn serve_http(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    access: Arc<Access>,
    role: Listener,
) -> anyhow::Result<()> {
    // Answers go out the moment they are written, not after Nagle's wait
    // for the previous segment's ACK (up to 40 ms with delayed ACKs).
    let listener = listener.tap_io(|tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "Could not set TCP_NODELAY on a connection.");
        }
    });
    let stopped = app.shutdown_signal();
    axum::serve(listener, crate::http::router(app, access, role))
        .with_graceful_shutdown(crate::grpc::draining(stopped))
        .await
        .context("serving HTTP")
}

/// Serves gRPC on `listener` until the app starts draining, then finishes
/// the RPCs in flight.
async fn serve_grpc(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    access: Arc<Access>,
    role: Listener,
) -> anyhow::Result<()> {
    crate::grpc::serve(app, listener, access, role).await.context("serving gRPC")
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

    use super::{Control, ServeArgs};
    use crate::access::ModelControl;

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

    fn control(args: &[&str]) -> anyhow::Result<Control> {
        parse(args).control()
    }

    fn named(models: &[&str]) -> Option<std::collections::BTreeSet<String>> {
        Some(models.iter().map(|m| (*m).to_owned()).collect())
    }

    #[test]
    fn model_control_defaults_to_polling_and_no_watch_is_explicit_with_every_model() {
        assert_eq!(control(&[]).unwrap(), Control { mode: ModelControl::Poll, at_start: None });
        assert!(control(&[]).unwrap().polls());
        let none = control(&["--model-control", "none"]).unwrap();
        assert_eq!((none.polls(), none), (false, Control { mode: ModelControl::None, at_start: None }));
        let no_watch = control(&["--no-watch"]).unwrap();
        assert_eq!((no_watch.polls(), no_watch), (false, Control { mode: ModelControl::Explicit, at_start: None }));
        assert_eq!(control(&["--no-watch", "--load-model", "a"]).unwrap().at_start, named(&["a"]));
        assert!(Cli::try_parse_from(["baton", "--no-watch", "--model-control", "poll"]).is_err());
    }

    #[test]
    fn explicit_control_loads_the_named_models_or_every_one_for_a_star() {
        let explicit = ["--model-control", "explicit"];
        assert_eq!(control(&explicit).unwrap().at_start, named(&[]), "nothing named, nothing loaded");
        let two = control(&["--model-control", "explicit", "--load-model", "a", "--load-model", "b"]).unwrap();
        assert_eq!(two.at_start, named(&["a", "b"]), "--load-model repeats");
        assert_eq!(control(&["--model-control", "explicit", "--load-model", "*"]).unwrap().at_start, None);
        let error = control(&["--load-model", "a"]).unwrap_err().to_string();
        assert!(error.contains("explicit"), "{error}");
        assert!(control(&["--model-control", "none", "--load-model", "a"]).is_err());
    }
}
