//! Fleets of real registries (the real engine) taking part through a real
//! etcd that each test starts on free loopback ports: a two-phase rollout
//! that every replica switches to, a replica that cannot load the
//! candidate, one lost during prepare (with and without leave to go on),
//! a coordinator that dies mid-rollout, a gray release judged on merged
//! observations, and an etcd that goes away and comes back. Each test
//! waits for the state it expects, within a generous bound; none depends
//! on speed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton_cluster::ops::{self, Request};
use baton_cluster::records::{Desired, FleetPhase, FleetPlan, RolloutRecord, Switched};
use baton_cluster::{Health, Participant, RegistryNode, ReplicaConfig, Store, StoreConfig, coordinator};
use baton_core::files::rollout_spec::Guards;
use baton_core::registry::Registry;
use baton_core::tensors::tensor::Tensor;
use baton_core::threads::sync::Lock;
use baton_testkit::etcd::Etcd;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{Damage, TestRepo, mlp_toml};

const LONG: Duration = Duration::from_secs(60);

/// One replica: a registry over its own repository, and its participant.
struct Replica {
    registry: Registry,
    ready: Arc<Lock<Option<BTreeSet<String>>>>,
    health: Arc<Health>,
    task: tokio::task::JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
    _repo: TestRepo,
}

impl Replica {
    fn serves(&self) -> Option<u64> {
        self.registry.snapshot().model("m").map(|r| r.stable.number())
    }

    fn candidate(&self) -> Option<u64> {
        self.registry.snapshot().model("m").and_then(|r| r.rollout.as_ref().map(|c| c.candidate.number()))
    }

    fn ready(&self) -> bool {
        self.ready.lock().is_some()
    }

    /// Dies as a process would: no goodbye, its lease runs out.
    fn kill(self) {
        self.task.abort();
    }
}

struct Fleet {
    etcd: Etcd,
    runtime: tokio::runtime::Runtime,
    name: String,
}

impl Fleet {
    fn new() -> Fleet {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        Fleet { etcd: Etcd::start(), runtime, name: "test".into() }
    }

    fn spec(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.etcd.port())
    }

    fn store(&self) -> Store {
        self.runtime.block_on(Store::connect(&StoreConfig::plain(&self.spec()), &self.name)).unwrap()
    }

    /// A replica whose repository holds `m` at the versions given; a
    /// version may be damaged so that its verify stage refuses it.
    fn replica(&self, id: &str, versions: &[(u64, &Mlp, Option<Damage>)], coordinate: bool) -> Replica {
        let repo = TestRepo::new();
        repo.add_model("m", &mlp_toml(versions[0].1, ""));
        for (version, mlp, damage) in versions {
            match damage {
                Some(d) => repo.publish_damaged("m", *version, mlp, *d),
                None => repo.publish_mlp("m", *version, mlp),
            };
        }
        let registry = baton_testkit::registry(repo.root());
        let ready: Arc<Lock<Option<BTreeSet<String>>>> = Arc::default();
        let seen = Arc::clone(&ready);
        let node = Arc::new(RegistryNode::new(registry.clone(), Arc::new(move |m| *seen.lock() = m)));
        let config = ReplicaConfig {
            store: StoreConfig::plain(&self.spec()),
            name: self.name.clone(),
            id: id.into(),
            address: format!("{id}:8000"),
            labels: [("zone".to_owned(), if id.ends_with('1') { "a" } else { "b" }.to_owned())].into(),
            lease_ttl: 2,
            coordinate,
            agent: false,
        };
        let health = Arc::new(Health::default());
        let participant = Participant::new(config, node, Arc::clone(&health));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = self.runtime.spawn(participant.run(stopped));
        Replica { registry, ready, health, task, stop, _repo: repo }
    }

    /// Two replicas, r1 (zone a) and r2 (zone b), with versions 1 and 2,
    /// serving 1 as the fleet committed it; returns once both are ready.
    fn on_version_one(&self, store: &Store, coordinate: bool) -> Vec<Replica> {
        let (v1, v2) = mlps();
        let versions = [(1, &v1, None), (2, &v2, None)];
        let seed = Desired { version: 1, rollout: None, at_ms: 0 };
        self.runtime.block_on(store.put(&store.keys.desired("m"), &seed, None)).unwrap();
        let replicas: Vec<Replica> = (1..=2).map(|i| self.replica(&format!("r{i}"), &versions, coordinate)).collect();
        wait_until("both are ready", || replicas.iter().all(Replica::ready));
        assert!(replicas.iter().all(|r| r.serves() == Some(1)));
        replicas
    }

    fn registered(&self, store: &Store, id: &str) -> bool {
        // A replica registers before its loads finish, with the models it
        // serves filled in as they do: a rollout may start only once it
        // lists m.
        let key = store.keys.replica(id);
        let record = self.runtime.block_on(store.get::<baton_cluster::records::ReplicaRecord>(&key)).unwrap();
        record.is_some_and(|r| r.value.models.contains_key("m"))
    }

    fn record(&self, store: &Store) -> Option<RolloutRecord> {
        self.runtime.block_on(store.get::<RolloutRecord>(&store.keys.record("m"))).unwrap().map(|r| r.value)
    }

    /// Coordinates the rollout of `m` from this test, as the CLI does.
    fn coordinate(&self, store: &Store, me: &str) -> tokio::task::JoinHandle<Result<RolloutRecord, String>> {
        let won = self.campaign(store, me);
        self.coordinate_as(store, me, won)
    }

    /// Takes the coordinator key of `m` for `me`: its lease and tenure.
    /// Before the rollout starts, when replicas that take over orphaned
    /// rollouts would otherwise win it first.
    fn campaign(&self, store: &Store, me: &str) -> (i64, coordinator::Tenure) {
        self.runtime.block_on(async {
            let lease = store.grant(2).await.unwrap();
            let tenure = coordinator::campaign(store, "m", me, lease).await.unwrap().expect("no other coordinator");
            (lease, tenure)
        })
    }

    /// Coordinates the rollout of `m` as `me`, with the key `won` took.
    fn coordinate_as(
        &self,
        store: &Store,
        me: &str,
        (lease, tenure): (i64, coordinator::Tenure),
    ) -> tokio::task::JoinHandle<Result<RolloutRecord, String>> {
        let store = store.clone();
        let me = me.to_owned();
        self.runtime.spawn(async move {
            // The lease lives exactly as long as this task: aborting the
            // task is the coordinator dying.
            let health = Health::default();
            let result = tokio::select! {
                result = coordinator::coordinate(&store, "m", &me, tenure, &health) => result,
                error = store.keep_alive(lease, 2) => Err(error),
            };
            coordinator::resign(&store, "m", tenure).await;
            result.map_err(|e| e.to_string())
        })
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Keyless requests to every replica from a thread, counting failures.
struct Traffic {
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Traffic {
    fn start(registries: Vec<Registry>) -> Traffic {
        let (stop, failed, sent) =
            (Arc::<AtomicBool>::default(), Arc::<AtomicU64>::default(), Arc::<AtomicU64>::default());
        let (s, f, n) = (Arc::clone(&stop), Arc::clone(&failed), Arc::clone(&sent));
        let thread = std::thread::spawn(move || {
            let mut seed = 0;
            while !s.load(Ordering::Relaxed) {
                for r in &registries {
                    seed += 1;
                    let input = Tensor::from_f32("input", vec![1, 8], &sample_input(8, 1, seed));
                    if r.snapshot().serve("m", None, &[input]).is_err() {
                        f.fetch_add(1, Ordering::Relaxed);
                    }
                    n.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Traffic { stop, failed, sent, thread }
    }

    fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        (self.sent.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }
}

fn mlps() -> (Mlp, Mlp) {
    (Mlp::new(&[8, 16, 1], 1), Mlp::new(&[8, 16, 1], 2))
}

fn plain() -> FleetPlan {
    FleetPlan { prepare_timeout_ms: 30_000, ..FleetPlan::default() }
}

#[test]
fn a_two_phase_rollout_switches_every_replica_with_no_failed_request() {
    let fleet = Fleet::new();
    let (v1, v2) = mlps();
    // Replicas start with v1 only: the fleet seeds version 1.
    let replicas: Vec<Replica> =
        (1..=3).map(|i| fleet.replica(&format!("r{i}"), &[(1, &v1, None), (2, &v2, None)], false)).collect();
    let store = fleet.store();
    wait_until("every replica is ready", || replicas.iter().all(Replica::ready));
    assert!(replicas.iter().all(|r| r.serves() == Some(2)), "the first replica seeds the newest version");
    // Roll back to 1 across the fleet, then forward to 2: each a rollout.
    let traffic = Traffic::start(replicas.iter().map(|r| r.registry.clone()).collect());
    for version in [1, 2] {
        fleet.runtime.block_on(ops::start(&store, "m", version, plain(), "test")).unwrap();
        let done = fleet.runtime.block_on(fleet.coordinate(&store, "coordinator")).unwrap().unwrap();
        assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
        let switch = done.switch.expect("the switch was summarised");
        assert_eq!(switch.replicas, 3);
        assert!(switch.skew_ms >= 0.0 && switch.last_ms >= switch.first_ms);
        // Every replica waited for the instant the commit named.
        let at = done.switch_at_us.expect("a switch time");
        let (reports, _) = fleet.runtime.block_on(store.list::<Switched>(&store.keys.switches("m"))).unwrap();
        assert_eq!(reports.len(), 3);
        assert!(reports.iter().all(|r| r.value.at_us >= at && r.value.seen_us < r.value.at_us), "{reports:?}");
        wait_until("every replica serves the committed version", || {
            replicas.iter().all(|r| r.serves() == Some(version) && r.candidate().is_none())
        });
        let desired = fleet.runtime.block_on(store.get::<Desired>(&store.keys.desired("m"))).unwrap().unwrap();
        assert_eq!(desired.value.version, version);
        assert!(replicas.iter().all(|r| r.health.state().commit_delay_seconds.contains_key("m")));
    }
    let (sent, failed) = traffic.stop();
    assert!(sent > 0);
    assert_eq!(failed, 0, "{failed} of {sent} requests failed");
}

#[test]
fn a_replica_that_cannot_load_the_candidate_aborts_the_rollout_and_nobody_switches() {
    let fleet = Fleet::new();
    let (v1, v2) = mlps();
    let good = fleet.replica("r1", &[(1, &v1, None)], false);
    let store = fleet.store();
    wait_until("r1 is ready", || good.ready());
    let bad = fleet.replica("r2", &[(1, &v1, None)], false);
    wait_until("r2 is ready", || bad.ready());
    // Version 2 arrives, whole on r1 and damaged on r2.
    good._repo.publish_mlp("m", 2, &v2);
    bad._repo.publish_damaged("m", 2, &v2, Damage::FlipByte);
    fleet.runtime.block_on(ops::start(&store, "m", 2, plain(), "test")).unwrap();
    let done = fleet.runtime.block_on(fleet.coordinate(&store, "coordinator")).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Aborted);
    let reason = done.reason.unwrap();
    assert!(reason.contains("replica r2 could not prepare: verify"), "{reason}");
    wait_until("the prepared candidate is dropped", || good.candidate().is_none());
    assert_eq!((good.serves(), bad.serves()), (Some(1), Some(1)), "nobody switched");
}

#[test]
fn a_replica_lost_during_prepare_aborts_unless_the_plan_lets_it_go_then_it_converges() {
    let fleet = Fleet::new();
    let (v1, v2) = mlps();
    let versions = [(1, &v1, None), (2, &v2, None)];
    let store = fleet.store();
    // Seed version 1 so that the replicas start on it.
    let seed = Desired { version: 1, rollout: None, at_ms: 0 };
    fleet.runtime.block_on(store.put(&store.keys.desired("m"), &seed, None)).unwrap();
    let r1 = fleet.replica("r1", &versions, false);
    let r2 = fleet.replica("r2", &versions, false);
    wait_until("both are ready and registered", || {
        r1.ready() && r2.ready() && fleet.registered(&store, "r1") && fleet.registered(&store, "r2")
    });
    assert_eq!(r1.serves(), Some(1), "a replica serves the committed version, not its newest");

    // r2 dies right after it is enlisted, before it can ack: its lease runs out.
    r2.kill();
    fleet.runtime.block_on(ops::start(&store, "m", 2, plain(), "test")).unwrap();
    let done = fleet.runtime.block_on(fleet.coordinate(&store, "coordinator")).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Aborted, "{done:#?}");
    assert!(done.reason.as_deref().unwrap().contains("replica r2 lost its lease"), "{:?}", done.reason);
    wait_until("r1 dropped its candidate", || r1.candidate().is_none());
    assert_eq!(r1.serves(), Some(1));

    // Again, with leave to lose one: it commits without r2…
    let r2 = fleet.replica("r2", &versions, false);
    wait_until("r2 is back and registered", || r2.ready() && fleet.registered(&store, "r2"));
    r2.kill();
    let plan = FleetPlan { allow_missing: 1, ..plain() };
    fleet.runtime.block_on(ops::start(&store, "m", 2, plan, "test")).unwrap();
    let done = fleet.runtime.block_on(fleet.coordinate(&store, "coordinator")).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    assert_eq!(done.missing, ["r2"]);
    wait_until("r1 serves 2", || r1.serves() == Some(2));
    // …and r2, restarted, converges before it reports ready.
    let r2 = fleet.replica("r2", &versions, false);
    wait_until("r2 converged", || r2.ready());
    assert_eq!(r2.serves(), Some(2));
}

#[test]
fn a_coordinator_that_dies_mid_rollout_is_replaced_and_the_rollout_finishes() {
    let fleet = Fleet::new();
    let store = fleet.store();
    // These replicas take over orphaned rollouts.
    let replicas = fleet.on_version_one(&store, true);
    let traffic = Traffic::start(replicas.iter().map(|r| r.registry.clone()).collect());
    // Gray: half first, judged after 1.5 s on guards any sane candidate passes.
    let guards = Guards { min_samples: 1, max_error_rate_increase: Some(0.5), ..Guards::default() };
    let plan = FleetPlan { steps: vec![50.0, 100.0], interval_ms: 1500, guards: guards.into(), ..plain() };
    // The key is taken first: else a replica may see the rollout orphaned
    // and coordinate it before the doomed coordinator does.
    let won = fleet.campaign(&store, "doomed");
    fleet.runtime.block_on(ops::start(&store, "m", 2, plan, "test")).unwrap();
    let coordinator = fleet.coordinate_as(&store, "doomed", won);
    wait_until("the first half is committed", || {
        fleet.record(&store).is_some_and(|r| r.phase == FleetPhase::Committed)
    });
    // The coordinator dies: its task ends and its lease is not renewed.
    coordinator.abort();
    wait_until("a replica finished the rollout", || {
        fleet.record(&store).is_some_and(|r| r.phase == FleetPhase::Promoted)
    });
    wait_until("both serve 2", || replicas.iter().all(|r| r.serves() == Some(2)));
    let (sent, failed) = traffic.stop();
    assert_eq!(failed, 0, "{failed} of {sent} failed");
    let record = fleet.record(&store).unwrap();
    let by: BTreeSet<&str> = record.decisions.iter().map(|d| d.by.as_str()).collect();
    assert!(by.contains("doomed") && (by.contains("r1") || by.contains("r2")), "{by:?}");
}

#[test]
fn gray_release_judges_the_subset_on_merged_observations_and_rolls_a_drifting_one_back() {
    let fleet = Fleet::new();
    let store = fleet.store();
    let replicas = fleet.on_version_one(&store, false);
    let traffic = Traffic::start(replicas.iter().map(|r| r.registry.clone()).collect());
    // v2 has other weights: its answers drift far beyond 5 % relative L2.
    let guards = Guards { min_samples: 20, max_rel_l2: Some(0.05), ..Guards::default() };
    let mut selector = std::collections::BTreeMap::new();
    selector.insert("zone".to_owned(), "a".to_owned());
    let plan = FleetPlan { steps: vec![50.0, 100.0], selector, interval_ms: 1000, guards: guards.into(), ..plain() };
    fleet.runtime.block_on(ops::start(&store, "m", 2, plan, "test")).unwrap();
    let coordinator = fleet.coordinate(&store, "coordinator");
    wait_until("zone a alone serves the candidate", || {
        replicas[0].registry.rollout("m").is_some_and(|s| s.weight_percent == 100.0)
    });
    assert_eq!(replicas[1].registry.rollout("m").map(|s| s.weight_percent), Some(0.0), "zone b holds it at 0 %");
    let done = fleet.runtime.block_on(coordinator).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::RolledBack, "{:?}", done.decisions);
    let verdict = done.decisions.last().unwrap().verdict.clone().expect("the verdict is kept");
    assert!(verdict.reason.contains("merged from 2 replicas"), "{}", verdict.reason);
    assert!(verdict.checks.iter().any(|c| c.guard.starts_with("rel_l2") && c.value.unwrap() > 0.05), "{verdict:?}");
    wait_until("both dropped the candidate", || replicas.iter().all(|r| r.candidate().is_none()));
    assert!(replicas.iter().all(|r| r.serves() == Some(1)));
    let (sent, failed) = traffic.stop();
    assert_eq!(failed, 0, "{failed} of {sent} failed");
    // An operator cannot act on a rollout that ended.
    assert!(fleet.runtime.block_on(ops::request(&store, "m", Request::Abort, "test")).is_err());
}

#[test]
fn without_etcd_replicas_keep_serving_rollouts_are_refused_and_all_resumes_when_it_returns() {
    let mut fleet = Fleet::new();
    let (v1, v2) = mlps();
    let r1 = fleet.replica("r1", &[(1, &v1, None), (2, &v2, None)], false);
    wait_until("r1 is ready", || r1.ready());
    wait_until("r1 is connected", || r1.health.connected());
    fleet.etcd.kill();
    wait_until("r1 notices", || !r1.health.connected());
    assert!(r1.ready() && r1.serves() == Some(2), "it keeps serving what it serves");
    let input = Tensor::from_f32("input", vec![1, 8], &sample_input(8, 1, 7));
    assert!(r1.registry.snapshot().serve("m", None, &[input]).is_ok());
    let spec = fleet.spec();
    let refused = fleet.runtime.block_on(async { Store::connect(&StoreConfig::plain(&spec), "test").await.err() });
    let error = refused.expect("connecting to a dead etcd fails");
    assert_eq!(error.kind(), "cluster_unreachable", "{error}");
    fleet.etcd.restart();
    wait_until("r1 reconnects", || r1.health.connected());
    let store = fleet.store();
    // Version 1 through the fleet, now that it is back.
    fleet.runtime.block_on(ops::start(&store, "m", 1, plain(), "test")).unwrap();
    let done = fleet.runtime.block_on(fleet.coordinate(&store, "coordinator")).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Promoted);
    wait_until("r1 serves 1", || r1.serves() == Some(1));
    let _ = r1.stop.send(true);
}

#[test]
fn a_prepare_that_outlasts_its_timeout_aborts_the_rollout() {
    let fleet = Fleet::new();
    let store = fleet.store();
    // A replica that needs a minute to prepare, against a 300 ms limit.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (spec, name) = (fleet.spec(), fleet.name.clone());
    let slow = fleet.runtime.spawn(async move {
        let prepare = Duration::from_secs(60);
        baton_cluster::sim::simulate(&StoreConfig::plain(&spec), &name, "slow", 1, vec!["m".into()], prepare, stopped)
            .await;
    });
    wait_until("the slow replica registered", || fleet.registered(&store, "slow-0"));
    let plan = FleetPlan { prepare_timeout_ms: 300, ..plain() };
    fleet.runtime.block_on(ops::start(&store, "m", 2, plan, "test")).unwrap();
    let done = fleet.runtime.block_on(fleet.coordinate(&store, "coordinator")).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Aborted);
    let reason = done.reason.unwrap();
    assert!(reason.contains("prepare timed out") && reason.contains("slow-0"), "{reason}");
    let _ = stop.send(true);
    fleet.runtime.block_on(slow).unwrap();
}

#[test]
fn a_prepare_that_outlasts_its_timeout_is_left_out_when_the_plan_allows_a_missing_replica() {
    let fleet = Fleet::new();
    let store = fleet.store();
    // One replica needs a minute to prepare, the other 50 ms; the plan
    // allows one missing and waits 2 s.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut simulated = Vec::new();
    for (prefix, prepare) in [("slow", Duration::from_secs(60)), ("fast", Duration::from_millis(50))] {
        let (spec, name, stopped) = (fleet.spec(), fleet.name.clone(), stopped.clone());
        simulated.push(fleet.runtime.spawn(async move {
            let config = StoreConfig::plain(&spec);
            baton_cluster::sim::simulate(&config, &name, prefix, 1, vec!["m".into()], prepare, stopped).await;
        }));
    }
    wait_until("both registered", || fleet.registered(&store, "slow-0") && fleet.registered(&store, "fast-0"));
    let plan = FleetPlan { prepare_timeout_ms: 2_000, allow_missing: 1, ..plain() };
    fleet.runtime.block_on(ops::start(&store, "m", 2, plan, "test")).unwrap();
    let done = fleet.runtime.block_on(fleet.coordinate(&store, "coordinator")).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    assert_eq!(done.missing, ["slow-0"], "the replica that did not prepare in time is left out");
    assert_eq!(done.members, ["fast-0"]);
    let left_out = done.decisions.iter().find(|d| d.action == "left_out").expect("a decision to leave it out");
    assert!(left_out.message.contains("slow-0") && left_out.message.contains("2000 ms"), "{}", left_out.message);
    let _ = stop.send(true);
    for task in simulated {
        fleet.runtime.block_on(task).unwrap();
    }
}

#[test]
fn an_operator_pauses_resumes_and_promotes_a_gray_release_fleet_wide() {
    let fleet = Fleet::new();
    let store = fleet.store();
    let replicas = fleet.on_version_one(&store, false);
    // Windows too long to be judged while the test runs.
    let plan = FleetPlan { steps: vec![50.0, 100.0], interval_ms: 600_000, ..plain() };
    fleet.runtime.block_on(ops::start(&store, "m", 2, plan, "test")).unwrap();
    let coordinator = fleet.coordinate(&store, "coordinator");
    wait_until("half the fleet serves the candidate", || {
        fleet.record(&store).is_some_and(|r| r.phase == FleetPhase::Committed && r.members.len() == 1)
    });
    let paused = fleet.runtime.block_on(ops::request(&store, "m", Request::Pause, "alice")).unwrap();
    assert_eq!(paused.paused.as_deref(), Some("paused by alice"));
    let resumed = fleet.runtime.block_on(ops::request(&store, "m", Request::Resume, "alice")).unwrap();
    assert!(resumed.paused.is_none() && resumed.phase == FleetPhase::Committed);
    fleet.runtime.block_on(ops::request(&store, "m", Request::Promote, "alice")).unwrap();
    let done = fleet.runtime.block_on(coordinator).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Promoted);
    assert_eq!(done.members.len(), 2);
    wait_until("both serve 2", || replicas.iter().all(|r| r.serves() == Some(2) && r.candidate().is_none()));
    let actions: Vec<&str> = done.decisions.iter().map(|d| d.action.as_str()).collect();
    assert_eq!(actions, ["started", "committed", "paused", "resumed", "promoted"]);
}
