//! A replica's part in the fleet: it registers under a lease, serves what
//! the fleet committed before it reports ready, prepares candidates when a
//! rollout asks, switches when the commit arrives, publishes what it
//! observes, and, when allowed, coordinates a rollout whose coordinator
//! is gone. When the store is lost it keeps serving what it serves, and
//! converges once it is back.
//!
//! The session (one connection to etcd) does only short work: it renews
//! the lease from a task of its own, reads the records, and keeps each
//! model's view up to date from one watch. Everything long — loads,
//! prepares, waits for a switch instant, a sidecar's target loads — runs in
//! one task per model ([`converge`]), which outlives sessions. So a load
//! of any length never costs the replica its lease, and a reconnect never
//! starts a second prepare.

mod converge;
mod election;
mod model;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::threads::sync::Lock;

use crate::backoff::Backoff;
use crate::error::ClusterError;
use crate::etcd::{Event, StoreConfig, Watch};
use crate::health::Health;
use crate::node::Node;
use crate::records::{Desired, ReplicaRecord, RolloutRecord, Serving, StepSums, now_ms};
use crate::store::{Span, Store, decode, decode_all};
use election::Election;
use model::Model;

/// The first wait before the store is tried again after it was lost; it
/// doubles at each failure in a row up to [`RECONNECT_LAST`], each wait
/// spread at random up to twice as long (see [`crate::backoff`]).
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_LAST: Duration = Duration::from_secs(5);
/// A session that lasted this long starts the waits afresh; one that
/// ends sooner (a struggling etcd lets replicas join, then drops them)
/// leaves them growing.
const STEADY: Duration = Duration::from_secs(10);
/// How often sums are published, acks and the registration written.
const TICK: Duration = Duration::from_millis(500);
/// The shortest and longest time between two publications of a step's
/// observation sums.
const SUMS_MIN: Duration = Duration::from_millis(500);
const SUMS_MAX: Duration = Duration::from_secs(5);
/// Every how many ticks a replica that may coordinate counts the replicas.
const COUNT_EVERY: u64 = 10;

/// Who a replica is and how it takes part.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// The fleet's etcd and how to reach it.
    pub store: StoreConfig,
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

/// The connection and lease a replica acts under now.
#[derive(Clone)]
pub(crate) struct Session {
    pub store: Store,
    pub lease: i64,
}

/// A replica taking part in the fleet through `node`.
pub struct Participant<N: Node> {
    config: ReplicaConfig,
    node: Arc<N>,
    health: Arc<Health>,
    /// What the replica knows of each model the fleet has records for.
    models: Lock<BTreeMap<String, Arc<Model>>>,
    /// The models readiness waits for, once listed.
    required: Lock<Option<BTreeSet<String>>>,
    /// The session writes go through; none while the store is lost.
    session: tokio::sync::watch::Sender<Option<Session>>,
    /// The registration last written, and under which lease: rewritten
    /// only when it changes.
    registered: Lock<Option<(i64, ReplicaRecord)>>,
    /// The readiness last decided.
    reported: Lock<Option<Option<BTreeSet<String>>>>,
    /// The readiness last told to the node: ready only once a registration
    /// that says so is written, so that nothing sees the replica ready
    /// before the fleet does.
    told: Lock<Option<Option<BTreeSet<String>>>>,
    /// Rung when the readiness or what the node serves changed: the
    /// registration is written at once, not at the next tick.
    registration_due: tokio::sync::Notify,
    /// The per-model tasks, which live as long as the participant runs.
    tasks: Lock<BTreeMap<String, tokio::task::AbortHandle>>,
    /// Who coordinates which rollout.
    election: Election,
}

impl<N: Node> Participant<N> {
    /// A participant for `node`.
    pub fn new(config: ReplicaConfig, node: Arc<N>, health: Arc<Health>) -> Arc<Participant<N>> {
        Arc::new(Participant {
            config,
            node,
            health,
            models: Lock::default(),
            required: Lock::default(),
            session: tokio::sync::watch::channel(None).0,
            registered: Lock::default(),
            reported: Lock::default(),
            told: Lock::default(),
            registration_due: tokio::sync::Notify::new(),
            tasks: Lock::default(),
            election: Election::default(),
        })
    }

    /// Takes part until `stop` turns true; reconnects whenever the store
    /// is lost. Not ready until every model serves what the fleet
    /// committed.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        self.tell(None);
        let mut backoff = Backoff::new(RECONNECT_FIRST, RECONNECT_LAST);
        // Kept across sessions: what is known of each member (which hung,
        // which answers), their connections and the token.
        let mut last: Option<Store> = None;
        loop {
            let began = Instant::now();
            let connected = match &last {
                None => Store::connect(&self.config.store, &self.config.name).await,
                Some(store) => store.reconnect().await,
            };
            let why = match connected {
                Ok(store) => {
                    last = Some(store.clone());
                    match self.session(&store, &mut stop).await {
                        Ok(()) => break,
                        Err(error) => error,
                    }
                }
                Err(error) => error,
            };
            self.session.send_replace(None);
            self.election.stop_all();
            // A session that joined and held starts the waits afresh.
            if self.health.connected() && began.elapsed() >= STEADY {
                backoff.reset();
            }
            if self.health.connected() || self.health.state().disconnected_since_ms.is_none() {
                tracing::warn!(replica = %self.config.id, error = %why, "Lost the cluster store; serving what is served, and retrying.");
            }
            self.health.disconnect(why.to_string());
            tokio::select! {
                () = tokio::time::sleep(backoff.next_wait()) => {}
                _ = stop.changed() => break,
            }
            if *stop.borrow() {
                break;
            }
        }
        self.session.send_replace(None);
        self.election.stop_all();
        for (_, task) in std::mem::take(&mut *self.tasks.lock()) {
            task.abort();
        }
    }

    /// One connection to the store, until it is lost (an error) or the
    /// replica stops.
    async fn session(
        self: &Arc<Self>,
        store: &Store,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), ClusterError> {
        let lease = self.lease_for(store).await?;
        // Renewed from a task of its own: nothing the session awaits can
        // delay it. When its member is slow to renew it, the lease is
        // renewed through another as well; the session follows it there
        // only if its own member no longer answers.
        let endpoint = store.endpoint();
        let (via, mut moved) = tokio::sync::watch::channel(endpoint.clone());
        let keeper = tokio::spawn({
            let (store, ttl) = (store.clone(), self.config.lease_ttl);
            async move { store.keep_alive_via(lease, ttl, &via).await }
        });
        let _keeper_guard = AbortOnDrop(keeper.abort_handle());
        self.session.send_replace(Some(Session { store: store.clone(), lease }));
        // Registered at once, not ready: a replica whose first load takes
        // minutes is in the fleet meanwhile.
        self.register(store, lease).await?;
        let prefixes = self.watched(store);
        let mut watch = self.resync(store, lease, &prefixes).await?;
        self.join(store).await?;
        self.health.connect(&endpoint);
        tracing::info!(replica = %self.config.id, cluster = %self.config.name, %endpoint, "Joined the fleet.");

        let mut keeper = keeper;
        // A new process of an upgrade acts for the replica only once it
        // serves (see `Health::own_lease`).
        let mut acting = self.health.acting();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u64 = 0;
        loop {
            let due = self.election.next_due();
            tokio::select! {
                ended = &mut keeper => return Err(self.keeper_ended(ended)),
                changed = moved.changed() => {
                    if changed.is_err() {
                        // The keeper ended: it says why.
                        return Err(self.keeper_ended((&mut keeper).await));
                    }
                    let now = moved.borrow_and_update().clone();
                    if now != endpoint {
                        // A member that was only slow (a leader's stall
                        // slows them all) keeps the session: its watch and
                        // the coordinators it runs go on.
                        match store.answers().await {
                            Ok(()) => tracing::info!(replica = %self.config.id, session = %endpoint, lease = %now, "The lease is renewed through another etcd member; the session stays with its own, which answers."),
                            Err(error) => return Err(ClusterError::Unreachable(format!(
                                "etcd member {endpoint} did not renew the lease in time, nor answer a read ({}); the lease is renewed through {now}",
                                error.detail()
                            ))),
                        }
                    }
                }
                events = watch.next() => match events {
                    Ok(events) => self.apply(events),
                    Err(ClusterError::Compacted(why)) => {
                        tracing::warn!(replica = %self.config.id, %why, "The store compacted what this replica watched; reading it again.");
                        watch = self.resync(store, lease, &prefixes).await?;
                    }
                    Err(error) => return Err(error),
                },
                _ = tick.tick() => {
                    ticks += 1;
                    self.on_tick(store, lease, ticks).await?;
                }
                () = self.registration_due.notified() => self.register(store, lease).await?,
                () = tokio::time::sleep_until(due.into()), if self.config.coordinate && acting && self.health.acting() => {
                    self.election.campaign_due(self, store, lease).await;
                }
                () = self.health.until_acting(), if !acting => {
                    acting = true;
                    tracing::info!(replica = %self.config.id, "This process acts for the replica from now on.");
                    self.register(store, lease).await?;
                    if self.config.coordinate {
                        self.election.resume_held(self, store, lease).await;
                    }
                }
                _ = stop.changed() => {
                    if *stop.borrow() {
                        self.election.stop_all();
                        // A lease shared with the process that replaces
                        // this one (or that this one failed to replace)
                        // lives on in it.
                        if !self.health.shares(lease) {
                            let _ = store.revoke(lease).await;
                        }
                        self.health.set_lease(None);
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Why the lease's keeper ended; a lease etcd says expired is counted
    /// and forgotten.
    fn keeper_ended(&self, ended: Result<ClusterError, tokio::task::JoinError>) -> ClusterError {
        let error = ended.unwrap_or_else(|e| ClusterError::Unreachable(format!("the keep-alive task ended: {e}")));
        if matches!(error, ClusterError::LeaseLost(_)) {
            self.health.lease_lost();
            self.health.set_lease(None);
        }
        error
    }

    /// The lease to act under: the last session's, or the one inherited
    /// from the process this one replaces, while it is alive (so the
    /// registration, acks and coordinator keys under it stay), else a new
    /// one.
    async fn lease_for(&self, store: &Store) -> Result<i64, ClusterError> {
        let previous = self.health.lease();
        if let Some(lease) = previous {
            if store.renew(lease).await? {
                return Ok(lease);
            }
            self.health.lease_lost();
            tracing::warn!(replica = %self.config.id, lease = format!("{lease:x}"), "The replica's lease expired while the store was lost; registering again.");
        }
        let lease = store.grant(self.config.lease_ttl).await?;
        self.health.set_lease(Some(lease));
        *self.registered.lock() = None;
        Ok(lease)
    }

    /// What the session watches.
    fn watched(&self, store: &Store) -> Vec<Span> {
        let keys = &store.keys;
        let mut prefixes = vec![keys.records(), keys.desired_all()];
        if self.config.coordinate {
            prefixes.push(keys.coordinators());
        }
        Span::prefixes(&prefixes)
    }

    /// Reads every watched record at one revision, takes them in, and
    /// watches from the next revision: nothing between is missed.
    async fn resync(self: &Arc<Self>, store: &Store, lease: i64, prefixes: &[Span]) -> Result<Watch, ClusterError> {
        let (lists, revision) = store.snapshot(prefixes).await?;
        let mut lists = lists.into_iter();
        for read in decode_all::<RolloutRecord>(lists.next().unwrap_or_default()) {
            let model = read.value.model.clone();
            self.election.observe_record(&model, read.value.phase.in_progress());
            self.model(&model).update(|v| v.set_record(read.value, read.revision));
        }
        for read in decode_all::<Desired>(lists.next().unwrap_or_default()) {
            let model = read.name().to_owned();
            self.model(&model).update(|v| v.set_desired(read.value, read.revision));
        }
        if self.config.coordinate {
            self.election.reset(lists.next().unwrap_or_default());
            if self.health.acting() {
                self.election.resume_held(self, store, lease).await;
            }
        }
        store.watch(prefixes, revision + 1).await
    }

    /// Takes in what the watch delivered.
    fn apply(self: &Arc<Self>, events: Vec<Event>) {
        let Some(keys) = self.session.borrow().as_ref().map(|s| s.store.keys.clone()) else { return };
        for event in events {
            let name = crate::keys::Keys::last(&event.key).to_owned();
            if event.key.starts_with(&keys.records()) {
                let Some(value) = &event.value else { continue };
                match decode::<RolloutRecord>(&event.key, value) {
                    Ok(record) => {
                        self.election.observe_record(&record.model, record.phase.in_progress());
                        let model = record.model.clone();
                        self.model(&model).update(|v| v.set_record(record, event.revision));
                    }
                    Err(error) => {
                        tracing::warn!(key = %event.key, %error, "Skipped a cluster record that cannot be read.")
                    }
                }
            } else if event.key.starts_with(&keys.desired_all()) {
                let Some(value) = &event.value else { continue };
                match decode::<Desired>(&event.key, value) {
                    Ok(desired) => self.model(&name).update(|v| v.set_desired(desired, event.revision)),
                    Err(error) => {
                        tracing::warn!(key = %event.key, %error, "Skipped a cluster record that cannot be read.")
                    }
                }
            } else if event.key.starts_with(&keys.coordinators()) {
                self.election.observe_key(&name, event.value.is_some().then_some((event.create_revision, event.lease)));
            }
        }
    }

    /// The view of `model`, made on first use.
    fn model(&self, model: &str) -> Arc<Model> {
        Arc::clone(self.models.lock().entry(model.to_owned()).or_insert_with(|| Arc::new(Model::new(model))))
    }

    /// Lists the models the node can serve, seeds the fleet's version of
    /// any it has none for, and starts a task for each that has none yet.
    async fn join(self: &Arc<Self>, store: &Store) -> Result<(), ClusterError> {
        let available = match self.node.available().await {
            Ok(available) => available,
            Err(refusal) => {
                tracing::error!(replica = %self.config.id, %refusal, "Could not list the models to serve.");
                if self.required.lock().is_some() {
                    return Ok(());
                }
                BTreeMap::new()
            }
        };
        let mut required = BTreeSet::new();
        for (name, newest) in available {
            let model = self.model(&name);
            let known = model.view.lock().desired.is_some();
            if !known {
                let Some(newest) = newest else { continue };
                let seed = Desired { version: newest, rollout: None, at_ms: now_ms() };
                match store.create(&store.keys.desired(&name), &seed, None).await? {
                    Some(revision) => {
                        tracing::info!(model = %name, version = newest, "Seeded the fleet's version of a model.");
                        model.update(|v| v.set_desired(seed, revision));
                    }
                    None => {
                        if let Some(read) = store.get::<Desired>(&store.keys.desired(&name)).await? {
                            model.update(|v| v.set_desired(read.value, read.revision));
                        }
                    }
                }
            }
            required.insert(name);
        }
        // Every model is required before any converges: readiness then
        // waits for all of them, not for the first.
        *self.required.lock() = Some(required.clone());
        for name in required {
            self.start_task(&name);
        }
        self.report_ready();
        Ok(())
    }

    /// Starts the task that converges `model`, unless it runs.
    fn start_task(self: &Arc<Self>, name: &str) {
        let mut tasks = self.tasks.lock();
        if tasks.contains_key(name) {
            return;
        }
        let task = tokio::spawn(Arc::clone(self).converge(self.model(name)));
        tasks.insert(name.to_owned(), task.abort_handle());
    }

    /// Ready once every required model serves what the fleet committed.
    fn report_ready(&self) {
        let required = self.required.lock().clone();
        let ready = required.filter(|required| {
            let models = self.models.lock();
            required.iter().all(|m| {
                models.get(m).is_some_and(|m| {
                    let view = m.view.lock();
                    view.settled && view.problem.is_none()
                })
            })
        });
        let mut reported = self.reported.lock();
        if reported.as_ref() != Some(&ready) {
            *reported = Some(ready.clone());
            drop(reported);
            // Not ready is told at once; ready once the registration says
            // so, or at once while the store is lost (nothing to write to;
            // the registration follows at the reconnect).
            if ready.is_none() || self.session.borrow().is_none() {
                self.tell(ready);
            }
            self.registration_due.notify_one();
        }
    }

    /// Tells the node its readiness, when it changed.
    fn tell(&self, ready: Option<BTreeSet<String>>) {
        let mut told = self.told.lock();
        if told.as_ref() != Some(&ready) {
            *told = Some(ready.clone());
            drop(told);
            self.node.set_ready(ready);
        }
    }

    /// The short, periodic work: acks not yet written under this lease,
    /// observation sums, the registration, and a count of the replicas.
    async fn on_tick(self: &Arc<Self>, store: &Store, lease: i64, ticks: u64) -> Result<(), ClusterError> {
        let models: Vec<Arc<Model>> = self.models.lock().values().cloned().collect();
        for model in &models {
            self.write_ack(model).await;
        }
        Box::pin(self.publish_sums(store, &models)).await?;
        self.register(store, lease).await?;
        if self.config.coordinate && ticks % COUNT_EVERY == 1 {
            self.health.replicas(store.count(&store.keys.replicas()).await?);
        }
        Ok(())
    }

    /// Publishes what each committed step's rollout observed here: the
    /// sums of the whole step so far, every tenth of the plan's interval
    /// (between 0.5 and 5 s), so that the fleet's writes stay few. A new
    /// process of an upgrade gathers its sums but publishes them only once
    /// it acts for the replica: until then the old process's totals stand
    /// (its own start from zero, and would overwrite them).
    async fn publish_sums(&self, store: &Store, models: &[Arc<Model>]) -> Result<(), ClusterError> {
        for model in models {
            let committed = {
                let view = model.view.lock();
                view.record.as_ref().map(|(r, _)| r.clone()).filter(|r| {
                    r.phase == crate::records::FleetPhase::Committed && r.participants.contains(&self.config.id)
                })
            };
            let Some(record) = committed else { continue };
            let Some(step) = record.step else { continue };
            let every = Duration::from_millis(record.plan.interval_ms / 10).clamp(SUMS_MIN, SUMS_MAX);
            let report = {
                let mut view = model.view.lock();
                if let Some(sums) = self.node.take_sums(&model.name) {
                    match &mut view.sums {
                        Some((id, s, total)) if *id == record.id && *s == step => total.merge(&sums),
                        other => *other = Some((record.id, step, sums)),
                    }
                    view.sums_changed = true;
                }
                let due = view.sums_published.is_none_or(|at| at.elapsed() >= every);
                if !(due && view.sums_changed && self.health.acting()) {
                    continue;
                }
                view.sums.as_ref().map(|(_, _, total)| StepSums { rollout: record.id, step, sums: total.clone() })
            };
            if let Some(report) = report {
                store.put(&store.keys.sums(&model.name, &self.config.id), &report, None).await?;
                let mut view = model.view.lock();
                view.sums_published = Some(Instant::now());
                view.sums_changed = false;
            }
        }
        Ok(())
    }

    /// Writes the replica's registration under the lease, when it changed
    /// and this process acts for the replica. Then tells the node it is
    /// ready, if the registration says so and that is still what was
    /// decided.
    async fn register(&self, store: &Store, lease: i64) -> Result<(), ClusterError> {
        let decided = self.reported.lock().clone().flatten();
        let ready = decided.is_some();
        if !self.health.acting() {
            // The new process of an upgrade writes nothing until it acts,
            // and acts only once it serves: it is told at once, as when
            // there is no store to write to.
            if ready {
                self.tell(decided);
            }
            return Ok(());
        }
        let required = self.required.lock().clone().unwrap_or_default();
        let models: BTreeMap<String, Serving> = required.iter().map(|m| (m.clone(), self.node.serving(m))).collect();
        let record = ReplicaRecord {
            id: self.config.id.clone(),
            address: self.config.address.clone(),
            labels: self.config.labels.clone(),
            models,
            ready,
            agent: self.config.agent,
            note: self.health.state().problems.values().next().cloned(),
            since_ms: 0,
        };
        let since_ms = {
            let registered = self.registered.lock();
            match registered.as_ref() {
                Some((l, r)) if *l == lease && *r == record => None,
                _ => Some(now_ms()),
            }
        };
        if let Some(since_ms) = since_ms {
            let written = ReplicaRecord { since_ms, ..record.clone() };
            store.put(&store.keys.replica(&self.config.id), &written, Some(lease)).await?;
            *self.registered.lock() = Some((lease, record));
        }
        if ready && self.reported.lock().clone().flatten() == decided {
            self.tell(decided);
        }
        Ok(())
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
