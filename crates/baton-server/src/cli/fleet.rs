//! `baton fleet`: the fleet's status, and rollouts across it, straight
//! from etcd. `baton fleet rollout` starts a rollout and coordinates it to
//! its end (unless `--detach`); if it dies, a replica takes over.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use baton_cluster::ops::{self, Request};
use baton_cluster::records::{Ack, Desired, FleetPhase, FleetPlan, ReplicaRecord, RolloutRecord};
use baton_cluster::{Health, Store, coordinator};
use baton_core::rollout::guard::Guards;

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
    #[command(subcommand)]
    pub command: FleetCommand,
}

/// What `baton fleet` does.
#[derive(clap::Subcommand, Debug)]
pub enum FleetCommand {
    /// Every replica's state and versions, and each model's rollout.
    Status {
        /// Refresh every second until interrupted.
        #[arg(long)]
        watch: bool,
        /// Print the records as JSON.
        #[arg(long, conflicts_with = "watch")]
        json: bool,
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
            FleetCommand::Status { watch, json } => status(&store, *watch, *json).await,
            FleetCommand::Rollout(rollout) => Box::pin(start(&store, rollout, &me)).await,
            FleetCommand::Pause { model } => operate(&store, model, Request::Pause, &me).await,
            FleetCommand::Resume { model } => operate(&store, model, Request::Resume, &me).await,
            FleetCommand::Promote { model } => operate(&store, model, Request::Promote, &me).await,
            FleetCommand::Abort { model } => operate(&store, model, Request::Abort, &me).await,
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

async fn operate(store: &Store, model: &str, what: Request, me: &str) -> anyhow::Result<()> {
    let record = ops::request(store, model, what, me).await?;
    println!("{}", record.decisions.last().map_or("", |d| d.message.as_str()));
    Ok(())
}

/// Starts the rollout, then coordinates it to its end, printing each
/// decision; the lease it coordinates under dies with this process.
async fn start(store: &Store, rollout: &FleetRollout, me: &str) -> anyhow::Result<()> {
    if rollout.detach {
        let record = ops::start(store, &rollout.model, rollout.version, rollout.plan()?, me).await?;
        println!("{}", record.decisions.last().map_or("", |d| d.message.as_str()));
        println!("Detached: the fleet's replicas coordinate it. Follow it with `baton fleet status --watch`.");
        return Ok(());
    }
    // The coordinator key is taken before the record is written: a record
    // in progress with no coordinator is an orphan, and a replica would
    // take it over before this process could.
    let lease = store.grant(5).await?;
    let tenure = tokio::select! {
        claimed = claim(store, &rollout.model, me, lease) => claimed?,
        error = store.keep_alive(lease, 5) => return Err(error.into()),
    };
    let record = match ops::start(store, &rollout.model, rollout.version, rollout.plan()?, me).await {
        Ok(record) => record,
        Err(error) => {
            let _ = store.revoke(lease).await;
            return Err(error.into());
        }
    };
    println!("{}", record.decisions.last().map_or("", |d| d.message.as_str()));
    let health = Health::default();
    let printed = Arc::new(AtomicUsize::new(record.decisions.len()));
    let printer = print_decisions(store, &rollout.model, Arc::clone(&printed));
    let done = tokio::select! {
        done = coordinator::coordinate(store, &rollout.model, me, tenure, &health) => done?,
        error = store.keep_alive(lease, 5) => return Err(error.into()),
    };
    let _ = store.revoke(lease).await;
    printer.abort();
    for decision in done.decisions.iter().skip(printed.load(Ordering::SeqCst)) {
        println!("{}", decision.message);
    }
    if let Some(switch) = &done.switch {
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
/// `printed` (decisions are only appended while a rollout runs).
fn print_decisions(store: &Store, model: &str, printed: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
    let (store, model) = (store.clone(), model.to_owned());
    tokio::spawn(async move {
        loop {
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

async fn status(store: &Store, watch: bool, json: bool) -> anyhow::Result<()> {
    loop {
        let snapshot = snapshot(store).await?;
        let text = if json { serde_json::to_string_pretty(&snapshot)? } else { super::render_fleet::render(&snapshot) };
        let mut out = std::io::stdout().lock();
        if watch && out.is_terminal() {
            write!(out, "\x1b[2J\x1b[H")?;
        }
        writeln!(out, "{text}")?;
        out.flush()?;
        if !watch {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
