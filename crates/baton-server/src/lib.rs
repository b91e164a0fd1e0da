//! The `baton` command: the server and the tools around it. The binary is
//! [`main`]; the library also lets tests run the server in-process on
//! backends the binary does not have ([`InProcess`]).

mod access;
mod agent;
mod app;
mod budget;
pub mod build;
mod cli;
mod clock;
mod cluster;
mod deadline;
mod decisions;
mod error;
mod fleet_view;
mod grpc;
mod http;
mod init;
mod logging;
mod metrics;
mod prometheus;
mod readiness;
#[cfg(test)]
mod reference;
mod repository;
mod rollout_start;
mod serve;
mod serving;
mod status;
mod upgrade;

pub use serve::{InProcess, ServeArgs};

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// baton: a model-inference server where updating a model is a non-event.
#[derive(Parser)]
#[command(name = "baton", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a model repository over KServe V2 (a generated demo repository without --repo).
    Serve(Box<serve::ServeArgs>),
    /// Write DIR/MANIFEST listing every file of a version with its size and SHA-256.
    /// With --graph-from, first write DIR/graph.onnx for a weights-only
    /// version (DIR/weights.safetensors): the graph of an earlier version's
    /// model.onnx (or any ONNX file), its initializers taken from the
    /// weights file after checking each tensor's name, type and shape.
    Package {
        /// The version directory, e.g. models/ranker/3.
        dir: PathBuf,
        /// An earlier version's directory, or an ONNX file, whose graph the
        /// weights-only version in DIR uses.
        #[arg(long, value_name = "VERSION_DIR|MODEL.onnx")]
        graph_from: Option<PathBuf>,
        /// The MANIFEST's format: 2 (digests of 16 MiB pieces for larger
        /// files, hashed on every core at load) or 1 (each file's SHA-256,
        /// as sha256sum prints it). baton reads both.
        #[arg(long, value_name = "1|2", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=2))]
        manifest_format: u32,
        /// Print what was written as JSON (`manifest`, `files`, `bytes`, `format`).
        #[arg(long)]
        json: bool,
    },
    /// Show each model's state and decision, and each version's role,
    /// kind of update, memory and worker (one model's with MODEL).
    Status {
        /// Only this model.
        model: Option<String>,
        /// Print the server's status document (`/baton/v1/status`, or the
        /// model's) instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: cli::Target,
    },
    /// List the repository's models and versions, and the state of each.
    List {
        /// Print the server's index (`POST /v2/repository/index`) instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Load a model's newest version (or --version), following each stage;
    /// without --version, nothing loads when the newest already serves
    /// (unless --force). Prints what serves afterwards and the hold a
    /// load of an older version records.
    Load {
        /// The model.
        name: String,
        /// A version to load instead of the newest.
        #[arg(long)]
        version: Option<u64>,
        /// Load even when the version already serves (e.g. to read its
        /// model.toml again).
        #[arg(long)]
        force: bool,
        /// Print the server's report (with the decision in force) instead
        /// of following the stages.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Switch a model back to its previous version (a pointer store, no
    /// reload); it is held there until a version newer than the newest is
    /// published.
    Rollback {
        /// The model.
        name: String,
        /// Print the server's report (with the decision in force) instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Pin a model to a version: it serves until unpinned, whatever is published.
    Pin {
        /// The model.
        name: String,
        /// The version.
        version: u64,
        /// Print the server's answer instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Take a model out of service (it stays out, across restarts, until a
    /// newer version is published or it is loaded).
    Unload {
        /// The model.
        name: String,
        /// Print the server's report instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Free a version kept in memory for rollback.
    Retire {
        /// The model.
        name: String,
        /// The kept version.
        version: u64,
        /// Print the server's report instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Replace the running server with a new process of its own
    /// executable, as on disk now (install the new binary at that path
    /// first): the new process takes over the listening sockets once it is
    /// ready, and the old one drains and exits.
    Upgrade {
        /// How long the new process may take to be ready, e.g. 10m, 90s
        /// (1s to 24h; a bare number is seconds).
        #[arg(long, default_value = "10m", value_parser = baton_drill::args::parse_duration)]
        timeout: std::time::Duration,
        /// The old process drains and exits before the new one loads, so
        /// the two never hold the models together (for a machine without
        /// room for both); connections wait in the sockets' backlog
        /// meanwhile, and a new process that fails has nothing to fall
        /// back on.
        #[arg(long)]
        cold: bool,
        /// Print the server's answer instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Remove a model's pin: its newest version serves again (after a
    /// rollback, the version rolled back from: it warns).
    Unpin {
        /// The model.
        name: String,
        /// Print the server's answer instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Start, show, pause, resume, promote or abort a rollout (`baton
    /// rollout start|status|pause|resume|promote|abort MODEL`); `baton
    /// rollout MODEL [--version N] ...` starts one too.
    Rollout(Box<cli::RolloutArgs>),
    /// A fleet of replicas over etcd: its status, and rollouts across it.
    Fleet(Box<cli::FleetArgs>),
    /// Take part in a fleet on behalf of another KServe V2 server (baton, MLServer, Triton) as its sidecar.
    Agent(Box<agent::AgentArgs>),
    /// Drive load at a KServe V2 server while swapping its model, and report what clients saw.
    Drill(Box<baton_drill::DrillArgs>),
    /// Run one model version for a server, as its worker process (the
    /// server starts it; not for people to run).
    #[command(hide = true)]
    Worker,
    /// Run `baton ARGS` (e.g. `serve ...`) as the main process of a
    /// container: as PID 1, reap every process, pass signals on, follow
    /// the main process across upgrades, exit with its status.
    Init(Box<init::InitArgs>),
    /// Print state transitions and other events as they happen.
    Events {
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: cli::Target,
    },
}

fn package(dir: &std::path::Path, graph_from: Option<&std::path::Path>, format: u32, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(dir.is_dir(), "{} is not a directory", dir.display());
    let format = baton_core::files::manifest::Format::from_number(format)
        .ok_or_else(|| anyhow::anyhow!("there is no MANIFEST format {format}: 1 or 2"))?;
    if let Some(source) = graph_from {
        write_weights_graph(dir, source)?;
    }
    let manifest =
        baton_core::files::manifest::write_as(dir, format).with_context(|| format!("packaging {}", dir.display()))?;
    if json {
        let written = serde_json::json!({
            "manifest": dir.join(baton_core::files::manifest::MANIFEST),
            "files": manifest.entries.len(),
            "bytes": manifest.total_bytes(),
            "format": format.number(),
        });
        println!("{written}");
        return Ok(());
    }
    println!(
        "Wrote {} listing {} files, {} bytes.",
        dir.join(baton_core::files::manifest::MANIFEST).display(),
        manifest.entries.len(),
        manifest.total_bytes()
    );
    Ok(())
}

/// Writes `dir/graph.onnx` from the graph of `source` (a version directory
/// or an ONNX file) for the weights file in `dir`.
fn write_weights_graph(dir: &std::path::Path, source: &std::path::Path) -> anyhow::Result<()> {
    use baton_onnx::{GRAPH_FILE, MODEL_FILE, safetensors::WEIGHTS_FILE};
    let source = match source.is_dir() {
        true if source.join(MODEL_FILE).is_file() => source.join(MODEL_FILE),
        true => source.join(GRAPH_FILE),
        false => source.to_path_buf(),
    };
    let graph = std::fs::read(&source).with_context(|| format!("reading {}", source.display()))?;
    let weights_path = dir.join(WEIGHTS_FILE);
    let weights = std::fs::File::open(&weights_path).with_context(|| format!("opening {}", weights_path.display()))?;
    let rewritten = baton_onnx::graph_for_weights(&graph, &weights)
        .map_err(|e| anyhow::anyhow!("{} does not fit {}: {e}", weights_path.display(), source.display()))?;
    std::fs::write(dir.join(GRAPH_FILE), &rewritten).with_context(|| format!("writing {GRAPH_FILE}"))?;
    println!(
        "Wrote {} ({} bytes), the graph of {}.",
        dir.join(GRAPH_FILE).display(),
        rewritten.len(),
        source.display()
    );
    Ok(())
}

/// `baton worker`: the ONNX engine, run for a server that handed this
/// process a version.
fn worker() -> anyhow::Result<()> {
    let make: baton_worker::serve::MakeBackend = Box::new(|| {
        let onnx = baton_onnx::OnnxBackend::new()?;
        Ok(std::sync::Arc::new(onnx) as std::sync::Arc<dyn baton_core::run::backend::Backend>)
    });
    baton_worker::serve::serve(make).map_err(|e| anyhow::anyhow!("the worker stopped: {e}"))
}

/// The `baton` command: parses the command line and runs what it asks for.
pub fn main() -> ExitCode {
    // The version `--version` prints includes the binary's build stamp.
    let version: &'static str = Box::leak(build::version().into_boxed_str());
    let cli = match Cli::from_arg_matches(&Cli::command().version(version).get_matches()) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    // `baton fleet` prints what happens itself; its library's log lines
    // would say it twice.
    let default_filter = if matches!(cli.command, Command::Fleet(_)) { "warn" } else { "info,ort=warn" };
    let log_format = match &cli.command {
        Command::Serve(args) => args.log_format,
        Command::Agent(args) => args.log_format,
        Command::Init(args) => args.log_format,
        _ => logging::LogFormat::Text,
    };
    logging::init(default_filter, log_format);
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Package { dir, graph_from, manifest_format, json } => {
            package(&dir, graph_from.as_deref(), manifest_format, json)
        }
        Command::Status { model, json, target } => cli::status(&target, model.as_deref(), json),
        Command::List { json, target } => cli::list(&target, json),
        Command::Load { name, version, force, json, target } => cli::load(&target, &name, version, force, json),
        Command::Rollback { name, json, target } => cli::rollback(&target, &name, json),
        Command::Pin { name, version, json, target } => cli::pin(&target, &name, version, json),
        Command::Unpin { name, json, target } => cli::unpin(&target, &name, json),
        Command::Unload { name, json, target } => cli::unload(&target, &name, json),
        Command::Retire { name, version, json, target } => cli::retire(&target, &name, version, json),
        Command::Upgrade { timeout, cold, json, target } => cli::upgrade(&target, timeout, cold, json),
        Command::Rollout(args) => cli::rollout(&args),
        Command::Fleet(args) => cli::fleet(&args),
        Command::Events { json, target } => cli::events(&target, json),
        Command::Agent(args) => agent::run(*args),
        Command::Drill(args) => return baton_drill::run(*args),
        Command::Init(args) => return init::run(*args),
        Command::Worker => worker(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("baton: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
