//! The options of `baton drill`, and the parsers of their values.

use std::path::PathBuf;
use std::time::Duration;

/// How requests travel.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// KServe V2 REST with the binary tensor data extension (inputs and outputs binary).
    HttpBinary,
    /// KServe V2 REST, tensors as JSON.
    HttpJson,
    /// KServe V2 gRPC (`inference.GRPCInferenceService/ModelInfer`), at --grpc-url.
    Grpc,
}

/// How each swap is made.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SwapMethod {
    /// `POST /v2/repository/models/{m}/load` (baton, Triton), with
    /// `{"parameters":{"version":"V"}}` when --versions is given.
    LoadApi,
    /// Copy --template to `<repo>/<model>/<next number>` and write its MANIFEST last.
    Publish,
    /// Run --command with `sh -c`.
    Command,
    /// Replace baton's process with a new one of its executable as on
    /// disk (`POST /baton/v1/upgrade`); a swap is done once the old
    /// process has exited. The
    /// memory sampled (--pid, or the server's own pid by default) follows
    /// the new process.
    Upgrade,
    /// One rollout through baton's rollout API (`POST
    /// /baton/v1/models/{m}/rollout`), followed until it ends; --swaps
    /// does not apply.
    Rollout,
}

/// How a rollout's candidate takes part in traffic.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RolloutMode {
    /// The candidate answers a rising share of requests.
    Canary,
    /// The candidate answers a fixed share; an operator promotes.
    Ab,
    /// The candidate runs beside the stable version; the stable one answers.
    Shadow,
}

/// Options of `baton drill`.
#[derive(clap::Args, Debug, Clone)]
pub struct DrillArgs {
    /// The model to drive.
    pub model: String,
    /// The server's REST address: inference (HTTP protocols), metadata and the load API.
    #[arg(long, env = "BATON_URL", default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// The REST address of the server's admin listener (`baton serve
    /// --admin-http`), where --swap load-api sends its loads; without it, --url.
    #[arg(long, env = "BATON_ADMIN_URL")]
    pub admin_url: Option<String>,
    /// A file holding the admin token, sent with --swap load-api's loads
    /// (the server's --admin-token-file). Without it, the token in
    /// BATON_TOKEN, if set.
    #[arg(long, env = "BATON_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// How requests travel.
    #[arg(long, value_enum, default_value = "http-binary")]
    pub protocol: Protocol,
    /// The server's gRPC address, for --protocol grpc.
    #[arg(long, default_value = "http://127.0.0.1:8001")]
    pub grpc_url: String,
    /// Send every request to this version (`/v2/models/{m}/versions/{v}/infer`).
    #[arg(long)]
    pub model_version: Option<String>,
    /// An input as NAME:DATATYPE:SHAPE, e.g. `input:FP32:1,8` (repeat for
    /// several). Without it, the inputs come from `GET /v2/models/{m}`.
    #[arg(long = "input", value_name = "NAME:DATATYPE:SHAPE")]
    pub inputs: Vec<String>,
    /// The size given to variable (-1) dimensions of inputs read from the metadata.
    #[arg(long, default_value_t = 1)]
    pub batch: i64,
    /// A KServe V2 JSON request body whose inputs are sent instead of generated ones.
    #[arg(long, value_name = "FILE", conflicts_with = "inputs")]
    pub request: Option<PathBuf>,
    /// Closed loop: this many workers, each sending its next request when
    /// the last one is answered (the default, with 4 workers).
    #[arg(long, conflicts_with = "rate")]
    pub concurrency: Option<usize>,
    /// Open loop: this many requests per second, on a fixed schedule
    /// whatever the answers; latency counts from the scheduled time.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open loop: connections, and so the most requests in flight.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// The longest the load runs (e.g. 30s, 1500ms, 2m).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Stop after this many requests.
    #[arg(long)]
    pub max_requests: Option<u64>,
    /// A request not answered within this is a failure (kind `timeout`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Steady load before the first swap.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// How many swaps.
    #[arg(long, default_value_t = 3)]
    pub swaps: usize,
    /// How each swap is made.
    #[arg(long, value_enum, default_value = "load-api")]
    pub swap: SwapMethod,
    /// From one swap's trigger to the next one's (later if a swap's window has not ended).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub swap_interval: Duration,
    /// Steady load kept between one swap's window and the next trigger,
    /// however late the schedule runs: when swaps take longer than the
    /// interval, steady time then still comes between them rather than
    /// only before the first and after the last.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub swap_gap: Duration,
    /// Versions to swap to, in turn (swap k takes the k-th, cycling), e.g.
    /// 1,2. For load-api they are sent as the load's version; for command,
    /// `{version}`. Also the version each swap expects to serve.
    #[arg(long, value_delimiter = ',')]
    pub versions: Vec<String>,
    /// publish: the model repository the server polls.
    #[arg(long)]
    pub repo: Option<PathBuf>,
    /// publish: the version directory copied at each swap (default: the
    /// model's newest complete version in --repo).
    #[arg(long)]
    pub template: Option<PathBuf>,
    /// command: run with `sh -c` at each swap, placeholders filled:
    /// `{swap}` the swap number from 1 (also spelled n in braces),
    /// `{version}` the version from --versions, `{model}` the model, `{url}`
    /// the --url.
    #[arg(long)]
    pub command: Option<String>,
    /// rollout: the version rolled out (default: the repository's newest).
    #[arg(long, value_name = "V")]
    pub rollout_version: Option<u64>,
    /// rollout: the mode (default: the model's own `[rollout]` section).
    #[arg(long, value_enum)]
    pub rollout_mode: Option<RolloutMode>,
    /// rollout: the candidate's shares in percent, rising, e.g. 10,50,100.
    #[arg(long, value_delimiter = ',', value_name = "PERCENT,…")]
    pub rollout_steps: Vec<f64>,
    /// rollout: how long each window lasts before it is judged.
    #[arg(long, value_parser = parse_duration)]
    pub rollout_interval: Option<Duration>,
    /// rollout: failed windows that roll the candidate back.
    #[arg(long, value_name = "N")]
    pub rollout_failure_limit: Option<u32>,
    /// rollout: inconclusive windows in a row that pause the rollout.
    #[arg(long, value_name = "N")]
    pub rollout_max_inconclusive: Option<u32>,
    /// rollout: the guards, as the JSON object the start takes, e.g.
    /// '{"min_samples":20,"max_rel_l2":0.05}'.
    #[arg(long, value_name = "JSON")]
    pub rollout_guards: Option<String>,
    /// rollout: the longest the drill follows the rollout; it then stops
    /// following and leaves the rollout as it is.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub rollout_timeout: Duration,
    /// The longest a swap action may take, and the longest to wait for its
    /// new version to answer.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub swap_timeout: Duration,
    /// W: a swap's window runs from its trigger to W after its commit.
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    pub window: Duration,
    /// Steady load after the last swap's window, before the drill stops.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub tail: Duration,
    /// The versions allowed to answer (default: those answering before the
    /// first swap, plus each swap's expected version).
    #[arg(long, value_delimiter = ',')]
    pub allow_versions: Vec<String>,
    /// The server's process id: sample its resident set size (VmRSS, its
    /// child processes included) during the drill. Without it, the pid a
    /// baton server reports in its status; none for another server.
    #[arg(long)]
    pub pid: Option<u32>,
    /// How often RSS is sampled.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub rss_interval: Duration,
    /// Probe the machine the drill runs on: a thread of the drill on each
    /// CPU, at real-time priority where it may be (root or CAP_SYS_NICE),
    /// sleeps 1 ms in a loop and records every wake later than this, in
    /// steady time and in swap windows: stops of the machine (a virtual CPU
    /// not running) and kernel sections that cannot be preempted, which no
    /// thread priority gets past. Off when not given; `2ms` is a good start.
    #[arg(long, value_parser = parse_duration, value_name = "LATE")]
    pub stall_probe: Option<Duration>,
    /// Where the JSON report goes.
    #[arg(long, default_value = "drill.json")]
    pub json: PathBuf,
    /// Where the chart goes.
    #[arg(long, default_value = "drill.svg")]
    pub svg: PathBuf,
    /// Put every request's record in the JSON report.
    #[arg(long)]
    pub records: bool,
    /// Threads of the load generator (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Allow a server address that is not loopback.
    #[arg(long)]
    pub allow_remote: bool,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// Parses `250ms`, `2s`, `1.5s`, `2m`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("'{text}' is not a duration (e.g. 250ms, 2s, 1m)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("'{text}' is not a duration (e.g. 250ms, 2s, 1m)"));
    }
    Duration::try_from_secs_f64(value * scale).map_err(|e| format!("'{text}': {e}"))
}

impl DrillArgs {
    /// Checks the options that depend on each other.
    pub fn check(&self) -> anyhow::Result<()> {
        use anyhow::ensure;
        ensure!(!self.model.is_empty(), "the model name is empty");
        ensure!(self.concurrency != Some(0), "--concurrency must be at least 1");
        if let Some(rate) = self.rate {
            ensure!(rate.is_finite() && rate > 0.0, "--rate must be a positive number of requests per second");
            ensure!(self.connections > 0, "--connections must be at least 1");
        }
        ensure!(self.batch > 0, "--batch must be at least 1");
        ensure!(self.duration > Duration::ZERO, "--duration must be positive");
        ensure!(self.timeout > Duration::ZERO, "--timeout must be positive");
        ensure!(self.rss_interval >= Duration::from_millis(1), "--rss-interval must be at least 1ms");
        ensure!(self.threads != Some(0), "--threads must be at least 1");
        let rollout_options = self.rollout_version.is_some()
            || self.rollout_mode.is_some()
            || !self.rollout_steps.is_empty()
            || self.rollout_interval.is_some()
            || self.rollout_failure_limit.is_some()
            || self.rollout_max_inconclusive.is_some()
            || self.rollout_guards.is_some();
        ensure!(self.swap == SwapMethod::Rollout || !rollout_options, "--rollout-* options need --swap rollout");
        if self.swap == SwapMethod::Rollout {
            if let Some(guards) = &self.rollout_guards {
                let value: serde_json::Value =
                    serde_json::from_str(guards).map_err(|e| anyhow::anyhow!("--rollout-guards is not JSON: {e}"))?;
                ensure!(value.is_object(), "--rollout-guards must be a JSON object");
            }
            ensure!(
                self.rollout_steps.iter().all(|s| s.is_finite() && *s > 0.0 && *s <= 100.0),
                "--rollout-steps are percentages above 0 and at most 100"
            );
        } else if self.swaps > 0 {
            match self.swap {
                SwapMethod::LoadApi | SwapMethod::Rollout => {}
                SwapMethod::Publish => {
                    ensure!(self.repo.is_some(), "--swap publish needs --repo, the repository the server polls");
                    ensure!(
                        self.versions.is_empty(),
                        "--swap publish brings the next version number each time; --versions does not apply"
                    );
                }
                SwapMethod::Upgrade => {
                    ensure!(
                        self.versions.is_empty(),
                        "--swap upgrade keeps the versions that serve; --versions does not apply"
                    );
                }
                SwapMethod::Command => {
                    let Some(command) = &self.command else {
                        anyhow::bail!("--swap command needs --command");
                    };
                    ensure!(
                        !command.contains("{version}") || !self.versions.is_empty(),
                        "--command uses {{version}} but no --versions were given"
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
