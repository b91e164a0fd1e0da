//! `baton agent`: the sidecar agent. It takes part in a fleet on behalf of
//! another KServe V2 server with the model-repository extension (a baton
//! without cluster mode, MLServer, Triton) that reads its models from a
//! directory the agent can write: it stages and verifies each candidate
//! beside that repository, puts it into place and has the server load it.
//! See docs/fleet.md ("The sidecar agent") for what this gives and what it cannot.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use baton_cluster::{Health, Participant, SidecarConfig, SidecarNode, TargetLayout};
use baton_core::files::source::{LocalRepository, Source};
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};

use crate::access::{Token, bearer};
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
    /// Where candidates are staged: outside the target's repository (where
    /// the server does not look), on its file system. Defaults to
    /// <target-repo>.baton-staging, beside the repository.
    #[arg(long = "staging-dir", alias = "staging", value_name = "DIR")]
    pub staging: Option<PathBuf>,
    /// A file holding the bearer token for the target's load calls. A
    /// secret is never taken from the command line.
    #[arg(long, value_name = "FILE", env = "BATON_TARGET_TOKEN_FILE")]
    pub target_token_file: Option<PathBuf>,
    /// The form of the log on stderr: `text` (lines for people, coloured
    /// only on a terminal) or `json` (one JSON object per line, for log
    /// shippers).
    #[arg(long, value_enum, default_value_t = crate::logging::LogFormat::Text)]
    pub log_format: crate::logging::LogFormat,
    /// How long one load by the target may take, readiness included, e.g.
    /// 10m, 90s.
    #[arg(long, default_value = "10m", value_parser = baton_drill::args::parse_duration, value_name = "DURATION")]
    pub load_timeout: Duration,
    /// The same in seconds: the older spelling of --load-timeout, still taken.
    #[arg(long, hide = true, conflicts_with = "load_timeout", value_name = "SECONDS")]
    pub load_timeout_s: Option<u64>,
    /// Serve the agent's health and state on this address
    /// (/v2/health/live, /v2/health/ready, /baton/v1/agent).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// A file holding the token /baton/v1/agent asks for (`Authorization:
    /// Bearer`). Without one, that endpoint answers loopback callers only;
    /// the health endpoints are open either way.
    #[arg(long, value_name = "FILE", env = "BATON_AGENT_TOKEN_FILE")]
    pub http_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// What the health endpoint reads.
struct Shared {
    node: Arc<SidecarNode>,
    health: Arc<Health>,
    id: String,
    target: String,
    /// What `/baton/v1/agent` asks for; none: loopback callers only.
    token: Option<Token>,
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
    let http_token = args
        .http_token_file
        .as_deref()
        .map(crate::access::read_token_file)
        .transpose()
        .context("reading the token of the agent's state endpoint")?
        .map(|t| Token::new(&t));
    let node = Arc::new(
        SidecarNode::new(SidecarConfig {
            source,
            specs,
            target_repo: args.target_repo.clone(),
            staging: args.staging.clone(),
            target_url: args.target.clone(),
            target_token,
            layout: args.target_kind,
            load_timeout: args.load_timeout_s.map_or(args.load_timeout, Duration::from_secs),
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?,
    );
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
            token: http_token,
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
        let service = router.into_make_service_with_connect_info::<SocketAddr>();
        if let Err(error) = axum::serve(listener, service).await {
            tracing::error!(%error, "The agent's health listener stopped.");
        }
    });
    Ok(())
}

/// Ready once the target serves what the fleet committed.
async fn ready(State(shared): State<Arc<Shared>>) -> StatusCode {
    if shared.node.readiness().is_some() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
}

/// The agent's part in the fleet and what it put into place, its errors
/// included: to a caller with the token, or, without one configured, to a
/// loopback caller.
async fn state(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> (StatusCode, Json<Value>) {
    if let Err(refused) = allowed(shared.token.as_ref(), peer, headers.get(AUTHORIZATION).map(|v| v.as_bytes())) {
        return refused;
    }
    let state = json!({
        "replica": shared.id,
        "target": shared.target,
        "ready": shared.node.readiness().is_some(),
        "models": shared.node.placed_models(),
        "fleet": shared.health.state(),
    });
    (StatusCode::OK, Json(state))
}

/// Whether a caller at `peer` presenting `authorization` may read the
/// agent's state, else the refusal to answer.
fn allowed(
    token: Option<&Token>,
    peer: SocketAddr,
    authorization: Option<&[u8]>,
) -> Result<(), (StatusCode, Json<Value>)> {
    let refuse = |status: StatusCode, kind: &str, message: &str| {
        tracing::warn!(%peer, kind, "Refused a request for the agent's state.");
        Err((status, Json(json!({ "error": message, "kind": kind }))))
    };
    match token {
        Some(token) => {
            let presented = authorization.and_then(bearer);
            if presented.is_some_and(|p| token.matches(p)) {
                Ok(())
            } else if presented.is_some() {
                refuse(StatusCode::UNAUTHORIZED, "unauthorized", "the bearer token is not the agent's token")
            } else {
                refuse(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "the agent's state needs its token: send 'Authorization: Bearer <token>' with the token of \
                     the agent's --http-token-file",
                )
            }
        }
        None if peer.ip().to_canonical().is_loopback() => Ok(()),
        None => refuse(
            StatusCode::FORBIDDEN,
            "loopback_only",
            "the agent's state is served to loopback callers only: start the agent with --http-token-file to \
             serve it to others who present the token",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_needs_the_token_when_there_is_one_and_loopback_when_not() {
        let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5000".parse().unwrap();
        let remote: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        assert!(allowed(None, local, None).is_ok());
        assert!(allowed(None, mapped, None).is_ok());
        let refused = allowed(None, remote, None).unwrap_err();
        assert_eq!(refused.0, StatusCode::FORBIDDEN);
        assert!(refused.1["error"].as_str().unwrap().contains("--http-token-file"));
        let token = Token::new("t0ken");
        for peer in [local, remote] {
            assert_eq!(allowed(Some(&token), peer, None).unwrap_err().0, StatusCode::UNAUTHORIZED);
            assert_eq!(allowed(Some(&token), peer, Some(b"Bearer other")).unwrap_err().0, StatusCode::UNAUTHORIZED);
            assert!(allowed(Some(&token), peer, Some(b"Bearer t0ken")).is_ok());
        }
    }
}
