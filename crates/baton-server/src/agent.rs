//! `baton agent`: the sidecar agent. It takes part in a fleet on behalf of
//! another KServe V2 server with the model-repository extension (a baton
//! without cluster mode, MLServer, Triton) that reads its models from a
//! directory the agent can write: it stages and verifies each candidate
//! beside that repository, puts it into place and has the server load it.
//! See docs/fleet.md ("The sidecar agent") for what this gives and what it cannot.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use baton_cluster::{Health, Participant, SidecarConfig, SidecarNode, TargetLayout};
use baton_core::source::{LocalRepository, Source};
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};

use crate::cluster::ClusterArgs;
use crate::serve::repo::{StoreCache, open_store};

/// The options of `baton agent`.
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// The target server's REST address, e.g. http://127.0.0.1:8080.
    #[arg(long, value_name = "URL")]
    pub target: String,
    /// The target server's model repository: the agent puts versions there.
    #[arg(long, value_name = "DIR")]
    pub target_repo: PathBuf,
    /// What the target is, which decides the layout of its repository.
    #[arg(long, value_name = "KIND", value_parser = TargetLayout::parse)]
    pub target_kind: TargetLayout,
    /// Where versions are published, in baton's layout (model.toml,
    /// <version>/ with a MANIFEST): a directory, or an object store
    /// (`s3://bucket/prefix` and the like) read through `--cache-dir`.
    #[arg(long, value_name = "DIR|URL")]
    pub source_repo: PathBuf,
    /// Where versions fetched from an object store source are kept.
    #[arg(long, value_name = "DIR", default_value = ".baton/cache")]
    pub cache_dir: PathBuf,
    /// Where candidates are staged; on the target repository's file system.
    /// Defaults to <target-repo>/.baton-agent.
    #[arg(long, value_name = "DIR")]
    pub staging: Option<PathBuf>,
    /// A file holding the bearer token for the target's load calls. A
    /// secret is never taken from the command line.
    #[arg(long, value_name = "FILE", env = "BATON_TARGET_TOKEN_FILE")]
    pub target_token_file: Option<PathBuf>,
    /// How long one load by the target may take, readiness included, in
    /// seconds.
    #[arg(long, default_value_t = 600)]
    pub load_timeout_s: u64,
    /// Serve the agent's health and state on this address
    /// (/v2/health/live, /v2/health/ready, /baton/v1/agent).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// What the health endpoint reads.
struct Shared {
    node: Arc<SidecarNode>,
    health: Arc<Health>,
    id: String,
    target: String,
}

/// Runs the agent until SIGTERM or SIGINT.
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    let cluster = args.cluster.cluster.clone().context("baton agent needs --cluster etcd://HOST:PORT")?;
    args.cluster.checked_store()?;
    let target_token = args
        .target_token_file
        .as_deref()
        .map(crate::access::read_token_file)
        .transpose()
        .context("reading the target's token")?;
    let source_text = args.source_repo.to_string_lossy().into_owned();
    let (source, specs): (Arc<dyn Source>, PathBuf) = if baton_store::is_store_url(&source_text) {
        let cache =
            StoreCache { dir: &args.cache_dir, max_bytes: None, poll: Duration::from_secs(1), nice: 10, idle: false };
        (open_store(&source_text, &cache)?, args.cache_dir.clone())
    } else {
        anyhow::ensure!(
            args.source_repo.is_dir(),
            "the source repository {} is not a directory",
            args.source_repo.display()
        );
        (Arc::new(LocalRepository::new(&args.source_repo)), args.source_repo.clone())
    };
    anyhow::ensure!(
        args.target_repo.is_dir(),
        "the target repository {} is not a directory",
        args.target_repo.display()
    );
    let node = Arc::new(SidecarNode::new(SidecarConfig {
        source,
        specs,
        target_repo: args.target_repo.clone(),
        staging: args.staging.clone(),
        target_url: args.target.clone(),
        target_token,
        layout: args.target_kind,
        load_timeout: Duration::from_secs(args.load_timeout_s),
    }));
    let config = args.cluster.replica(&cluster, args.target.clone(), true);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(async move {
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let health = Arc::new(Health::default());
        let shared = Arc::new(Shared {
            node: Arc::clone(&node),
            health: Arc::clone(&health),
            id: config.id.clone(),
            target: args.target.clone(),
        });
        if let Some(address) = &args.http {
            serve_health(address, shared).await?;
        }
        tracing::info!(
            replica = %config.id,
            cluster = %config.name,
            target = %args.target,
            kind = args.target_kind.as_str(),
            "The agent takes part in the fleet for its target server."
        );
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let participant = tokio::spawn(Participant::new(config, node, health).run(stopped));
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "Leaving the fleet.");
        let _ = stop.send(true);
        participant.await.context("the participant ended abnormally")
    })
}

/// Binds `address`, prints it, and serves the agent's health from a task.
async fn serve_health(address: &str, shared: Arc<Shared>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await.with_context(|| format!("binding {address}"))?;
    let bound = listener.local_addr().context("reading the bound address")?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "Listening on http://{bound} (baton agent health).");
        let _ = out.flush();
    }
    let router = axum::Router::new()
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(ready))
        .route("/baton/v1/agent", get(state))
        .with_state(shared);
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::error!(%error, "The agent's health listener stopped.");
        }
    });
    Ok(())
}

/// Ready once the target serves what the fleet committed.
async fn ready(State(shared): State<Arc<Shared>>) -> StatusCode {
    if shared.node.readiness().is_some() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
}

/// The agent's part in the fleet and what it put into place.
async fn state(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(json!({
        "replica": shared.id,
        "target": shared.target,
        "ready": shared.node.readiness().is_some(),
        "models": shared.node.placed_models(),
        "fleet": shared.health.state(),
    }))
}
