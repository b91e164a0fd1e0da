//! The options of `baton serve`, and what they resolve to.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use baton_core::threads::step_aside::StepAside;

use crate::access::{Exposed, Listener, ModelControl};
use crate::app::ServerLimits;

use super::watch;

/// Options of `baton serve`. An option given twice takes its last value, so
/// wrappers can set defaults that their callers override.
#[derive(clap::Args, Debug)]
#[command(args_override_self = true)]
pub struct ServeArgs {
    /// The model repository. Without it, baton serves a demo repository it
    /// generates under .baton/demo.
    #[arg(long)]
    pub repo: Option<PathBuf>,
    /// Where versions fetched from an object store (`--repo s3://…`) are
    /// kept, and the state file with them unless `--state-dir` is given.
    #[arg(long, value_name = "DIR", default_value = ".baton/cache")]
    pub cache_dir: PathBuf,
    /// The most bytes of versions the cache keeps, e.g. 20GiB (none by
    /// default): the least recently used versions that do not serve are
    /// removed to make room, and a fetch the serving ones leave no room for
    /// is refused.
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub cache_max_bytes: Option<u64>,
    /// Address of the KServe V2 REST API (Triton's port, so habits carry over).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub http: SocketAddr,
    /// Address of the KServe V2 gRPC API (Triton's port).
    #[arg(long, default_value = "127.0.0.1:8001")]
    pub grpc: SocketAddr,
    /// Do not poll the repository: the same as `--model-control explicit`
    /// with every model (or only the `--load-model` ones) loaded at start.
    /// (`--no-watch`, its older spelling, is still taken.)
    #[arg(long, alias = "no-watch")]
    pub no_poll: bool,
    /// How often the repository is polled, e.g. 1s, 500ms (at least 10ms).
    #[arg(long, default_value = "1s", value_parser = parse_interval, value_name = "DURATION")]
    pub poll: Duration,
    /// The same in milliseconds: the older spelling of --poll, still
    /// taken; when given, it wins over --poll.
    #[arg(long, hide = true, value_name = "MS")]
    pub poll_ms: Option<u64>,
    /// Polls in a row a model directory (or `model.toml`) or a kept
    /// version must be found missing ("no such file") before the
    /// repository poller unloads or retires it. Other errors reading the repository never
    /// count: they change nothing.
    #[arg(long, default_value_t = watch::MISSING_POLLS, value_parser = clap::value_parser!(u32).range(1..))]
    pub missing_polls: u32,
    /// How long shutdown waits, e.g. 30s, once the listeners have closed,
    /// for requests in flight and operations running on models; past it
    /// baton exits without them. (A bare number is seconds.)
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub shutdown_timeout: Duration,
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
    /// The form of the log on stderr: `text` (lines for people, coloured
    /// only on a terminal) or `json` (one JSON object per line, for log
    /// shippers).
    #[arg(long, value_enum, default_value_t = crate::logging::LogFormat::Text)]
    pub log_format: crate::logging::LogFormat,
    /// What `/v2/health/ready` waits for: `servable` (ready once every
    /// model that can serve does; a model whose every version is refused
    /// is not waited for, while the server serves at least one model) or
    /// `all` (every model must serve).
    #[arg(long, value_enum, default_value_t = crate::readiness::Readiness::Servable)]
    pub readiness: crate::readiness::Readiness,
    /// How models come and go, as in Triton: `poll` loads every model at
    /// start and polls the repository, `explicit` loads only the
    /// `--load-model` models at start and does not poll, `none` loads every
    /// model at start, does not poll and refuses the API's model operations.
    /// In `poll` and `explicit` the API loads, unloads, rolls back, retires.
    #[arg(long, value_enum, default_value_t = ModelControl::Poll, conflicts_with = "no_poll")]
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
    /// On SIGTERM, how long to keep serving and accepting, e.g. 10s, after
    /// turning not ready, before closing the listeners: time for load
    /// balancers (a Kubernetes Service's endpoints) to stop sending
    /// traffic. (A bare number is seconds.)
    #[arg(long, default_value = "0s", value_parser = parse_duration, value_name = "DURATION")]
    pub shutdown_delay: Duration,
    /// Inference requests the server holds at once, from arrival to answer;
    /// more are refused at once (503, gRPC UNAVAILABLE).
    #[arg(long, default_value_t = 1024)]
    pub max_in_flight: usize,
    /// Bytes that request bodies, decoded tensors and outputs may hold at
    /// once, e.g. 512MiB or 2GiB; a request that does not fit waits up to
    /// 100 ms, then is refused (503, gRPC UNAVAILABLE).
    #[arg(long, default_value = "512MiB", value_parser = parse_bytes)]
    pub request_memory_budget: u64,
    /// The most memory every model's loaded versions may hold together,
    /// e.g. 2GiB or 6GiB (none by default): a load that would go beyond it
    /// is refused at its load stage, and the serving version keeps serving.
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub memory_budget: Option<u64>,
    /// The Prometheus that rollouts' metric guards query, e.g.
    /// http://127.0.0.1:9090 (none by default: a rollout with metric guards
    /// is then refused). Credentials in it (http://user:password@host) are
    /// sent as basic authentication and never shown.
    #[arg(long, value_name = "URL")]
    pub prometheus_url: Option<String>,
    /// How long one metric guard query may take, e.g. 2s or 500ms; a query
    /// that takes longer makes its window inconclusive.
    #[arg(long, default_value = "2s", value_parser = parse_positive_timeout)]
    pub prometheus_timeout: Timeout,
    /// A file holding the token that posting outcomes
    /// (`POST /baton/v1/models/{m}/outcomes`) needs, as `Authorization:
    /// Bearer <token>`, read once at start. Without it, whoever may ask for
    /// answers may post their outcomes, each of value at most 1 (a click);
    /// with it, values up to 1e12 (an order's amount).
    #[arg(long, value_name = "PATH")]
    pub outcomes_token_file: Option<PathBuf>,
    /// A file holding the secret key outcome ids are authenticated with
    /// (at least 16 characters; e.g. `head -c 32 /dev/urandom | base64`).
    /// Give every replica of a fleet the same file, so that each takes the
    /// outcome ids the others issued. Without it, a random key is drawn at
    /// start.
    #[arg(long, value_name = "PATH")]
    pub outcomes_key_file: Option<PathBuf>,
    /// The deadline of a request whose client sets none, e.g. 30s or
    /// 500ms; 0 for none.
    #[arg(long, default_value = "30s", value_parser = parse_timeout)]
    pub request_timeout: Timeout,
    /// How long a client has to send a request's head once it connects
    /// (and, for a later request on the connection, once the head's first
    /// byte arrives); over gRPC, how long it has to finish its HTTP/2
    /// handshake and open its first stream. Past it the connection is
    /// closed. E.g. 10s or 500ms; 0 for none (the idle timeout then
    /// applies).
    #[arg(long, default_value = "10s", value_parser = parse_timeout)]
    pub header_read_timeout: Timeout,
    /// How long a request's body may take to arrive, counted from its
    /// head (over gRPC: a unary call's message from the call's start, a
    /// streamed message from its first byte). Past it the request is
    /// refused (408, gRPC DEADLINE_EXCEEDED; kind `body_timeout`) and what
    /// it held is freed. E.g. 30s; 0 for none.
    #[arg(long, default_value = "30s", value_parser = parse_timeout)]
    pub body_read_timeout: Timeout,
    /// How long writing to a client may make no progress (the client
    /// reads nothing) before the connection is closed, e.g. 30s; 0 for
    /// never.
    #[arg(long, default_value = "30s", value_parser = parse_timeout)]
    pub send_timeout: Timeout,
    /// How long a connection may stay open with no request in flight
    /// before the server closes it, e.g. 120s; 0 for never.
    #[arg(long, default_value = "120s", value_parser = parse_timeout)]
    pub idle_timeout: Timeout,
    /// Connections each listener holds at once; more wait, unaccepted, in
    /// the kernel's queue until one closes. Lowered at start so that every
    /// listener at its bound still leaves descriptors for the server's own
    /// files (see docs/api.md, "Connections").
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
    /// Keep operators' decisions (rollbacks, loads of older versions,
    /// unloads, pins) in DIR/state.json instead of the repository's
    /// .baton-state.json: for a repository baton cannot write to.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Taking part in a fleet.
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterArgs,
}

/// How models come and go, resolved from `--model-control`, `--load-model`
/// and `--no-poll`.
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

/// A `--request-timeout`: a duration, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeout(pub Option<Duration>);

pub use baton_core::human::bytes::parse as parse_bytes;
pub use baton_drill::args::parse_duration;

/// [`parse_bytes`], for a size held in a `usize`.
pub fn parse_usize_bytes(text: &str) -> Result<usize, String> {
    usize::try_from(parse_bytes(text)?).map_err(|_| format!("'{text}' is too large"))
}

/// Parses a timeout that must be more than 0: a number with `ms` or `s`.
pub fn parse_positive_timeout(text: &str) -> Result<Timeout, String> {
    match parse_timeout(text)? {
        Timeout(Some(timeout)) if !timeout.is_zero() => Ok(Timeout(Some(timeout))),
        _ => Err(format!("'{text}' must be more than 0")),
    }
}

/// The longest timeout a flag takes: one day. Longer ones are refused at
/// parse time rather than overflowing a deadline later.
pub const LONGEST_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Parses a timeout: a number with `ms`, `s` or `m` (the spelling of
/// every duration flag), at most a day; zero (`0`, `0s`, `0ms`) for none.
/// A bare number other than 0 is refused: these flags never took one.
pub fn parse_timeout(text: &str) -> Result<Timeout, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Timeout(None));
    }
    if !text.ends_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(format!("'{text}' needs a unit, ms, s or m (or is 0 for none)"));
    }
    let timeout = parse_duration(text)?;
    if timeout > LONGEST_TIMEOUT {
        return Err(format!("'{text}' is longer than a day (86400s), the longest timeout taken"));
    }
    Ok(Timeout((!timeout.is_zero()).then_some(timeout)))
}

/// Parses `--poll`: a duration with its unit. A bare number is refused,
/// since the flag it replaces, `--poll-ms`, took milliseconds: `--poll
/// 500` would otherwise poll every eight minutes.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if !text.ends_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(format!("'{text}' needs a unit, e.g. 500ms or 2s (--poll-ms takes milliseconds)"));
    }
    parse_duration(text)
}

impl ServeArgs {
    /// How often the repository is polled: --poll, or --poll-ms, at least 10 ms.
    pub fn poll_interval(&self) -> Duration {
        self.poll_ms.map_or(self.poll, Duration::from_millis).max(Duration::from_millis(10))
    }

    /// The model control the flags ask for. `--no-poll` is explicit control
    /// with every model loaded at start, unless `--load-model` names some.
    pub fn control(&self) -> anyhow::Result<Control> {
        let mode = if self.no_poll { ModelControl::Explicit } else { self.model_control };
        let named = !self.load_model.is_empty();
        anyhow::ensure!(
            mode == ModelControl::Explicit || !named,
            "--load-model applies to --model-control explicit only (with {} every model loads at start)",
            mode.as_str()
        );
        let all =
            mode != ModelControl::Explicit || self.load_model.iter().any(|m| m == "*") || (self.no_poll && !named);
        Ok(Control { mode, at_start: (!all).then(|| self.load_model.iter().cloned().collect()) })
    }

    /// The listeners that serve management operations: the admin ones when
    /// there are any, else the inference ones.
    pub(super) fn management_listeners(&self) -> Vec<Exposed<'static>> {
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
            body_read_timeout: self.body_read_timeout.0,
            outcome_value_max: match self.outcomes_token_file {
                Some(_) => baton_core::rollout::outcome::MAX_VALUE,
                None => crate::app::OPEN_OUTCOME_VALUE_MAX,
            },
        }
    }

    /// The state file that keeps operators' decisions.
    pub fn state_file(&self, root: &std::path::Path) -> PathBuf {
        match &self.state_dir {
            Some(dir) => dir.join(crate::decisions::file::IN_STATE_DIR),
            None => root.join(crate::decisions::file::IN_REPOSITORY),
        }
    }

    /// The key outcome ids are authenticated with: the contents of
    /// `--outcomes-key-file` (trimmed), or random bytes from the operating
    /// system. The key itself never appears in an error.
    pub fn outcome_key(&self) -> anyhow::Result<baton_core::rollout::outcome::OutcomeKey> {
        use baton_core::rollout::outcome::OutcomeKey;
        let Some(path) = &self.outcomes_key_file else {
            return OutcomeKey::random().map_err(|e| anyhow::anyhow!("drawing the outcome ids' key: {e}"));
        };
        let bytes =
            std::fs::read(path).map_err(|e| anyhow::anyhow!("reading --outcomes-key-file {}: {e}", path.display()))?;
        let key = bytes.trim_ascii();
        anyhow::ensure!(
            key.len() >= 16,
            "--outcomes-key-file {} holds {} characters; a key needs at least 16 (e.g. head -c 32 /dev/urandom | base64)",
            path.display(),
            key.len()
        );
        Ok(OutcomeKey::new(key))
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
