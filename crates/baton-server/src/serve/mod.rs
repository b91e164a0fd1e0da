//! `baton serve`: the registry, the REST and gRPC front ends (inference
//! and, when asked, admin listeners), the repository watcher as the model
//! control mode wants it, and graceful shutdown.

mod args;
mod closing;
pub mod conn;
pub mod demo;
pub mod listeners;
pub(crate) mod notify;
pub mod repo;
mod retry;
pub mod shutdown;
pub mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Context;
use baton_core::registry::{Registry, RegistryConfig};
use baton_core::run::backend::Backend;
use tokio::sync::broadcast::error::RecvError;

use crate::access::{Access, Front, Listener, Token};
use crate::app::App;
use crate::decisions::{Decisions, Kind};
use crate::upgrade;
pub use args::{Control, ServeArgs};
use listeners::Passed;
use repo::Repo;

/// Runs the server until SIGTERM or SIGINT.
pub fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    // Sockets handed over by the server this one replaces, or passed by a
    // process manager.
    let (target, passed) = match upgrade::Target::from_env()? {
        Some((target, sockets)) => (Some(target), listeners::Passed::from_fds(sockets)?),
        None => (None, listeners::Passed::from_env()?),
    };
    passed.apply(&mut args);
    // SIGTERM, SIGINT and SIGUSR2 wait, blocked, until their handlers are
    // installed (see serve): the new process of a cold upgrade is the
    // service's main process from its check on, and a signal passed on to
    // it while it waits for the old one must not kill it.
    shutdown::hold_signals(true);
    // What a start checks before it loads anything; the server this one
    // replaces learns the outcome before it drains (a cold upgrade).
    let checked = Checked::run(&args);
    if let Some(target) = &target {
        target.checked(checked.as_ref().map(drop).map_err(|e| format!("{e:#}")));
    }
    let Checked { control, access, repo, mut decisions, guards, onnx } = checked?;
    // A cold handover: nothing loads here until the old server has freed
    // its memory by exiting. Connections wait in the sockets' backlog.
    if let Some(target) = target.as_ref().filter(|t| t.cold) {
        tracing::info!("Waiting for the server this one replaces to exit before loading (a cold upgrade).");
        target.await_old_exit();
        // The old server gave up on this one (it began shutting down
        // before its commit: it sends SIGTERM, then shuts the channel), or
        // an operator stopped the service meanwhile: nothing to load.
        if shutdown::stop_pending() {
            tracing::info!("Stopped before loading: a stop came while waiting for the server this one replaces.");
            return Ok(());
        }
        // Read again: the state file is the old server's until it exits.
        decisions = self::decisions(&args, &repo.state_root)?;
    }
    baton_core::threads::sys::keep_large_allocations_mapped();
    match baton_core::threads::sys::raise_open_files_limit() {
        Ok(limit) => tracing::debug!(limit, "Open files limit."),
        Err(error) => tracing::warn!(%error, "Could not raise the limit on open files."),
    }
    // A model whose [engine] says isolation = "process" runs in a worker:
    // this executable again, as `baton worker`.
    let program = std::env::current_exe().context("finding baton's own executable for worker processes")?;
    let onnx = baton_worker::process::ProcessBackend::new(Arc::new(onnx), program, vec!["worker".into()])
        .with_runtime_env("ORT_DYLIB_PATH");
    // A version that carries its processing (a tokenizer, pooling) runs it
    // here, in the server's process, around its graph wherever that runs.
    let onnx = baton_processing::ProcessingBackend::new(Arc::new(onnx));
    let app = app(&repo, &args, vec![Arc::new(onnx)], decisions, guards);
    let _ = app.operations_held.set(access.holder());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let result = runtime.block_on(serve(app, args, (target, passed), control, access, Trigger::Signals, |bound| {
        // Every line at once, REST first, then gRPC, then the admin
        // listeners: scripts and tests read them. A closed stdout is no
        // reason to stop serving.
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "Listening on http://{} (KServe V2 REST).", bound.http);
        let _ = writeln!(out, "Listening on grpc://{} (KServe V2 gRPC).", bound.grpc);
        if let Some(admin) = bound.admin_http {
            let _ = writeln!(out, "Listening on http://{admin} (baton admin REST).");
        }
        if let Some(admin) = bound.admin_grpc {
            let _ = writeln!(out, "Listening on grpc://{admin} (baton admin gRPC).");
        }
        let _ = out.flush();
    }));
    // A request the shutdown timeout gave up on may still run on a worker
    // thread; the process does not wait for it.
    runtime.shutdown_background();
    result
}

/// What `baton serve` checks before it loads anything, and what the
/// checks read: the flags, the token files, the repository (readable, and
/// holding every model `--load-model` names), the state file, the
/// Prometheus URL and the outcome ids' key file, and ONNX Runtime. A new process of an upgrade reports the outcome to the old
/// one before it goes on.
struct Checked {
    control: Control,
    access: Arc<Access>,
    repo: Repo,
    decisions: Decisions,
    guards: Guards,
    onnx: baton_onnx::OnnxBackend,
}

impl Checked {
    fn run(args: &ServeArgs) -> anyhow::Result<Checked> {
        let (control, access) = access(args)?;
        let repo = Repo::open(args)?;
        check_repository(&repo, &control)?;
        let decisions = decisions(args, &repo.state_root)?;
        let guards = Guards::read(args)?;
        // Session threads are started from here, at serving priority.
        baton_core::run::executor::start_spawner();
        // ONNX Runtime is started here, on the main thread, at serving priority.
        let onnx = baton_onnx::OnnxBackend::new().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Checked { control, access, repo, decisions, guards, onnx })
    }
}

/// The model control and the access rules the flags ask for; refuses
/// management open to a public address.
fn access(args: &ServeArgs) -> anyhow::Result<(Control, Arc<Access>)> {
    let control = args.control()?;
    let token = args.admin_token_file.as_deref().map(crate::access::read_token_file).transpose()?;
    crate::access::check_exposure(
        &args.management_listeners(),
        token.is_some(),
        control.mode,
        args.insecure_management,
    )?;
    let admin_listener = args.admin_http.is_some() || args.admin_grpc.is_some();
    let public = |address: std::net::SocketAddr| !address.ip().to_canonical().is_loopback();
    let outcomes_token = args.outcomes_token_file.as_deref().map(crate::access::read_token_file).transpose()?;
    if outcomes_token.is_none() && public(args.http) {
        tracing::warn!(
            address = %args.http,
            "Anyone who can reach this address may post outcomes, which rollouts' outcome guards judge; \
             --outcomes-token-file keeps them to the services given its token."
        );
    }
    let mut access = Access::new(token.as_deref().map(Token::new), admin_listener, control.mode)
        .exposed(Listener::Inference, public(args.http))
        .exposed(Listener::Admin, args.admin_http.is_some_and(public))
        .exposed_on(Front::Grpc, Listener::Inference, public(args.grpc))
        .exposed_on(Front::Grpc, Listener::Admin, args.admin_grpc.is_some_and(public))
        .with_outcomes_token(outcomes_token.as_deref().map(Token::new));
    if args.cluster.checked_store()?.is_some() {
        access = access.managed_by_fleet();
    }
    // Said at start, not only to the first caller refused.
    let upgrades_on =
        if admin_listener { (Listener::Admin, args.admin_http) } else { (Listener::Inference, Some(args.http)) };
    if let (role, Some(address)) = upgrades_on
        && access.server_unprotected(role)
    {
        tracing::warn!(
            %address,
            "Upgrades (POST /baton/v1/upgrade) are refused here: the address is not loopback and no admin token \
             protects it. Use --admin-token-file, a loopback --admin-http, or SIGUSR2."
        );
    }
    let access = Arc::new(access);
    Ok((control, access))
}

/// Refuses to start when the repository cannot be listed (a directory;
/// an object store is listed as it answers, and baton rides out its
/// outages), or when `--load-model` names a model it does not have: a typo
/// should be loud.
fn check_repository(repo: &Repo, control: &Control) -> anyhow::Result<()> {
    if !repo.is_store() || control.at_start.is_some() {
        let models = repo.source.models().map_err(|e| anyhow::anyhow!("listing {}: {e}", repo.name))?;
        if let Some(missing) = control.at_start.iter().flatten().find(|m| !models.contains(m)) {
            anyhow::bail!("--load-model {missing}: the repository {} has no such model", repo.name);
        }
    }
    Ok(())
}

/// The decisions kept in the state file. A file that cannot be read or
/// parsed keeps baton from starting: serving the newest version instead
/// would silently put back a version an operator rolled back from.
fn decisions(args: &ServeArgs, root: &std::path::Path) -> anyhow::Result<Decisions> {
    if let Some(dir) = &args.state_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating the --state-dir {}", dir.display()))?;
    }
    let path = args.state_file(root);
    let decisions = Decisions::open(path.clone()).map_err(|error| {
        anyhow::anyhow!(
            "refusing to start: the state file cannot be read: {error}. It keeps operators' rollbacks, unloads and \
             pins; fix it, or move it away to serve the newest versions (docs/api.md, \"Decisions that survive a \
             restart\")"
        )
    })?;
    let held = decisions.all();
    if !held.is_empty() {
        tracing::info!(file = %path.display(), models = held.len(), "Read the operators' decisions in force.");
    }
    Ok(decisions)
}

/// What rollouts' guards read beyond the server's own numbers: the
/// Prometheus metric guards query, and the key outcome ids are signed
/// with. Read with the other start checks, so that a bad URL or key file
/// stops a start (and a cold upgrade) before anything is handed over.
struct Guards {
    metric_source: Option<Arc<dyn baton_core::rollout::metric::MetricSource>>,
    outcome_key: baton_core::rollout::outcome::OutcomeKey,
}

impl Guards {
    fn read(args: &ServeArgs) -> anyhow::Result<Guards> {
        let metric_source = match args.prometheus_url.as_deref() {
            Some(url) => {
                let timeout = args.prometheus_timeout.0.unwrap_or(crate::prometheus::QUERY_TIMEOUT);
                let prometheus = crate::prometheus::Prometheus::new(url, timeout).map_err(|e| anyhow::anyhow!(e))?;
                tracing::info!(
                    prometheus = prometheus.shown(),
                    timeout_ms = timeout.as_millis() as u64,
                    "Metric guards query this Prometheus."
                );
                Some(Arc::new(prometheus) as Arc<dyn baton_core::rollout::metric::MetricSource>)
            }
            None => None,
        };
        Ok(Guards { metric_source, outcome_key: args.outcome_key()? })
    }
}

fn app(
    repo: &Repo,
    args: &ServeArgs,
    backends: Vec<Arc<dyn Backend>>,
    decisions: Decisions,
    guards: Guards,
) -> Arc<App> {
    let registry = Registry::new(
        Arc::clone(&repo.source),
        backends,
        RegistryConfig {
            loader_nice: args.loader_nice,
            loader_idle: args.loader_idle,
            step_aside: args.step_aside(),
            memory_budget: args.memory_budget,
            metric_source: guards.metric_source,
            outcome_key: guards.outcome_key,
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
    let app = Arc::new(App::new(registry, limits, decisions));
    app.set_readiness(args.readiness);
    repo.serve_for(&app);
    app
}

/// The addresses a server listens on.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    /// The inference REST address.
    pub http: SocketAddr,
    /// The inference gRPC address.
    pub grpc: SocketAddr,
    /// The admin REST address, when there is one.
    pub admin_http: Option<SocketAddr>,
    /// The admin gRPC address, when there is one.
    pub admin_grpc: Option<SocketAddr>,
}

/// What starts the shutdown sequence.
enum Trigger {
    /// SIGTERM or SIGINT, as for `baton serve`; a second one exits at once.
    Signals,
    /// A future, for a server running inside a test's process.
    Stop(Pin<Box<dyn Future<Output = ()> + Send>>),
}

/// A server running inside this process on given backends, for tests that
/// need a backend the binary does not have (the test kit's fake one). It
/// serves exactly as `baton serve` does, on an async runtime of its own
/// with `workers` threads, until stopped or dropped.
pub struct InProcess {
    /// The addresses it listens on.
    pub bound: Bound,
    /// The REST address.
    pub http: SocketAddr,
    /// The gRPC address.
    pub grpc: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl InProcess {
    /// Starts serving `args.repo` with `backends`; returns once every
    /// listener listens.
    pub fn start(args: ServeArgs, backends: Vec<Arc<dyn Backend>>, workers: usize) -> anyhow::Result<InProcess> {
        anyhow::ensure!(args.repo.is_some(), "an in-process server needs --repo");
        let repo = Repo::open(&args)?;
        let (control, access) = access(&args)?;
        check_repository(&repo, &control)?;
        let decisions = decisions(&args, &repo.state_root)?;
        let guards = Guards::read(&args)?;
        baton_core::run::executor::start_spawner();
        let app = app(&repo, &args, backends, decisions, guards);
        let _ = app.operations_held.set(access.holder());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (listening, addresses) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name("baton-in-process".into()).spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers.max(1))
                .enable_all()
                .build()
                .context("starting the runtime")?;
            let stop = Trigger::Stop(Box::pin(async move {
                let _ = stopped.await;
            }));
            let result =
                runtime.block_on(serve(app, args, (None, Passed::default()), control, access, stop, move |bound| {
                    let _ = listening.send(*bound);
                }));
            runtime.shutdown_background();
            result
        })?;
        if let Ok(bound) = addresses.recv() {
            return Ok(InProcess { bound, http: bound.http, grpc: bound.grpc, stop: Some(stop), thread: Some(thread) });
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

type Served = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

async fn serve(
    app: Arc<App>,
    args: ServeArgs,
    (target, passed): (Option<upgrade::Target>, Passed),
    control: Control,
    access: Arc<Access>,
    trigger: Trigger,
    listening: impl FnOnce(&Bound),
) -> anyhow::Result<()> {
    // Until the old process hands it the service, a stop of this one is
    // its own: it tells systemd nothing.
    app.set_awaiting_handover(target.is_some());
    let listeners = listeners::open(&args, passed).await?;
    // Only `baton serve` replaces itself: a server embedded in another
    // program would start that program again and stop it whole.
    if matches!(trigger, Trigger::Signals) {
        match listeners.copies().and_then(upgrade::Source::new) {
            Ok(source) => {
                let _ = app.upgrade.set(Arc::new(source));
                if let Some(usr2) = upgrade::install_signal() {
                    tokio::spawn(upgrade::on_signal(Arc::clone(&app), usr2));
                }
            }
            Err(error) => tracing::warn!(%error, "This server cannot replace itself: upgrades are refused."),
        }
    }
    let ((listener, address), (grpc_listener, grpc_address)) = (listeners.http, listeners.grpc);
    let (admin_http, admin_grpc) = (listeners.admin_http, listeners.admin_grpc);
    // Installed before the addresses are announced: from then on a signal
    // starts the shutdown sequence instead of killing the process.
    let signals = match trigger {
        Trigger::Signals => Some(shutdown::Signals::install()?),
        Trigger::Stop(_) => None,
    };
    if signals.is_some() {
        // Handled from now on: those that came meanwhile are delivered.
        shutdown::hold_signals(false);
    }
    // Subscribed before the first load starts, so every load is counted.
    tokio::spawn(feed_metrics(Arc::clone(&app), app.registry.subscribe()));
    if app.registry.source().store_answer().is_some() {
        tokio::spawn(repo::announce_store(Arc::clone(&app), args.poll_interval()));
    }
    // In a fleet, etcd keeps what serves; the state file is left alone.
    let in_fleet = args.cluster.cluster.is_some();
    if !in_fleet {
        tokio::spawn(crate::decisions::journal::follow(Arc::clone(&app), app.registry.subscribe()));
    }

    let (stop_watching, stop) = std::sync::mpsc::channel::<()>();
    let watcher_app = Arc::clone(&app);
    let poll = args.poll_interval();
    let (polls, at_start) = (control.polls(), control.at_start.clone());
    let explicit = control.mode == crate::access::ModelControl::Explicit;
    let missing_polls = args.missing_polls;
    let repository = args.repo.as_ref().map_or_else(|| "(the demo repository)".to_owned(), |r| r.display().to_string());
    let watcher = std::thread::Builder::new().name("baton-poll".into()).spawn(move || {
        // In explicit mode, models an operator's decision keeps serving
        // load again beside the ones named.
        let restore = watcher_app.decisions.all().into_iter().filter(|(_, d)| d.kind != Kind::Unload).map(|(m, _)| m);
        let restore = restore.collect();
        if in_fleet {
            // The fleet's participant loads what the fleet committed.
            return;
        }
        let mut watcher = watch::Watcher::new(watcher_app, missing_polls).polling(polls).repository(repository);
        watcher = watcher.explicit(explicit);
        if let Some(models) = at_start {
            watcher = watcher.only(models).restore(restore);
        }
        watcher.scan();
        if polls {
            watcher.run(poll, &stop);
        }
    })?;

    let bound = Bound {
        http: address,
        grpc: grpc_address,
        admin_http: admin_http.as_ref().map(|(_, a)| *a),
        admin_grpc: admin_grpc.as_ref().map(|(_, a)| *a),
    };
    let handed = target.as_ref().map(|t| t.fleet.clone());
    if let Some(health) = crate::cluster::start(&app, &args.cluster, format!("http://{address}"), handed) {
        let _ = app.cluster.set(health);
    }
    listening(&bound);
    tracing::info!(
        %address,
        %grpc_address,
        admin_http = bound.admin_http.map(tracing::field::display),
        admin_grpc = bound.admin_grpc.map(tracing::field::display),
        model_control = control.mode.as_str(),
        admin_token = args.admin_token_file.is_some(),
        "baton is serving."
    );
    let delay = args.shutdown_delay;
    match (signals, trigger) {
        (Some(signals), _) => {
            tokio::spawn(shutdown::on_signals(signals, Arc::clone(&app), delay, stop_watching));
        }
        (None, Trigger::Stop(stopped)) => {
            tokio::spawn(shutdown::on_stop(stopped, Arc::clone(&app), delay, stop_watching));
        }
        (None, Trigger::Signals) => unreachable!("signal handlers are installed for Trigger::Signals"),
    }

    // Replacing a running server: it accepts until this one is ready, and
    // has loaded the versions it keeps for rollback.
    if let Some(target) = &target {
        let ready = match target.await_ready(&app).await {
            Ok(()) => target.keep(&app).await,
            Err(error) => Err(error),
        };
        match ready {
            Ok(()) => {}
            // The old server gave up on this one (it sends SIGTERM, then
            // shuts the channel), or an operator stopped it: a clean exit,
            // loads still running left behind.
            Err(stopped @ (upgrade::NotReady::Stopped | upgrade::NotReady::OldGone)) if !target.cold => {
                tracing::info!(why = %stopped, "Stopped before it was ready: the server it was to replace serves on.");
                return Ok(());
            }
            // After a cold handover there is no old server to fall back
            // on: this one serves, not ready, as any start whose load failed.
            Err(error) if target.cold => tracing::warn!(%error, "Serving though not ready."),
            Err(error) => return Err(anyhow::anyhow!("taking over from the running server: {error}")),
        }
    }
    let limits = conn::limits(&args, 2 + usize::from(admin_http.is_some()) + usize::from(admin_grpc.is_some()));
    let bounded = |listener, name, protocol| {
        conn::Bounded::new(listener, name, protocol, limits, app.metrics.connections.listener(name))
    };
    let (http1, http2) = (conn::Protocol::Http1, conn::Protocol::Http2);
    let [http, grpc, admin_http_name, admin_grpc_name] = listeners::NAMES;
    let mut servers: Vec<Served> = vec![
        Box::pin(serve_http(
            Arc::clone(&app),
            bounded((listener, address), http, http1),
            Arc::clone(&access),
            Listener::Inference,
        )),
        Box::pin(serve_grpc(
            Arc::clone(&app),
            bounded((grpc_listener, grpc_address), grpc, http2),
            Arc::clone(&access),
            Listener::Inference,
        )),
    ];
    if let Some(admin) = admin_http {
        let admin = bounded(admin, admin_http_name, http1);
        servers.push(Box::pin(serve_http(Arc::clone(&app), admin, Arc::clone(&access), Listener::Admin)));
    }
    if let Some(admin) = admin_grpc {
        let admin = bounded(admin, admin_grpc_name, http2);
        servers.push(Box::pin(serve_grpc(Arc::clone(&app), admin, Arc::clone(&access), Listener::Admin)));
    }
    let servers = async { futures_util::future::try_join_all(servers).await.map(drop) };
    if let Some(target) = &target {
        // Ready; the old server commits (or gave up meanwhile: its deadline
        // passed). Nothing of the replica's is taken before its answer.
        if let Err(stopped) = target.commit(&app).await {
            tracing::info!(why = %stopped, "Stopped before it took over: the server it was to replace serves on.");
            return Ok(());
        }
        app.set_awaiting_handover(false);
        // The lease is this process's own from now on, and it acts for
        // the replica: registers, acks, coordinates.
        if let Some(health) = app.cluster.get() {
            health.own_lease();
        }
    }
    // After the commit: systemd follows this process from then on.
    tokio::spawn(notify::when_ready(Arc::clone(&app), target.is_some()));
    let grace = args.shutdown_timeout;
    shutdown::drain(&app, servers, watcher, grace).await?;
    tracing::info!("baton stopped.");
    Ok(())
}

/// Serves REST on `listener` until the app starts draining, then finishes
/// the requests in flight.
async fn serve_http(app: Arc<App>, listener: conn::Bounded, access: Arc<Access>, role: Listener) -> anyhow::Result<()> {
    // Draining stops accepting, answers with `Connection: close`, and
    // closes idle connections a moment later (see closing.rs).
    let stopped = app.shutdown_signal();
    let draining = stopped.clone();
    let router = crate::http::router(app, access, role).layer(axum::middleware::map_response(move |response| {
        let draining = *draining.borrow();
        async move { closing::close_when_draining(draining, response) }
    }));
    conn::http1::serve(closing::UntilDraining::new(listener, stopped.clone()), router, closing::idle_closed(stopped))
        .await;
    Ok(())
}

/// Serves gRPC on `listener` until the app starts draining, then finishes
/// the RPCs in flight.
async fn serve_grpc(app: Arc<App>, listener: conn::Bounded, access: Arc<Access>, role: Listener) -> anyhow::Result<()> {
    crate::grpc::serve(app, listener, access, role).await.context("serving gRPC")
}

async fn feed_metrics(app: Arc<App>, mut events: baton_core::registry::events::EventReceiver) {
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

    use baton_core::threads::step_aside::StepAside;
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
    fn request_bounds_take_units_and_have_defaults() {
        let defaults = parse(&[]).limits();
        assert_eq!(defaults, crate::app::ServerLimits::default());
        let args = ["--max-request-bytes", "1MiB", "--request-memory-budget", "2GiB", "--request-timeout", "250ms"];
        let limits = parse(&args).limits();
        assert_eq!((limits.max_request_bytes, limits.memory_budget), (1 << 20, 2 << 30));
        assert_eq!(limits.request_timeout, Some(Duration::from_millis(250)));
        assert_eq!(parse(&["--request-timeout", "0"]).limits().request_timeout, None);
        assert_eq!(parse(&["--max-request-bytes", "4096"]).max_request_bytes, 4096);
        assert_eq!(parse(&[]).memory_budget, None, "no load memory budget unless asked for");
        assert_eq!(parse(&["--memory-budget", "6GiB"]).memory_budget, Some(6 << 30));
        assert_eq!(parse(&["--memory-budget", "1048576"]).memory_budget, Some(1 << 20));
        assert!(Cli::try_parse_from(["baton", "--memory-budget", "6GB"]).is_err());
        for bad in [["--request-timeout", "30"], ["--request-memory-budget", "1MB"], ["--max-request-bytes", "x"]] {
            assert!(Cli::try_parse_from(std::iter::once("baton").chain(bad)).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_zero_timeout_in_any_unit_is_none_and_a_huge_one_is_refused() {
        for zero in ["0", "0s", "0ms", " 0s "] {
            let args = parse(&["--header-read-timeout", zero, "--idle-timeout", zero, "--request-timeout", zero]);
            assert_eq!(args.header_read_timeout.0, None, "--header-read-timeout {zero}");
            assert_eq!(args.idle_timeout.0, None, "--idle-timeout {zero}");
            assert_eq!(args.request_timeout.0, None, "--request-timeout {zero}");
        }
        assert_eq!(parse(&["--idle-timeout", "86400s"]).idle_timeout.0, Some(Duration::from_secs(86_400)));
        for huge in ["86401s", "86400001ms", "18446744073709551615s", "99999999999999999999s"] {
            for flag in ["--header-read-timeout", "--idle-timeout", "--request-timeout", "--prometheus-timeout"] {
                let error = Cli::try_parse_from(["baton", flag, huge]).err();
                assert!(error.is_some(), "{flag} {huge} was accepted");
            }
        }
        assert!(Cli::try_parse_from(["baton", "--prometheus-timeout", "0s"]).is_err(), "a zero query timeout");
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
    fn model_control_defaults_to_polling_and_no_poll_is_explicit_with_every_model() {
        assert_eq!(control(&[]).unwrap(), Control { mode: ModelControl::Poll, at_start: None });
        assert!(control(&[]).unwrap().polls());
        let none = control(&["--model-control", "none"]).unwrap();
        assert_eq!((none.polls(), none), (false, Control { mode: ModelControl::None, at_start: None }));
        let no_poll = control(&["--no-poll"]).unwrap();
        assert_eq!((no_poll.polls(), no_poll), (false, Control { mode: ModelControl::Explicit, at_start: None }));
        assert_eq!(control(&["--no-poll", "--load-model", "a"]).unwrap().at_start, named(&["a"]));
        assert!(Cli::try_parse_from(["baton", "--no-poll", "--model-control", "poll"]).is_err());
        // The older spelling is still taken.
        assert_eq!(control(&["--no-watch"]).unwrap(), Control { mode: ModelControl::Explicit, at_start: None });
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
