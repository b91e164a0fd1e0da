//! A replica's part in the fleet: it registers under a lease, serves what
//! the fleet committed before it reports ready, prepares candidates when a
//! rollout asks, switches when the commit arrives, publishes what it
//! observes, and, when allowed, coordinates a rollout whose coordinator
//! is gone. When the store is lost it keeps serving what it serves, and
//! converges once it is back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::rollout::window::Sums;
use baton_core::sync::Lock;
use etcd_client::EventType;

use crate::coordinator;
use crate::error::ClusterError;
use crate::health::Health;
use crate::node::{Node, Refusal};
use crate::records::{
    Ack, Desired, FleetPhase, ReplicaRecord, RolloutRecord, Serving, StepSums, Switched, now_ms, now_us,
};
use crate::store::Store;

/// How long to wait, on average, before trying the store again.
const RETRY: Duration = Duration::from_millis(500);

/// [`RETRY`], spread by ±50 % at random: replicas that lost the store
/// together do not all come back at the same instant.
fn retry_after() -> Duration {
    let spread = baton_core::rollout::assign::random_bucket(); // 0..10,000
    RETRY / 2 + RETRY * spread / 10_000
}
/// How often sums are published and the registration refreshed.
const TICK: Duration = Duration::from_millis(500);
/// Every how many ticks a replica that may coordinate counts the
/// replicas, and a convergence that failed is tried again.
const COUNT_EVERY: u64 = 10;

/// The records a watch message puts, with their keys; a record that
/// cannot be read is skipped with a warning. An error or the end of the
/// watch is the store lost.
fn puts<T: serde::de::DeserializeOwned>(
    message: Result<Option<etcd_client::WatchResponse>, etcd_client::Error>,
) -> Result<Vec<(String, T)>, ClusterError> {
    let response = message?.ok_or_else(|| ClusterError::Unreachable("the watch ended".into()))?;
    let mut records = Vec::new();
    for kv in response.events().iter().filter(|e| e.event_type() == EventType::Put).filter_map(|e| e.kv()) {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        match serde_json::from_slice(kv.value()) {
            Ok(record) => records.push((key, record)),
            Err(error) => tracing::warn!(%key, %error, "Skipped a cluster record that cannot be read."),
        }
    }
    Ok(records)
}

/// Waits until the record's switch time on this replica's clock; at once
/// when there is none or it has passed. The commit is durable before any
/// replica sees it, so however this clock is off, no replica switches to
/// a version the fleet did not commit.
async fn wait_for_switch_time(record: &RolloutRecord) {
    if let Some(at) = record.switch_at_us {
        let now = now_us();
        if at > now {
            tokio::time::sleep(Duration::from_micros(at - now)).await;
        }
    }
}

/// Who a replica is and how it takes part.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// The etcd endpoints: `etcd://HOST:PORT[,HOST:PORT]`.
    pub cluster: String,
    /// The cluster's name: its keys live under `/baton/<name>/`.
    pub name: String,
    /// The replica's ID, unique in the cluster.
    pub id: String,
    /// Where it serves inference, for people and load balancers.
    pub address: String,
    /// Its labels, for gray release by selector.
    pub labels: BTreeMap<String, String>,
    /// Its lease's time to live, in seconds: a replica that dies is gone
    /// from the fleet this long after.
    pub lease_ttl: i64,
    /// Whether it takes over rollouts whose coordinator is gone.
    pub coordinate: bool,
    /// A sidecar agent speaking for another server.
    pub agent: bool,
}

/// What a replica remembers of one model's rollout.
#[derive(Debug, Default)]
struct Local {
    /// The rollout it prepared for (or is preparing for).
    acked: Option<u64>,
    /// The last switch it made: rollout, phase, step.
    switched: Option<(u64, FleetPhase, Option<usize>)>,
    /// What it observed during the committed step.
    sums: Option<(u64, usize, Sums)>,
    /// The latest record seen.
    record: Option<RolloutRecord>,
}

/// A replica taking part in the fleet through `node`.
pub struct Participant<N: Node> {
    config: ReplicaConfig,
    node: Arc<N>,
    health: Arc<Health>,
    local: Lock<BTreeMap<String, Local>>,
    /// The models readiness waits for, once converged.
    required: Lock<Option<BTreeSet<String>>>,
    /// Models being converged, with the version: not ready until done.
    /// One that failed is tried again every few seconds.
    converging: Lock<BTreeMap<String, u64>>,
    /// Rollouts this replica coordinates, under this session's lease.
    coordinating: Lock<BTreeMap<String, tokio::task::AbortHandle>>,
    /// The registration last written, and under which lease: rewritten
    /// only when it changes.
    registered: Lock<Option<(i64, ReplicaRecord)>>,
}

impl<N: Node> Participant<N> {
    /// A participant for `node`.
    pub fn new(config: ReplicaConfig, node: Arc<N>, health: Arc<Health>) -> Arc<Participant<N>> {
        Arc::new(Participant {
            config,
            node,
            health,
            local: Lock::default(),
            required: Lock::default(),
            converging: Lock::default(),
            coordinating: Lock::default(),
            registered: Lock::default(),
        })
    }

    /// Takes part until `stop` turns true; reconnects whenever the store
    /// is lost. Not ready until the first convergence.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        self.node.set_ready(None);
        loop {
            let why = match Store::connect(&self.config.cluster, &self.config.name).await {
                Ok(store) => match self.session(&store, &mut stop).await {
                    Ok(()) => return,
                    Err(error) => error,
                },
                Err(error) => error,
            };
            if self.health.connected() || self.health.state().disconnected_since_ms.is_none() {
                tracing::warn!(replica = %self.config.id, error = %why, "Lost the cluster store; serving what is served, and retrying.");
            }
            self.health.disconnect(why.to_string());
            tokio::select! {
                () = tokio::time::sleep(retry_after()) => {}
                _ = stop.changed() => return,
            }
            if *stop.borrow() {
                return;
            }
        }
    }

    /// One connection to the store, until it is lost (an error) or the
    /// replica stops.
    async fn session(
        self: &Arc<Self>,
        store: &Store,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), ClusterError> {
        let result = self.connected(store, stop).await;
        // What it coordinated, it did under this session's lease, which is
        // gone or going: another process takes over from the record.
        for (_, task) in std::mem::take(&mut *self.coordinating.lock()) {
            task.abort();
        }
        result
    }

    async fn connected(
        self: &Arc<Self>,
        store: &Store,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), ClusterError> {
        let keys = &store.keys;
        let lease = store.grant(self.config.lease_ttl).await?;
        // Acks written under an earlier lease are gone with it: ack again.
        self.local.lock().values_mut().for_each(|l| l.acked = None);
        let (desired, revision) = store.list::<Desired>(&keys.desired_all()).await?;
        let desired: BTreeMap<String, Desired> = desired.into_iter().map(|d| (d.name().to_owned(), d.value)).collect();
        // Rollouts first: a candidate resident for a rollout that committed
        // meanwhile is promoted (one store) rather than loaded again.
        let (records, _) = store.list::<RolloutRecord>(&keys.records()).await?;
        for record in records {
            self.apply(store, lease, record.value).await;
        }
        self.converge_all(store, desired).await?;
        self.register(store, lease).await?;
        self.health.connect();
        tracing::info!(replica = %self.config.id, cluster = %self.config.name, "Joined the fleet.");

        let mut records = store.watch(&keys.records(), revision + 1).await?;
        let mut desired = store.watch(&keys.desired_all(), revision + 1).await?;
        let keep_alive = store.keep_alive(lease, self.config.lease_ttl);
        tokio::pin!(keep_alive);
        let mut tick = tokio::time::interval(TICK);
        let mut ticks: u64 = 0;
        loop {
            tokio::select! {
                error = &mut keep_alive => return Err(error),
                message = records.message() => {
                    for (_, record) in puts::<RolloutRecord>(message)? {
                        self.apply(store, lease, record).await;
                    }
                }
                message = desired.message() => {
                    for (key, d) in puts::<Desired>(message)? {
                        self.follow_desired(crate::keys::Keys::last(&key), d.version).await;
                    }
                }
                _ = tick.tick() => {
                    ticks += 1;
                    Box::pin(self.publish_sums(store)).await?;
                    self.register(store, lease).await?;
                    if ticks.is_multiple_of(COUNT_EVERY) {
                        let failed: Vec<(String, u64)> =
                            self.converging.lock().iter().map(|(m, v)| (m.clone(), *v)).collect();
                        for (model, version) in failed {
                            self.converge(&model, version).await;
                        }
                    }
                    if self.config.coordinate {
                        self.take_over(store, lease).await;
                        // Now and then: how many replicas are live, for
                        // status and metrics.
                        if ticks % COUNT_EVERY == 1 {
                            let (replicas, _) = store.list::<ReplicaRecord>(&keys.replicas()).await?;
                            self.health.replicas(replicas.len());
                        }
                    }
                }
                _ = stop.changed() => {
                    if *stop.borrow() {
                        let _ = store.revoke(lease).await;
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Serves, for every model the node can serve, what the fleet
    /// committed; a model the fleet has no version for is seeded with the
    /// node's newest, unless another replica seeds it first.
    async fn converge_all(
        self: &Arc<Self>,
        store: &Store,
        desired: BTreeMap<String, Desired>,
    ) -> Result<(), ClusterError> {
        let available = match self.node.available().await {
            Ok(available) => available,
            Err(refusal) => {
                tracing::error!(replica = %self.config.id, %refusal, "Could not list the models to serve.");
                BTreeMap::new()
            }
        };
        let mut targets = Vec::new();
        for (model, newest) in available {
            let target = match desired.get(&model) {
                Some(d) => d.version,
                None => {
                    let Some(newest) = newest else { continue };
                    let seed = Desired { version: newest, rollout: None, at_ms: now_ms() };
                    if store.create(&store.keys.desired(&model), &seed, None).await? {
                        tracing::info!(model = %model, version = newest, "Seeded the fleet's version of a model.");
                        newest
                    } else {
                        match store.get::<Desired>(&store.keys.desired(&model)).await? {
                            Some(d) => d.value.version,
                            None => newest,
                        }
                    }
                }
            };
            targets.push((model, target));
        }
        // Every model is required before any converges: readiness then
        // waits for all of them, not for the first.
        *self.required.lock() = Some(targets.iter().map(|(m, _)| m.clone()).collect());
        for (model, target) in targets {
            self.converge(&model, target).await;
        }
        self.report_ready();
        Ok(())
    }

    /// Serves `version` of `model` as stable; not ready meanwhile.
    async fn converge(&self, model: &str, version: u64) {
        // A candidate beside it is the rollouts' business, not this.
        if self.node.serving(model).stable == Some(version) {
            if self.converging.lock().remove(model).is_some() {
                self.report_ready();
            }
            return;
        }
        self.converging.lock().insert(model.to_owned(), version);
        self.report_ready();
        tracing::info!(model, version, replica = %self.config.id, "Converging on the version the fleet committed.");
        match self.node.converge(model, version).await {
            Ok(()) => {
                self.converging.lock().remove(model);
                tracing::info!(model, version, "Converged.");
            }
            Err(refusal) => {
                // It stays not ready: it cannot serve what the fleet serves.
                tracing::error!(
                    model,
                    version,
                    %refusal,
                    "Could not converge on the fleet's version; not ready, and trying again in a few seconds."
                );
            }
        }
        self.report_ready();
    }

    /// Ready once every required model converged.
    fn report_ready(&self) {
        let required = self.required.lock().clone();
        let converging = !self.converging.lock().is_empty();
        self.node.set_ready(if converging { None } else { required });
    }

    /// A committed version changed outside a rollout this replica took
    /// part in: follow it, unless a rollout of the model is in progress.
    async fn follow_desired(self: &Arc<Self>, model: &str, version: u64) {
        let in_progress = self
            .local
            .lock()
            .get(model)
            .and_then(|l| l.record.as_ref())
            .is_some_and(|r| r.phase.in_progress() || (r.phase == FleetPhase::Promoted && r.version == version));
        if !in_progress && self.node.serving(model).stable.is_some() {
            self.converge(model, version).await;
        }
    }

    /// Acts on a rollout record: prepare, switch, promote or drop. Boxed:
    /// it spawns a prepare that may apply again, so the future's type would
    /// otherwise contain itself.
    fn apply<'a>(
        self: &'a Arc<Self>,
        store: &'a Store,
        lease: i64,
        record: RolloutRecord,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(self.apply_now(store, lease, record))
    }

    async fn apply_now(self: &Arc<Self>, store: &Store, lease: i64, record: RolloutRecord) {
        let me = self.config.id.clone();
        let model = record.model.clone();
        self.local.lock().entry(model.clone()).or_default().record = Some(record.clone());
        let serving = self.node.serving(&model);
        let holds_candidate = serving.candidate == Some(record.version);
        match record.phase {
            FleetPhase::Preparing if record.participants.contains(&me) => {
                let fresh = {
                    let mut local = self.local.lock();
                    let entry = local.entry(model.clone()).or_default();
                    let fresh = entry.acked != Some(record.id);
                    entry.acked = Some(record.id);
                    fresh
                };
                if fresh {
                    let this = Arc::clone(self);
                    let store = store.clone();
                    tokio::spawn(async move { this.prepare(&store, lease, record).await });
                }
            }
            FleetPhase::Committed if record.members.contains(&me) && holds_candidate => {
                let key = (record.id, FleetPhase::Committed, record.step);
                if self.switched(&model) != Some(key) {
                    let seen_us = now_us();
                    wait_for_switch_time(&record).await;
                    let result = self.node.share_all(&model).await;
                    self.report_switch(store, &record, key, seen_us, result).await;
                }
            }
            FleetPhase::Promoted => {
                let key = (record.id, FleetPhase::Promoted, record.step);
                if holds_candidate && self.switched(&model) != Some(key) {
                    let seen_us = now_us();
                    wait_for_switch_time(&record).await;
                    let result = self.node.promote(&model).await;
                    self.report_switch(store, &record, key, seen_us, result).await;
                } else if serving.stable.is_some() && serving.stable != Some(record.version) && !holds_candidate {
                    // It missed the commit, or was left out: a whole load.
                    self.converge(&model, record.version).await;
                }
            }
            FleetPhase::RolledBack | FleetPhase::Aborted if holds_candidate => {
                let rolled_back = record.phase == FleetPhase::RolledBack;
                if let Err(refusal) = self.node.drop_candidate(&model, rolled_back).await {
                    tracing::error!(model = %model, %refusal, "Could not drop the candidate of an ended fleet rollout.");
                }
            }
            _ => {}
        }
    }

    fn switched(&self, model: &str) -> Option<(u64, FleetPhase, Option<usize>)> {
        self.local.lock().get(model).and_then(|l| l.switched)
    }

    /// Records a switch: when it happened and how long after the commit
    /// write, in the store and in health.
    async fn report_switch(
        &self,
        store: &Store,
        record: &RolloutRecord,
        key: (u64, FleetPhase, Option<usize>),
        seen_us: u64,
        result: Result<(), Refusal>,
    ) {
        let at_us = now_us();
        let model = &record.model;
        if let Err(refusal) = result {
            tracing::error!(model = %model, version = record.version, %refusal, "Could not switch as the fleet committed.");
            return;
        }
        self.local.lock().entry(model.clone()).or_default().switched = Some(key);
        let delay_us = at_us as i64 - record.commit_us.unwrap_or(at_us) as i64;
        self.health.switched(model, delay_us as f64 / 1e6);
        let report = Switched { rollout: record.id, phase: key.1, step: key.2, at_us, seen_us, delay_us };
        if let Err(error) = store.put(&store.keys.switched(model, &self.config.id), &report, None).await {
            tracing::warn!(model = %model, %error, "Could not report the switch.");
        }
    }

    /// Prepares the candidate and acks under the lease; if the rollout
    /// moved on meanwhile, acts on where it is now.
    async fn prepare(self: Arc<Self>, store: &Store, lease: i64, record: RolloutRecord) {
        let model = record.model.clone();
        let started = Instant::now();
        tracing::info!(model = %model, version = record.version, "Preparing a fleet rollout's candidate.");
        let result = self.node.prepare(&model, record.version).await;
        let prepare_ms = started.elapsed().as_millis() as u64;
        self.health.prepared(&model, started.elapsed().as_secs_f64());
        let mut ack = Ack { rollout: record.id, ok: result.is_ok(), stage: None, reason: None, prepare_ms };
        match result {
            Ok(()) => tracing::info!(model = %model, version = record.version, prepare_ms, "Prepared."),
            Err(r) => {
                tracing::warn!(model = %model, version = record.version, refusal = %r, "Could not prepare.");
                (ack.stage, ack.reason) = (Some(r.stage), Some(r.reason));
            }
        }
        if let Err(error) = store.put(&store.keys.ack(&model, &self.config.id), &ack, Some(lease)).await {
            tracing::warn!(model = %model, %error, "Could not ack the prepare.");
        }
        // The rollout may have ended (or committed) while this one loaded.
        if let Ok(Some(now)) = store.get::<RolloutRecord>(&store.keys.record(&model)).await
            && now.value.id == record.id
            && now.value.phase != FleetPhase::Preparing
        {
            self.apply(store, lease, now.value).await;
        }
    }

    /// Publishes what each committed step's rollout observed here.
    async fn publish_sums(&self, store: &Store) -> Result<(), ClusterError> {
        let committed: Vec<RolloutRecord> = self
            .local
            .lock()
            .values()
            .filter_map(|l| l.record.clone())
            .filter(|r| r.phase == FleetPhase::Committed && r.participants.contains(&self.config.id))
            .collect();
        for record in committed {
            let Some(step) = record.step else { continue };
            let Some(sums) = self.node.take_sums(&record.model) else { continue };
            let report = {
                let mut local = self.local.lock();
                let entry = local.entry(record.model.clone()).or_default();
                match &mut entry.sums {
                    Some((id, s, total)) if *id == record.id && *s == step => total.merge(&sums),
                    other => *other = Some((record.id, step, sums)),
                }
                entry.sums.as_ref().map(|(_, _, total)| StepSums { rollout: record.id, step, sums: total.clone() })
            };
            if let Some(report) = report {
                store.put(&store.keys.sums(&record.model, &self.config.id), &report, None).await?;
            }
        }
        Ok(())
    }

    /// Writes the replica's registration under the lease.
    async fn register(&self, store: &Store, lease: i64) -> Result<(), ClusterError> {
        let required = self.required.lock().clone().unwrap_or_default();
        let models: BTreeMap<String, Serving> = required.iter().map(|m| (m.clone(), self.node.serving(m))).collect();
        let converging = !self.converging.lock().is_empty();
        let record = ReplicaRecord {
            id: self.config.id.clone(),
            address: self.config.address.clone(),
            labels: self.config.labels.clone(),
            models,
            ready: !converging && !required.is_empty(),
            agent: self.config.agent,
            note: self.health.state().last_error,
            since_ms: 0,
        };
        if self.registered.lock().as_ref().is_some_and(|(l, r)| *l == lease && *r == record) {
            return Ok(());
        }
        let written = ReplicaRecord { since_ms: now_ms(), ..record.clone() };
        store.put(&store.keys.replica(&self.config.id), &written, Some(lease)).await?;
        *self.registered.lock() = Some((lease, record));
        Ok(())
    }

    /// Coordinates any rollout in progress whose coordinator is gone.
    async fn take_over(self: &Arc<Self>, store: &Store, lease: i64) {
        let orphans: Vec<String> = self
            .local
            .lock()
            .iter()
            .filter(|(_, l)| l.record.as_ref().is_some_and(|r| r.phase.in_progress()))
            .map(|(m, _)| m.clone())
            .collect();
        for model in orphans {
            if self.coordinating.lock().contains_key(&model) {
                continue;
            }
            match coordinator::campaign(store, &model, &self.config.id, lease).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(error) => {
                    tracing::debug!(model = %model, %error, "Could not campaign to coordinate.");
                    continue;
                }
            }
            tracing::info!(model = %model, replica = %self.config.id, "Coordinating a fleet rollout whose coordinator is gone.");
            let this = Arc::clone(self);
            let (store, coordinated) = (store.clone(), model.clone());
            // Held while spawning, so the task cannot remove its entry
            // before it is there.
            let mut coordinating = self.coordinating.lock();
            let task = tokio::spawn(async move {
                let model = coordinated;
                if let Err(error) = coordinator::coordinate(&store, &model, &this.config.id, &this.health).await {
                    tracing::warn!(model = %model, %error, "Stopped coordinating a fleet rollout.");
                }
                coordinator::resign(&store, &model).await;
                this.coordinating.lock().remove(&model);
            });
            coordinating.insert(model, task.abort_handle());
        }
    }
}
