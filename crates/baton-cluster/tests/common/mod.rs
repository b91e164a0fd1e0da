//! The fixture the fault tests share: a real etcd, and replicas whose
//! registries serve fake models whose loads a test can hold (the fake
//! backend's gate) and whose switches and prepares it can make fail.

#![allow(dead_code)]

pub mod proxy;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_cluster::node::{Node, Refusal};
use baton_cluster::ops;
use baton_cluster::records::{Ack, Desired, FleetPlan, ReplicaRecord, RolloutRecord, Serving};
use baton_cluster::{Health, Participant, RegistryNode, ReplicaConfig, Store, StoreConfig, coordinator};
use baton_core::registry::Registry;
use baton_core::rollout::window::Sums;
use baton_core::threads::sync::Lock;
use baton_testkit::etcd::Etcd;
use baton_testkit::fake::{FAKE_TOML, FakeBackend, Gate};
use baton_testkit::repo::TestRepo;

pub const LONG: Duration = Duration::from_secs(60);
pub const TTL: i64 = 1;

/// Sends what baton logs to the test's output, filtered by `RUST_LOG`.
pub fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A registry node whose switches and prepares fail while told to.
struct Flaky {
    inner: RegistryNode,
    pub fail_switch: Arc<AtomicBool>,
    pub fail_prepare: Arc<AtomicBool>,
}

fn injected(what: &str) -> Refusal {
    Refusal { stage: "switch".into(), reason: format!("the test failed this {what}") }
}

impl Node for Flaky {
    async fn available(&self) -> Result<std::collections::BTreeMap<String, Option<u64>>, Refusal> {
        self.inner.available().await
    }
    fn serving(&self, model: &str) -> Serving {
        self.inner.serving(model)
    }
    async fn prepare(&self, model: &str, version: u64) -> Result<(), Refusal> {
        if self.fail_prepare.load(Ordering::SeqCst) {
            return Err(Refusal { stage: "load".into(), reason: "the test failed this prepare".into() });
        }
        self.inner.prepare(model, version).await
    }
    async fn share_all(&self, model: &str) -> Result<(), Refusal> {
        if self.fail_switch.load(Ordering::SeqCst) {
            return Err(injected("share"));
        }
        self.inner.share_all(model).await
    }
    async fn promote(&self, model: &str) -> Result<(), Refusal> {
        if self.fail_switch.load(Ordering::SeqCst) {
            return Err(injected("promote"));
        }
        self.inner.promote(model).await
    }
    async fn drop_candidate(&self, model: &str, rolled_back: bool) -> Result<(), Refusal> {
        if self.fail_switch.load(Ordering::SeqCst) {
            return Err(injected("drop"));
        }
        self.inner.drop_candidate(model, rolled_back).await
    }
    async fn converge(&self, model: &str, version: u64) -> Result<(), Refusal> {
        self.inner.converge(model, version).await
    }
    fn take_sums(&self, model: &str) -> Option<Sums> {
        self.inner.take_sums(model)
    }
    fn set_ready(&self, ready: Option<BTreeSet<String>>) {
        self.inner.set_ready(ready);
    }
    async fn until_free(&self, model: &str) {
        self.inner.until_free(model).await;
    }
}

/// One replica over a repository of fake versions of model `f`.
pub struct Replica {
    pub id: String,
    pub registry: Registry,
    pub gate: Gate,
    pub ready: Arc<Lock<Option<BTreeSet<String>>>>,
    pub health: Arc<Health>,
    pub fail_switch: Arc<AtomicBool>,
    pub fail_prepare: Arc<AtomicBool>,
    _task: tokio::task::JoinHandle<()>,
    _stop: tokio::sync::watch::Sender<bool>,
    pub repo: TestRepo,
}

impl Replica {
    pub fn serves(&self) -> Option<u64> {
        self.registry.snapshot().model("f").map(|r| r.stable.number())
    }

    pub fn candidate(&self) -> Option<u64> {
        self.registry.snapshot().model("f").and_then(|r| r.rollout.as_ref().map(|c| c.candidate.number()))
    }

    pub fn ready(&self) -> bool {
        self.ready.lock().is_some()
    }

    /// A replica whose repository `publish` fills, taking part in the
    /// fleet whose etcd `store` names, under a lease of `lease_ttl` seconds.
    pub fn start(
        runtime: &tokio::runtime::Runtime,
        store: &StoreConfig,
        lease_ttl: i64,
        id: &str,
        coordinate: bool,
        publish: impl FnOnce(&TestRepo),
    ) -> Replica {
        let repo = TestRepo::new();
        repo.add_model("f", FAKE_TOML);
        let gate = Gate::closed();
        let registry = baton_testkit::registry_with(repo.root(), vec![Arc::new(FakeBackend::gated(gate.clone()))]);
        let ready: Arc<Lock<Option<BTreeSet<String>>>> = Arc::default();
        let seen = Arc::clone(&ready);
        let inner = RegistryNode::new(registry.clone(), Arc::new(move |m| *seen.lock() = m));
        let (fail_switch, fail_prepare) = (Arc::<AtomicBool>::default(), Arc::<AtomicBool>::default());
        let node =
            Arc::new(Flaky { inner, fail_switch: Arc::clone(&fail_switch), fail_prepare: Arc::clone(&fail_prepare) });
        let config = ReplicaConfig {
            store: store.clone(),
            name: "t".into(),
            id: id.into(),
            address: format!("{id}:8000"),
            labels: [("zone".to_owned(), if id.ends_with('1') { "a" } else { "b" }.to_owned())].into(),
            lease_ttl,
            coordinate,
            agent: false,
        };
        let health = Arc::new(Health::default());
        let participant = Participant::new(config, node, Arc::clone(&health));
        publish(&repo);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = runtime.spawn(participant.run(stopped));
        Replica {
            id: id.into(),
            registry,
            gate,
            ready,
            health,
            fail_switch,
            fail_prepare,
            _task: task,
            _stop: stop,
            repo,
        }
    }

    /// Publishes version `n` (scale `n`); a held one waits at the gate in
    /// its load stage.
    pub fn publish(&self, n: u64, held: bool) {
        Replica::publisher(&self.repo)(n, held);
    }

    pub fn publisher(repo: &TestRepo) -> impl Fn(u64, bool) + '_ {
        move |n, held| {
            let scale = n.to_string();
            let mut files: Vec<(&str, &[u8])> = vec![("fake.txt", scale.as_bytes())];
            if held {
                files.push(("hold", b""));
            }
            repo.write_files("f", n, &files);
            repo.seal("f", n);
        }
    }

    /// Publishes version `n` so that every load of it fails.
    pub fn publish_broken(&self, n: u64) {
        self.repo.write_files("f", n, &[("fake.txt", b"not a number")]);
        self.repo.seal("f", n);
    }
}

pub struct Fleet {
    pub etcd: Etcd,
    pub runtime: tokio::runtime::Runtime,
    pub store: Store,
    /// How replicas reach etcd.
    pub config: StoreConfig,
}

impl Fleet {
    pub fn new() -> Fleet {
        let etcd = Etcd::start();
        let config = StoreConfig::plain(&format!("etcd://127.0.0.1:{}", etcd.port()));
        Fleet::over(etcd, config)
    }

    /// A fleet over `etcd`, reached as `config` says.
    pub fn over(etcd: Etcd, config: StoreConfig) -> Fleet {
        logs();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let store = runtime.block_on(Store::connect(&config, "t")).unwrap();
        Fleet { etcd, runtime, store, config }
    }

    pub fn spec(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.etcd.port())
    }

    /// Seeds the fleet's version of `f`.
    pub fn seed(&self, version: u64) {
        let seed = Desired { version, rollout: None, at_ms: 0 };
        self.runtime.block_on(self.store.put(&self.store.keys.desired("f"), &seed, None)).unwrap();
    }

    /// A replica with the versions given (`(n, held)`), not yet started.
    pub fn replica(&self, id: &str, versions: &[(u64, bool)], coordinate: bool) -> Replica {
        self.replica_with(id, coordinate, |repo| {
            for &(n, held) in versions {
                Replica::publisher(repo)(n, held);
            }
        })
    }

    /// A replica whose repository `publish` fills, not yet started.
    pub fn replica_with(&self, id: &str, coordinate: bool, publish: impl FnOnce(&TestRepo)) -> Replica {
        Replica::start(&self.runtime, &self.config, TTL, id, coordinate, publish)
    }

    /// Replicas r1 and r2 with the versions given, on the fleet's version
    /// 1; returns once both are ready and registered.
    pub fn pair(&self, r1: &[(u64, bool)], r2: &[(u64, bool)], coordinate: bool) -> (Replica, Replica) {
        self.seed(1);
        let (a, b) = (self.replica("r1", r1, coordinate), self.replica("r2", r2, coordinate));
        wait_until("both ready", || a.ready() && b.ready());
        wait_until("both registered", || self.registration("r1").is_some() && self.registration("r2").is_some());
        (a, b)
    }

    pub fn record(&self) -> Option<RolloutRecord> {
        self.runtime.block_on(self.store.get::<RolloutRecord>(&self.store.keys.record("f"))).unwrap().map(|r| r.value)
    }

    pub fn registration(&self, id: &str) -> Option<ReplicaRecord> {
        let key = self.store.keys.replica(id);
        self.runtime.block_on(self.store.get::<ReplicaRecord>(&key)).unwrap().map(|r| r.value)
    }

    pub fn acks(&self) -> Vec<Ack> {
        let (acks, _) = self.runtime.block_on(self.store.list::<Ack>(&self.store.keys.acks("f"))).unwrap();
        acks.into_iter().map(|a| a.value).collect()
    }

    pub fn start(&self, version: u64, plan: FleetPlan) -> Result<RolloutRecord, String> {
        self.runtime.block_on(ops::start(&self.store, "f", version, plan, "test")).map_err(|e| e.to_string())
    }

    /// Coordinates the rollout of `f` from this test, holding the key.
    pub fn coordinate(&self, me: &str) -> tokio::task::JoinHandle<Result<RolloutRecord, String>> {
        let store = self.store.clone();
        let me = me.to_owned();
        self.runtime.spawn(async move {
            let lease = store.grant(2).await.map_err(|e| e.to_string())?;
            let tenure = coordinator::campaign(&store, "f", &me, lease).await.unwrap().expect("no other coordinator");
            let health = Health::default();
            let result = tokio::select! {
                result = coordinator::coordinate(&store, "f", &me, tenure, &health) => result,
                error = store.keep_alive(lease, 2) => Err(error),
            };
            coordinator::resign(&store, "f", tenure).await;
            result.map_err(|e| e.to_string())
        })
    }

    pub fn finish(&self, me: &str) -> RolloutRecord {
        self.runtime.block_on(self.coordinate(me)).expect("the coordinator did not panic").expect("it coordinated")
    }
}

pub fn plan() -> FleetPlan {
    FleetPlan { prepare_timeout_ms: 30_000, ..FleetPlan::default() }
}
