//! Two processes of one replica, as during an upgrade of its server: the
//! old one acts for the replica under its lease, and the new one, started
//! under that lease, only reads the fleet's records and loads what they
//! say until it owns the lease. Meanwhile it writes nothing under the
//! replica's name: no observation sums (its totals start from zero and
//! would overwrite the old process's) and no switch reports. Once it owns
//! the lease it publishes both.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use baton_cluster::node::{Node, Refusal};
use baton_cluster::records::{FleetPhase, FleetPlan, Serving};
use baton_cluster::{Health, Participant, RegistryNode, ReplicaConfig};
use baton_core::registry::Registry;
use baton_core::rollout::window::Sums;
use baton_core::threads::sync::Lock;
use baton_testkit::fake::{FAKE_TOML, FakeBackend};
use baton_testkit::repo::TestRepo;
use common::{Fleet, Replica, TTL, wait_until};

/// A registry node that counts what the participant asks of it after its
/// first switch, and hands out (empty) observation sums when told to.
struct Counting {
    inner: RegistryNode,
    sums: bool,
    shared: AtomicBool,
    /// Calls of `serving` after the first switch returned: the converge
    /// task asks it next, once the switch's report is written (or not).
    servings_after_switch: AtomicU64,
    /// Sums taken after the first switch: the tick takes them, publishes
    /// them (or not), and takes them again at the next tick.
    sums_after_switch: AtomicU64,
}

impl Node for Counting {
    async fn available(&self) -> Result<BTreeMap<String, Option<u64>>, Refusal> {
        self.inner.available().await
    }
    fn serving(&self, model: &str) -> Serving {
        if self.shared.load(Ordering::SeqCst) {
            self.servings_after_switch.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.serving(model)
    }
    async fn prepare(&self, model: &str, version: u64) -> Result<(), Refusal> {
        self.inner.prepare(model, version).await
    }
    async fn share_all(&self, model: &str) -> Result<(), Refusal> {
        let result = self.inner.share_all(model).await;
        self.shared.store(true, Ordering::SeqCst);
        result
    }
    async fn promote(&self, model: &str) -> Result<(), Refusal> {
        self.inner.promote(model).await
    }
    async fn drop_candidate(&self, model: &str, rolled_back: bool) -> Result<(), Refusal> {
        self.inner.drop_candidate(model, rolled_back).await
    }
    async fn converge(&self, model: &str, version: u64) -> Result<(), Refusal> {
        self.inner.converge(model, version).await
    }
    fn take_sums(&self, model: &str) -> Option<Sums> {
        let _ = self.inner.take_sums(model);
        if self.shared.load(Ordering::SeqCst) {
            self.sums_after_switch.fetch_add(1, Ordering::SeqCst);
        }
        self.sums.then(Sums::default)
    }
    fn set_ready(&self, ready: Option<BTreeSet<String>>) {
        self.inner.set_ready(ready);
    }
    async fn until_free(&self, model: &str) {
        self.inner.until_free(model).await;
    }
}

/// One process of replica `r1` over its own repository of `f` 1 and 2.
struct Process {
    health: Arc<Health>,
    node: Arc<Counting>,
    ready: Arc<Lock<Option<BTreeSet<String>>>>,
    registry: Registry,
    /// Kept: the participant runs until it is told to stop.
    _stop: tokio::sync::watch::Sender<bool>,
    _repo: TestRepo,
}

impl Process {
    /// Starts it; `inherited` is the lease of the process it replaces.
    fn start(fleet: &Fleet, inherited: Option<i64>, sums: bool) -> Process {
        let repo = TestRepo::new();
        repo.add_model("f", FAKE_TOML);
        for n in [1, 2] {
            Replica::publisher(&repo)(n, false);
        }
        let registry = baton_testkit::registry_with(repo.root(), vec![Arc::new(FakeBackend::new())]);
        let ready: Arc<Lock<Option<BTreeSet<String>>>> = Arc::default();
        let seen = Arc::clone(&ready);
        let inner = RegistryNode::new(registry.clone(), Arc::new(move |m| *seen.lock() = m));
        let node = Arc::new(Counting {
            inner,
            sums,
            shared: AtomicBool::new(false),
            servings_after_switch: AtomicU64::new(0),
            sums_after_switch: AtomicU64::new(0),
        });
        let config = ReplicaConfig {
            store: fleet.config.clone(),
            name: "t".into(),
            id: "r1".into(),
            address: "r1:8000".into(),
            labels: BTreeMap::new(),
            lease_ttl: TTL,
            coordinate: false,
            agent: false,
        };
        let health = Arc::new(Health::default());
        if inherited.is_some() {
            health.inherit_lease(inherited);
        }
        let participant = Participant::new(config, Arc::clone(&node), Arc::clone(&health));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        fleet.runtime.spawn(participant.run(stopped));
        Process { health, node, ready, registry, _stop: stop, _repo: repo }
    }

    fn candidate(&self) -> Option<u64> {
        self.registry.snapshot().model("f").and_then(|r| r.rollout.as_ref().map(|c| c.candidate.number()))
    }
}

#[test]
fn a_new_process_writes_no_sums_nor_switch_reports_until_it_owns_the_lease() {
    let fleet = Fleet::new();
    fleet.seed(1);
    // The old process hands out no sums: any sums record is the new one's.
    let old = Process::start(&fleet, None, false);
    wait_until("the old process registered, ready", || {
        old.ready.lock().is_some() && fleet.registration("r1").is_some_and(|r| r.ready)
    });
    let lease = old.health.lease().expect("the old process's lease");
    let new = Process::start(&fleet, Some(lease), true);
    assert!(!new.health.acting(), "a process started under an inherited lease acts at once");
    wait_until("the new process ready", || new.ready.lock().is_some());

    // A gray step that holds: both switch to share the candidate.
    let plan = FleetPlan { steps: vec![50.0, 100.0], interval_ms: 600_000, ..common::plan() };
    fleet.start(2, plan).expect("a rollout");
    let _coordinator = fleet.coordinate("test");
    wait_until("the step committed", || fleet.record().is_some_and(|r| r.phase == FleetPhase::Committed));
    wait_until("both to share the candidate", || old.candidate() == Some(2) && new.candidate() == Some(2));
    let switched_key = "/baton/t/switched/f/r1";
    wait_until("the old process's switch report", || fleet.etcd.get_kv(switched_key).is_some());
    // What the new process does after a switch and a tick is done by the
    // time it asks its node again.
    wait_until("the new process past its switch and two ticks", || {
        new.node.servings_after_switch.load(Ordering::SeqCst) > 0
            && new.node.sums_after_switch.load(Ordering::SeqCst) >= 2
    });
    let report = fleet.etcd.get_kv(switched_key).expect("the switch report");
    assert_eq!(report["version"], "1", "the switch was reported twice, once by the new process: {report}");
    let sums_key = "/baton/t/sums/f/r1";
    assert!(fleet.etcd.get_kv(sums_key).is_none(), "the new process published sums before it acted");

    // Handed over: the new process acts, and its sums go out.
    old.health.hand_over_lease(Some(lease));
    new.health.own_lease();
    wait_until("the new process's sums", || fleet.etcd.get_kv(sums_key).is_some());
    assert_eq!(new.health.lease(), Some(lease), "the same lease");
}
