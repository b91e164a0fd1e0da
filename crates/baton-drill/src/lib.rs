//! `baton drill`: a swap-under-fire drill. It drives load at a KServe V2
//! server (baton, Triton, MLServer, KServe's Python server) over HTTP or
//! gRPC, makes swaps while the load runs, and reports what the clients saw:
//! failures, latency in steady windows against swap windows, how long each
//! new version took to answer, answers from unexpected versions, and the
//! server's memory. See docs/drill.md.
//!
//! Exit status: 0 when the verdict is clean, 1 when the drill ran and found
//! problems (failed requests, a failed or unserved swap, unexpected
//! versions), 2 when it could not run (bad options, an unreachable
//! metadata endpoint, a repository that is not there).

pub mod analyze;
pub mod args;
pub mod caller;
pub mod grpc;
pub mod http1;
pub mod load;
pub mod payload;
pub mod progress;
pub mod record;
pub mod report;
pub mod role;
pub mod rollout;
pub mod rss;
pub mod stalls;
pub mod swap;
pub mod target;

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Context;
pub use args::DrillArgs;
use args::Protocol;
use caller::{Caller, HttpCaller};
use load::{Mode, Plan};
use record::Live;
use serde_json::json;
use target::Endpoint;

/// Runs the drill; the exit status says what it found.
pub fn run(args: DrillArgs) -> ExitCode {
    match drill(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("baton drill: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn drill(args: &DrillArgs) -> anyhow::Result<bool> {
    args.check()?;
    target::check_path_segment("the model name", &args.model)?;
    if let Some(v) = &args.model_version {
        target::check_path_segment("--model-version", v)?;
    }
    let http = Endpoint::parse(&args.url, 80, args.allow_remote)?;
    let grpc = match args.protocol {
        Protocol::Grpc => Some(Endpoint::parse(&args.grpc_url, 8001, args.allow_remote)?),
        _ => None,
    };
    let (pid, unsampled) = memory_target(args, &http)?;
    if let Some(why) = &unsampled {
        eprintln!("RSS not reported: {why}.");
    }
    let followed: rss::Followed = Arc::new(Mutex::new(pid.into_iter().collect()));
    let inputs = payload::tensors(&http, args)?;
    let rollout = match args.swap {
        args::SwapMethod::Rollout => Some(rollout::Driver::from_args(args, &http)?),
        _ => None,
    };
    let action = match args.swaps {
        _ if rollout.is_some() => None,
        0 => None,
        _ => Some(swap::action::Action::from_args(args, &http, &followed)?),
    };
    let mode = match args.rate {
        Some(rate) => Mode::Open { rate, connections: args.connections },
        None => Mode::Closed { workers: args.concurrency.unwrap_or(4) },
    };
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("drill-load")
        .enable_all()
        .build()
        .context("starting the load generator's runtime")?;

    let request: Arc<[u8]> = payload::http_request(&http, args, &inputs).into();
    let mut callers: Vec<Caller> = Vec::new();
    for _ in 0..mode.workers() {
        callers.push(match &grpc {
            Some(endpoint) => Caller::Grpc(Box::new(grpc::GrpcCaller::new(endpoint, args, &inputs)?)),
            None => Caller::Http(HttpCaller::new(http.addr, Arc::clone(&request))),
        });
    }
    runtime.block_on(async {
        for caller in &mut callers {
            caller.connect().await;
        }
    });

    let title = title(args, &mode);
    eprintln!("{title}");
    let live = Arc::new(Live::new(mode.workers()));
    let started_unix_s = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let phase: swap::Phase = Arc::new(Mutex::new(String::new()));
    let sampler = pid.map(|_| rss::spawn(Arc::clone(&followed), args.rss_interval, Arc::clone(&live)));
    let probe = match args.stall_probe {
        Some(late) => Some(stalls::spawn(late, Arc::clone(&live)).context("starting the stall probe")?),
        None => None,
    };
    let driver = action.map(|action| {
        let schedule = swap::Schedule::from_args(args);
        swap::spawn(action, schedule, args.versions.clone(), Arc::clone(&live), Arc::clone(&phase))
    });
    let follower = rollout.map(|driver| driver.spawn(Arc::clone(&live), Arc::clone(&phase)));
    let progress = (!args.quiet).then(|| progress::spawn(Arc::clone(&live), Arc::clone(&phase)));

    let plan = Plan { mode, duration: args.duration, max_requests: args.max_requests, timeout: args.timeout };
    let logs = runtime.block_on(load::run(callers, plan, Arc::clone(&live)));
    let stopped_at = live.now();
    live.stop.store(true, Ordering::Relaxed);
    if let Some(p) = progress {
        let _ = p.join();
    }
    let swaps = driver.map(|d| d.join().unwrap_or_default()).unwrap_or_default();
    let rollout = follower.map(|f| f.join().unwrap_or_default());
    let samples = sampler.map(|s| s.join().unwrap_or_default());
    let probe = probe.map(stalls::Probes::join);
    drop(runtime);

    let (records, versions, errors) = analyze::merge(&logs);
    let end = records.iter().map(record::Record::end).max().unwrap_or(stopped_at);
    let run = analyze::Run {
        records,
        versions,
        errors,
        end,
        swaps,
        planned_swaps: if rollout.is_some() { 0 } else { args.swaps },
        window: args.window.as_nanos() as u64,
        rss: pid.zip(samples),
        allow: args.allow_versions.clone(),
        probe,
        rollout,
    };
    let analysis = analyze::analyze(&run);
    let report = report::Report {
        tool: "baton drill",
        tool_version: env!("CARGO_PKG_VERSION"),
        started_unix_s,
        config: config(args, &mode, threads, &inputs, pid, unsampled.as_deref()),
        client: json!({
            "workers": mode.workers(),
            "threads": threads,
            "queued_sends": logs.iter().map(|l| l.queued).sum::<u64>(),
            "late_sends": logs.iter().map(|l| l.late).sum::<u64>(),
            "max_schedule_lag_ms": logs.iter().map(|l| l.max_lag).max().unwrap_or(0) as f64 / 1e6,
        }),
        analysis: &analysis,
        records: args.records.then(|| report::Records::of(&run)),
    };
    let json = serde_json::to_string_pretty(&report).context("encoding the report")?;
    report::write(&args.json, &json)?;
    report::write(&args.svg, &report::svg::render(&title, &analysis))?;
    // A closed stdout (e.g. piped into `head`) is not an error of the drill.
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "{}", report::table::render(&title, &analysis));
    if let Some(why) = &unsampled {
        let _ = writeln!(out, "RSS not reported: {why}.");
    }
    let _ = writeln!(out, "report: {}  chart: {}", args.json.display(), args.svg.display());
    Ok(analysis.verdict.clean)
}

/// The process whose memory the drill samples: --pid, or else the pid
/// the server's status reports (`GET /baton/v1/status`), so that one
/// command works on a host running several servers. Without either (a
/// server that is not baton, or one whose process this host cannot read)
/// the drill runs without RSS and says why; an upgrade drill, whose
/// memory peak is one of the things it measures, refuses instead.
fn memory_target(args: &DrillArgs, http: &Endpoint) -> anyhow::Result<(Option<u32>, Option<String>)> {
    if let Some(pid) = args.pid {
        rss::read_rss(pid).with_context(|| format!("--pid {pid}: cannot read the process's memory"))?;
        return Ok((Some(pid), None));
    }
    let upgrade = args.swap == args::SwapMethod::Upgrade && args.swaps > 0;
    if !upgrade && !http.addr.ip().is_loopback() {
        // Another host's pid names nothing here.
        return Ok((None, Some(format!("the server at {} is on another host; give --pid", args.url))));
    }
    let (pid, started) = match swap::upgrade::server_process(args, http) {
        Ok(found) => found,
        Err(error) if upgrade => return Err(error),
        Err(error) => {
            return Ok((None, Some(format!("the server does not report its pid ({error:#}); give --pid"))));
        }
    };
    // A server in another pid namespace (a container publishing its port
    // on loopback) reports a pid that names another process here.
    if let Some(started) = started {
        let why = match rss::start_time(pid) {
            Some(here) if here == started => None,
            Some(_) => Some(format!(
                "the server reports pid {pid}, but this host's process {pid} is another one (the server runs in \
                 another pid namespace, a container say); give --pid"
            )),
            None => {
                Some(format!("the server reports pid {pid}, which is not a process this host can read; give --pid"))
            }
        };
        if let Some(why) = why {
            return if upgrade { Err(anyhow::anyhow!(why)) } else { Ok((None, Some(why))) };
        }
    }
    match rss::read_rss(pid) {
        Ok(_) => Ok((Some(pid), None)),
        Err(error) if upgrade => Err(error.context(format!("the server's pid {pid}: cannot read its memory"))),
        Err(_) => Ok((
            None,
            Some(format!("the server reports pid {pid}, which is not a process this host can read; give --pid")),
        )),
    }
}

fn title(args: &DrillArgs, mode: &Mode) -> String {
    let target = match args.protocol {
        Protocol::Grpc => args.grpc_url.as_str(),
        _ => args.url.as_str(),
    };
    let load = match *mode {
        Mode::Closed { workers } => format!("closed loop ×{workers}"),
        Mode::Open { rate, connections } => format!("open loop {rate}/s over ≤{connections} connections"),
    };
    let swaps = match args.swaps {
        _ if args.swap == args::SwapMethod::Rollout => "a rollout".to_owned(),
        0 => "no swaps".to_owned(),
        1 => format!("1 swap by {}", value_name(args.swap)),
        n => format!("{n} swaps by {}", value_name(args.swap)),
    };
    let protocol = value_name(args.protocol);
    format!("baton drill: {} @ {target} ({protocol}, {load}, {swaps})", args.model)
}

/// The command-line spelling of an option's value.
fn value_name(value: impl clap::ValueEnum) -> String {
    value.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default()
}

fn config(
    args: &DrillArgs,
    mode: &Mode,
    threads: usize,
    inputs: &[baton_core::tensors::tensor::Tensor],
    pid: Option<u32>,
    unsampled: Option<&str>,
) -> serde_json::Value {
    json!({
        "model": args.model,
        "url": args.url,
        "grpc_url": (args.protocol == Protocol::Grpc).then_some(&args.grpc_url),
        "protocol": args.protocol,
        "model_version": args.model_version,
        "inputs": payload::specs_of(inputs),
        "mode": mode,
        "threads": threads,
        "duration_limit_s": args.duration.as_secs_f64(),
        "max_requests": args.max_requests,
        "timeout_s": args.timeout.as_secs_f64(),
        "warmup_s": args.warmup.as_secs_f64(),
        "swaps": args.swaps,
        "swap": args.swap,
        "swap_interval_s": args.swap_interval.as_secs_f64(),
        "swap_gap_s": args.swap_gap.as_secs_f64(),
        "swap_timeout_s": args.swap_timeout.as_secs_f64(),
        "versions": args.versions,
        "repo": args.repo,
        "template": args.template,
        "command": args.command,
        "rollout": (args.swap == args::SwapMethod::Rollout).then(|| json!({
            "body": rollout::start_body(args).ok(),
            "timeout_s": args.rollout_timeout.as_secs_f64(),
        })),
        "window_ms": args.window.as_secs_f64() * 1e3,
        "tail_s": args.tail.as_secs_f64(),
        "allow_versions": args.allow_versions,
        "pid": pid,
        "pid_from": match (args.pid, pid) {
            (Some(_), _) => Some("--pid"),
            (None, Some(_)) => Some("status"),
            (None, None) => None,
        },
        "rss_not_reported": unsampled,
        "rss_interval_ms": args.rss_interval.as_secs_f64() * 1e3,
        "stall_probe_late_ms": args.stall_probe.map(|d| d.as_secs_f64() * 1e3),
    })
}
