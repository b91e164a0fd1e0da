//! `baton fleet`: the fleet's status, and rollouts across it, straight
//! from etcd. `baton fleet rollout` starts a rollout and coordinates it to
//! its end (unless `--detach`); if it dies, a replica takes over. When the
//! etcd member it speaks to stops answering, a rollout it coordinates and
//! `status --follow` go on through another member.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use baton_cluster::ops::{self, Request};
use baton_cluster::records::{Ack, Desired, FleetPhase, FleetPlan, ReplicaRecord, RolloutRecord};
use baton_cluster::{ClusterError, Health, Store, coordinator};
use baton_core::files::rollout_spec::Guards;

use super::render_fleet::Fleet;
use super::rollout::GuardFlags;

/// `baton fleet`'s arguments.
#[derive(clap::Args, Debug)]
pub struct FleetArgs {
    /// The fleet's etcd: `etcd://HOST:PORT[,HOST:PORT…]`.
    #[arg(long, env = "BATON_CLUSTER")]
    pub cluster: String,
    /// The fleet's name.
    #[arg(long, default_value = "baton")]
    pub cluster_name: String,
    #[command(flatten)]
    pub etcd: crate::cluster::EtcdAccess,
    /// Print the fleet's records as JSON instead of text: the status, or
    /// the rollout's record once an operation (or the rollout it
    /// coordinates) is done.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: FleetCommand,
}

/// What `baton fleet` does.
#[derive(clap::Subcommand, Debug)]
pub enum FleetCommand {
    /// Every replica's state and versions, and each model's rollout.
    Status {
        /// Follow the fleet, refreshing every second, until interrupted.
        #[arg(long, short = 'f', alias = "watch", conflicts_with = "json")]
        follow: bool,
    },
    /// Rolls MODEL out to VERSION across the fleet: every replica prepares
    /// it, then all switch at once (or a subset first, with --steps).
    Rollout(Box<FleetRollout>),
    /// Stops judging; the committed subset keeps the candidate.
    Pause {
        /// The model.
        model: String,
    },
    /// Judges again.
    Resume {
        /// The model.
        model: String,
    },
    /// Every replica promotes the candidate now.
    Promote {
        /// The model.
        model: String,
    },
    /// Every replica drops the candidate now.
    Abort {
        /// The model.
        model: String,
    },
    /// Runs simulated replicas that speak the protocol with no model
    /// behind them, until interrupted: for measuring the protocol at scale.
    Simulate {
        /// How many.
        #[arg(long, default_value_t = 100)]
        replicas: usize,
        /// Their IDs' prefix.
        #[arg(long, default_value = "sim")]
        prefix: String,
        /// The models they offer (version 1 each).
        #[arg(long = "model", default_value = "m")]
        models: Vec<String>,
        /// How long preparing a candidate takes them.
        #[arg(long, value_parser = baton_drill::args::parse_duration, default_value = "50ms")]
        prepare: Duration,
    },
}

/// `baton fleet rollout`'s arguments.
#[derive(clap::Args, Debug)]
pub struct FleetRollout {
    /// The model.
    pub model: String,
    /// The candidate version.
    #[arg(long)]
    pub version: u64,
    /// Replicas committed at each step, in percent; the last is 100.
    /// The default, 100, is a plain two-phase commit.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub steps: Option<Vec<f64>>,
    /// Labels that pick the first step's replicas, `key=value`; repeat
    /// for more.
    #[arg(long = "selector", value_name = "KEY=VALUE", value_parser = crate::cluster::parse_label)]
    pub selector: Vec<(String, String)>,
    /// How long a committed subset is observed before it is judged
    /// (default 30s).
    #[arg(long, value_parser = baton_drill::args::parse_duration)]
    pub interval: Option<Duration>,
    /// How long replicas have to prepare (default 120s).
    #[arg(long, value_parser = baton_drill::args::parse_duration)]
    pub prepare_timeout: Option<Duration>,
    /// Participants that may be lost or fail to prepare without aborting;
    /// they converge later (default 0).
    #[arg(long)]
    pub allow_missing: Option<usize>,
    /// Failed judgements that roll the subset back (default 1).
    #[arg(long)]
    pub failure_limit: Option<u32>,
    /// Inconclusive judgements in a row that pause (default 10).
    #[arg(long)]
    pub max_inconclusive: Option<u32>,
    #[command(flatten)]
    pub guard: GuardFlags,
    /// How long after the commit write every replica switches, at one
    /// instant (default 250ms); 0 switches each replica when the commit
    /// reaches it.
    #[arg(long, value_parser = baton_drill::args::parse_duration)]
    pub switch_lead: Option<Duration>,
    /// Start it and return; the replicas coordinate it.
    #[arg(long)]
    pub detach: bool,
}

impl FleetRollout {
    fn plan(&self) -> anyhow::Result<FleetPlan> {
        let guards = match self.guard.json() {
            Some(json) => serde_json::from_value::<Guards>(json).context("the guard flags")?,
            None => Guards::default(),
        };
        // What is not given is the plan's default.
        let base = FleetPlan::default();
        let ms = |given: Option<Duration>, default: u64| given.map_or(default, |d| d.as_millis() as u64);
        Ok(FleetPlan {
            steps: self.steps.clone().unwrap_or(base.steps),
            selector: self.selector.iter().cloned().collect(),
            interval_ms: ms(self.interval, base.interval_ms),
            prepare_timeout_ms: ms(self.prepare_timeout, base.prepare_timeout_ms),
            failure_limit: self.failure_limit.unwrap_or(base.failure_limit),
            max_inconclusive: self.max_inconclusive.unwrap_or(base.max_inconclusive),
            allow_missing: self.allow_missing.unwrap_or(base.allow_missing),
            guards: guards.into(),
            switch_lead_ms: ms(self.switch_lead, base.switch_lead_ms),
            unknown: base.unknown,
        })
    }
}

/// Runs `baton fleet`.
pub fn run(args: &FleetArgs) -> anyhow::Result<()> {
    if let FleetCommand::Simulate { replicas, prefix, models, prepare } = &args.command {
        return simulate(args, *replicas, prefix, models.clone(), *prepare);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let store = Store::connect(&args.etcd.store(&args.cluster), &args.cluster_name)
            .await
            .with_context(|| format!("no fleet can be reached at {}", args.cluster))?;
        let me = format!("operator@{}", crate::cluster::replica_id(None));
        match &args.command {
            FleetCommand::Status { follow } => status(&store, *follow, args.json).await,
            FleetCommand::Rollout(rollout) => Box::pin(start(&store, rollout, &me, args.json)).await,
            FleetCommand::Pause { model } => operate(&store, model, Request::Pause, &me, args.json).await,
            FleetCommand::Resume { model } => operate(&store, model, Request::Resume, &me, args.json).await,
            FleetCommand::Promote { model } => operate(&store, model, Request::Promote, &me, args.json).await,
            FleetCommand::Abort { model } => operate(&store, model, Request::Abort, &me, args.json).await,
            FleetCommand::Simulate { .. } => unreachable!("handled above"),
        }
    })
}

/// `baton fleet simulate`: until SIGINT or SIGTERM.
fn simulate(
    args: &FleetArgs,
    replicas: usize,
    prefix: &str,
    models: Vec<String>,
    prepare: Duration,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let store = args.etcd.store(&args.cluster);
        let run = baton_cluster::sim::simulate(&store, &args.cluster_name, prefix, replicas, models, prepare, stopped);
        println!("Running {replicas} simulated replicas ({prefix}-0 …); interrupt to stop.");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::pin!(run);
        tokio::select! {
            () = &mut run => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop.send(true);
        // Each revokes its lease on the way out, so the fleet sees them go.
        let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
        Ok(())
    })
}

async fn operate(store: &Store, model: &str, what: Request, me: &str, json: bool) -> anyhow::Result<()> {
    let record = ops::request(store, model, what, me).await?;
    match json {
        true => println!("{}", serde_json::to_string(&record)?),
        false => println!("{}", record.decisions.last().map_or("", |d| d.message.as_str())),
    }
    Ok(())
}

/// Starts the rollout, then coordinates it to its end, printing each
/// decision; the lease it coordinates under dies with this process.
async fn start(store: &Store, rollout: &FleetRollout, me: &str, json: bool) -> anyhow::Result<()> {
    if rollout.detach {
        let record = ops::start(store, &rollout.model, rollout.version, rollout.plan()?, me).await?;
        if json {
            println!("{}", serde_json::to_string(&record)?);
            return Ok(());
        }
        println!("{}", record.decisions.last().map_or("", |d| d.message.as_str()));
        println!("Detached: the fleet's replicas coordinate it. Follow it with `baton fleet status --follow`.");
        return Ok(());
    }
    // The coordinator key is taken before the record is written: a record
    // in progress with no coordinator is an orphan, and a replica would
    // take it over before this process could.
    let lease = store.grant(LEASE_TTL).await?;
    let tenure = tokio::select! {
        claimed = claim(store, &rollout.model, me, lease) => claimed?,
        error = store.keep_alive(lease, LEASE_TTL) => return Err(error.into()),
    };
    let record = match ops::start(store, &rollout.model, rollout.version, rollout.plan()?, me).await {
        Ok(record) => record,
        Err(error) => {
            let _ = store.revoke(lease).await;
            return Err(error.into());
        }
    };
    if !json {
        println!("{}", record.decisions.last().map_or("", |d| d.message.as_str()));
        println!("Coordinating from this process, through etcd member {}.", store.endpoint());
    }
    let printed = Arc::new(AtomicUsize::new(record.decisions.len()));
    let current = tokio::sync::watch::channel(store.clone()).0;
    let printer = match json {
        // The record, decisions included, is printed whole at the end.
        true => tokio::spawn(std::future::pending::<()>()),
        false => print_decisions(current.subscribe(), &rollout.model, Arc::clone(&printed)),
    };
    let done = Box::pin(coordinate_to_end(store, &rollout.model, me, tenure, lease, &current)).await;
    printer.abort();
    let last = current.borrow().clone();
    let _ = last.revoke(lease).await;
    let done = done?;
    if json {
        println!("{}", serde_json::to_string(&done)?);
    }
    for decision in done.decisions.iter().skip(printed.load(Ordering::SeqCst)).filter(|_| !json) {
        println!("{}", decision.message);
    }
    if let Some(switch) = done.switch.as_ref().filter(|_| !json) {
        println!(
            "{} replicas switched within {:.1} ms of each other, {:.1}–{:.1} ms after the commit write \
             (the commit reached them within {:.1} ms of each other, the last {:.1} ms after the write).",
            switch.replicas,
            switch.skew_ms,
            switch.first_ms,
            switch.last_ms,
            switch.delivery_skew_ms,
            switch.last_seen_ms
        );
    }
    match done.phase {
        FleetPhase::Promoted => Ok(()),
        phase => anyhow::bail!(
            "the rollout ended {}: {}",
            phase.as_str(),
            done.reason.as_deref().unwrap_or("no reason given")
        ),
    }
}

/// The time to live of the lease `baton fleet rollout` coordinates under:
/// a replica takes over this long after the process dies.
const LEASE_TTL: i64 = 5;
/// How long the coordination looks for another etcd member once its own
/// stopped answering, before it gives up (a replica then takes over).
const FIND_ANOTHER: Duration = Duration::from_secs(30);

/// Coordinates the rollout of `model` to its end as the holder of the key
/// of `tenure`, under `lease`, kept alive meanwhile. When the etcd member
/// it speaks to stops answering (a call or its watch fails, or the lease's
/// renewals left it and it no longer serves a read), it goes on through
/// another: it takes its key over there, under the same lease, and
/// carries on from the record with the clocks it measured. `current` is
/// told the store it speaks through.
async fn coordinate_to_end(
    store: &Store,
    model: &str,
    me: &str,
    tenure: coordinator::Tenure,
    lease: i64,
    current: &tokio::sync::watch::Sender<Store>,
) -> anyhow::Result<RolloutRecord> {
    let (via, mut moved) = tokio::sync::watch::channel(store.endpoint());
    let mut keeper = {
        let store = store.clone();
        tokio::spawn(async move { store.keep_alive_via(lease, LEASE_TTL, &via).await })
    };
    let health = Health::default();
    let (mut store, mut tenure) = (store.clone(), tenure);
    let result = loop {
        let outcome = {
            let coordinating = coordinator::coordinate(&store, model, me, tenure, &health);
            tokio::pin!(coordinating);
            loop {
                tokio::select! {
                    done = &mut coordinating => break done,
                    ended = &mut keeper => {
                        let error = ended.unwrap_or_else(|e| ClusterError::Unreachable(format!("the lease's keeper ended: {e}")));
                        return Err(anyhow::Error::new(error).context("the coordinator's lease was lost"));
                    }
                    Ok(()) = moved.changed() => {
                        let now = moved.borrow_and_update().clone();
                        if now != store.endpoint()
                            && let Err(error) = store.answers().await
                        {
                            break Err(ClusterError::Unreachable(format!("it answers no read: {}", error.detail())));
                        }
                    }
                }
            }
        };
        match outcome {
            Err(error @ ClusterError::Unreachable(_)) => {
                println!(
                    "etcd member {} stopped answering ({}); coordinating on through another.",
                    store.endpoint(),
                    error.detail()
                );
                (store, tenure) = match another(&store, model, me, lease, tenure.created).await {
                    Ok(found) => found,
                    Err(error) => break Err(error),
                };
                current.send_replace(store.clone());
                println!("Coordinating through etcd member {}.", store.endpoint());
            }
            other => break other.map_err(anyhow::Error::from),
        }
    };
    keeper.abort();
    result
}

/// Another etcd member that answers, and the coordinator key of `model`
/// taken over there (created at `created`, under `lease`), within
/// [`FIND_ANOTHER`].
async fn another(
    store: &Store,
    model: &str,
    me: &str,
    lease: i64,
    created: i64,
) -> anyhow::Result<(Store, coordinator::Tenure)> {
    let deadline = tokio::time::Instant::now() + FIND_ANOTHER;
    loop {
        let error = match store.reconnect().await {
            Ok(other) => match coordinator::take_over(&other, model, me, lease, created).await {
                Ok(Some(tenure)) => return Ok((other, tenure)),
                Ok(None) => anyhow::bail!(
                    "the coordinator key of model {model} is gone or another's: a replica coordinates the rollout"
                ),
                Err(error) => error,
            },
            Err(error) => error,
        };
        if !matches!(error, ClusterError::Unreachable(_)) || tokio::time::Instant::now() >= deadline {
            return Err(anyhow::Error::new(error).context("no other etcd member answered"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Takes the coordinator key of `model` under `lease`. A coordinator that
/// just ended a rollout holds it while it files the switch timings (a few
/// seconds at most), so it is asked for again until CLAIM passes; a
/// rollout still in progress is refused at once.
async fn claim(store: &Store, model: &str, me: &str, lease: i64) -> anyhow::Result<coordinator::Tenure> {
    const CLAIM: Duration = Duration::from_secs(15);
    let deadline = tokio::time::Instant::now() + CLAIM;
    loop {
        if let Some(tenure) = coordinator::campaign(store, model, me, lease).await? {
            return Ok(tenure);
        }
        if let Some(r) = store.get::<RolloutRecord>(&store.keys.record(model)).await?
            && r.value.phase.in_progress()
        {
            anyhow::bail!(
                "a fleet rollout of model {model} version {} is in progress ({}); abort it first",
                r.value.version,
                r.value.phase.as_str()
            );
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("another process has coordinated model {model} for {CLAIM:?}; try again once it is done");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Prints the rollout's decisions as they are written, counting them in
/// `printed` (decisions are only appended while a rollout runs); reads
/// through the store `current` names.
fn print_decisions(
    current: tokio::sync::watch::Receiver<Store>,
    model: &str,
    printed: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let model = model.to_owned();
    tokio::spawn(async move {
        loop {
            let store = current.borrow().clone();
            if let Ok(Some(r)) = store.get::<RolloutRecord>(&store.keys.record(&model)).await {
                let from = printed.load(Ordering::SeqCst);
                for decision in r.value.decisions.iter().skip(from) {
                    println!("{}", decision.message);
                }
                printed.store(from.max(r.value.decisions.len()), Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

async fn snapshot(store: &Store) -> anyhow::Result<Fleet> {
    let keys = &store.keys;
    let (replicas, _) = store.list::<ReplicaRecord>(&keys.replicas()).await?;
    let (desired, _) = store.list::<Desired>(&keys.desired_all()).await?;
    let (rollouts, _) = store.list::<RolloutRecord>(&keys.records()).await?;
    let mut acks = BTreeMap::new();
    for rollout in &rollouts {
        let (list, _) = store.list::<Ack>(&keys.acks(&rollout.value.model)).await?;
        let of_this = list.into_iter().filter(|a| a.value.rollout == rollout.value.id);
        let by_replica = of_this.map(|a| (a.name().to_owned(), a.value)).collect();
        acks.insert(rollout.value.model.clone(), by_replica);
    }
    Ok(Fleet {
        replicas: replicas.into_iter().map(|r| r.value).collect(),
        desired: desired.into_iter().map(|d| (d.name().to_owned(), d.value)).collect(),
        rollouts: rollouts.into_iter().map(|r| r.value).collect(),
        acks,
    })
}

async fn status(store: &Store, follow: bool, json: bool) -> anyhow::Result<()> {
    let mut store = store.clone();
    loop {
        let snapshot = match snapshot(&store).await {
            Ok(snapshot) => snapshot,
            // Following: a member that stops answering is left for another.
            Err(error) if follow => {
                eprintln!("etcd member {} did not answer ({error:#}); reading through another.", store.endpoint());
                match store.reconnect().await {
                    Ok(other) => store = other,
                    Err(error) => eprintln!("No etcd member answered ({error}); trying again."),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(error) => return Err(error),
        };
        let text = if json { serde_json::to_string_pretty(&snapshot)? } else { super::render_fleet::render(&snapshot) };
        let mut out = std::io::stdout().lock();
        if follow && out.is_terminal() {
            write!(out, "\x1b[2J\x1b[H")?;
        }
        writeln!(out, "{text}")?;
        out.flush()?;
        if !follow {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: FleetArgs,
    }

    fn follows(line: &[&str]) -> Result<bool, clap::Error> {
        let line = ["fleet", "--cluster", "etcd://127.0.0.1:2379"].into_iter().chain(line.iter().copied());
        Cli::try_parse_from(line).map(|cli| matches!(cli.args.command, FleetCommand::Status { follow: true }))
    }

    #[test]
    fn status_follows_with_follow_or_its_older_spelling_and_not_as_json() {
        assert!(!follows(&["status"]).unwrap());
        assert!(follows(&["status", "--follow"]).unwrap());
        assert!(follows(&["status", "-f"]).unwrap());
        assert!(follows(&["status", "--watch"]).unwrap());
        assert!(follows(&["status", "--follow", "--json"]).is_err());
        assert!(follows(&["pause", "m", "--follow"]).is_err());
    }
}
