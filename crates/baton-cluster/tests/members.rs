//! A fleet over a real three-member etcd, started by each test on free
//! loopback ports, when a member hangs rather than dies: stopped with
//! SIGSTOP, it still accepts connections and answers nothing. Replicas
//! given every endpoint keep their leases and go on rolling out; a watch
//! on a member cut from its quorum ends instead of going quiet. And when
//! etcd is only slow (every answer late, through a proxy that holds it):
//! replicas keep their sessions, and the coordinator its clocks, so a
//! committed step is judged on time; a coordinator whose session is cut
//! and found again goes on with its clocks.

mod common;

use std::time::{Duration, Instant};

use baton_cluster::records::{Desired, FleetPhase, FleetPlan, RolloutRecord};
use baton_cluster::store::Span;
use baton_cluster::{Store, StoreConfig, ops};
use baton_testkit::etcd::{Etcd, EtcdCluster};
use common::proxy::Proxy;
use common::{Replica, logs, plan, wait_until};

/// baton's default lease: renewed every second, gone after three.
const LEASE_TTL: i64 = 3;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The endpoints of every member but `skip`, as baton takes them.
fn others(cluster: &EtcdCluster, skip: usize) -> String {
    let hosts: Vec<String> =
        (0..cluster.len()).filter(|&i| i != skip).map(|i| format!("127.0.0.1:{}", cluster.member(i).port())).collect();
    format!("etcd://{}", hosts.join(","))
}

/// The member `replica`'s session speaks to, once it has joined.
fn member_of(cluster: &EtcdCluster, replica: &Replica) -> usize {
    let mut member = None;
    wait_until(&format!("{} is connected", replica.id), || {
        member =
            replica.health.state().endpoint.filter(|_| replica.health.connected()).and_then(|e| cluster.index_of(&e));
        member.is_some()
    });
    member.unwrap()
}

/// Hangs member `hung` for three leases, rolling out `version` meanwhile
/// through the others; checks that the rollout commits and that no
/// replica loses its lease while the member hangs.
fn hang(
    cluster: &mut EtcdCluster,
    runtime: &tokio::runtime::Runtime,
    hung: usize,
    version: u64,
    replicas: [&Replica; 2],
) {
    let admin = runtime.block_on(Store::connect(&StoreConfig::plain(&others(cluster, hung)), "t")).unwrap();
    let registered = |id: &str| {
        let key = admin.keys.replica(id);
        runtime.block_on(admin.get::<baton_cluster::records::ReplicaRecord>(&key)).is_ok_and(|r| r.is_some())
    };
    wait_until("both ready and registered", || replicas.iter().all(|r| r.ready() && registered(&r.id)));
    let leases: Vec<Option<i64>> = replicas.iter().map(|r| r.health.lease()).collect();
    cluster.pause(hung);
    let hung_at = Instant::now();
    // The operator starts a rollout once the others answer (when the hung
    // member led, they elect another first).
    wait_until("the others serve reads", || runtime.block_on(admin.get::<Desired>(&admin.keys.desired("f"))).is_ok());
    runtime.block_on(ops::start(&admin, "f", version, plan(), "test")).unwrap();
    wait_until(&format!("the rollout to {version} is promoted"), || {
        let read = runtime.block_on(admin.get::<RolloutRecord>(&admin.keys.record("f"))).unwrap();
        let record = read.expect("the record").value;
        assert!(
            record.phase.in_progress() || record.phase == FleetPhase::Promoted,
            "{:?}: {:?}",
            record.reason,
            record.decisions
        );
        record.phase == FleetPhase::Promoted
    });
    wait_until(&format!("both serve {version}"), || replicas.iter().all(|r| r.serves() == Some(version)));
    // The member stays hung for three leases in all, whatever the rollout
    // took: the scenario is a hang longer than the lease.
    std::thread::sleep(Duration::from_secs(3 * LEASE_TTL as u64).saturating_sub(hung_at.elapsed()));
    for r in replicas {
        let state = r.health.state();
        assert_eq!(state.leases_lost, 0, "{} lost its lease while member {hung} hung: {state:?}", r.id);
    }
    let now: Vec<Option<i64>> = replicas.iter().map(|r| r.health.lease()).collect();
    assert_eq!(now, leases, "a replica acts under another lease");
    assert!(replicas.iter().all(|r| r.ready()), "a replica is not ready");
    cluster.resume(hung);
}

#[test]
fn a_member_that_hangs_longer_than_the_lease_costs_no_lease_and_rollouts_commit() {
    logs();
    let mut cluster = EtcdCluster::start(3);
    let runtime = runtime();
    let config = StoreConfig::plain(&cluster.endpoints());
    {
        let seeder = runtime.block_on(Store::connect(&config, "t")).unwrap();
        let seed = Desired { version: 1, rollout: None, at_ms: 0 };
        runtime.block_on(seeder.put(&seeder.keys.desired("f"), &seed, None)).unwrap();
    }
    // Both may coordinate: whoever holds the key when a member hangs.
    let versions = |repo: &baton_testkit::repo::TestRepo| {
        for n in 1..=3 {
            Replica::publisher(repo)(n, false);
        }
    };
    let r1 = Replica::start(&runtime, &config, LEASE_TTL, "r1", true, versions);
    let r2 = Replica::start(&runtime, &config, LEASE_TTL, "r2", true, versions);
    wait_until("both ready", || r1.ready() && r2.ready());

    // The member r1 speaks to hangs, as a follower.
    let hung = member_of(&cluster, &r1);
    if cluster.leader() == hung {
        cluster.move_leader((hung + 1) % cluster.len());
    }
    hang(&mut cluster, &runtime, hung, 2, [&r1, &r2]);

    // The leader hangs: every renewal, through whichever member, waits
    // for the others to elect another.
    let leader = cluster.leader();
    hang(&mut cluster, &runtime, leader, 3, [&r1, &r2]);
    // etcd before 3.4.28 and 3.5.11 has a hung leader revoke every lease
    // when it resumes (etcd's issue 15247); replicas whose lease it
    // revoked register again under a new one.
    wait_until("both ready and connected after the leader resumed", || {
        [&r1, &r2].iter().all(|r| r.ready() && r.health.connected() && r.serves() == Some(3))
    });
}

#[test]
fn a_watch_on_a_member_cut_from_its_quorum_ends() {
    logs();
    let mut cluster = EtcdCluster::start(3);
    let runtime = runtime();
    // A client of member 0 alone.
    let config = StoreConfig::plain(&format!("etcd://127.0.0.1:{}", cluster.member(0).port()));
    let store = runtime.block_on(Store::connect(&config, "t")).unwrap();
    let mut watch = runtime.block_on(store.watch(&[Span::Prefix("/baton/t/".into())], 0)).unwrap();
    cluster.pause(1);
    cluster.pause(2);
    // Member 0 loses its leader within an election timeout (1 s) and ends
    // the streams that require one after three more.
    let ended = runtime.block_on(async { tokio::time::timeout(Duration::from_secs(20), watch.next()).await });
    cluster.resume(1);
    cluster.resume(2);
    match ended {
        Ok(Err(error)) => {
            assert_eq!(error.kind(), "cluster_unreachable", "{error}");
            assert!(error.to_string().contains("leader"), "{error}");
        }
        Ok(Ok(events)) => panic!("the watch delivered {events:?} from a member without a leader"),
        Err(_) => panic!("the watch on a member without a leader went quiet instead of ending"),
    }
}

/// Whether the committed step of `f`'s rollout has been judged: a decision
/// after the commit carries a verdict.
fn judged(runtime: &tokio::runtime::Runtime, admin: &Store) -> bool {
    let read = runtime.block_on(admin.get::<RolloutRecord>(&admin.keys.record("f"))).unwrap();
    read.is_some_and(|r| r.value.decisions.iter().any(|d| d.verdict.is_some()))
}

/// Starts a gray rollout of `f` to version 2 (half the replicas, then
/// all, judged every `interval_ms`) that a replica coordinates, and
/// waits until its first step is committed.
fn commit_first_step(runtime: &tokio::runtime::Runtime, admin: &Store, interval_ms: u64) {
    let gray = FleetPlan { steps: vec![50.0, 100.0], interval_ms, ..plan() };
    runtime.block_on(ops::start(admin, "f", 2, gray, "test")).unwrap();
    wait_until("the first step is committed", || {
        let read = runtime.block_on(admin.get::<RolloutRecord>(&admin.keys.record("f"))).unwrap();
        let record = read.expect("the record").value;
        assert!(record.phase.in_progress(), "{:?}: {:?}", record.reason, record.decisions);
        record.phase == FleetPhase::Committed
    });
}

#[test]
fn an_etcd_that_answers_late_costs_no_session_and_the_committed_step_is_judged_on_time() {
    logs();
    let cluster = EtcdCluster::start(3);
    let runtime = runtime();
    // The replicas reach every member through a proxy; the test directly.
    let proxies: Vec<Proxy> = (0..cluster.len()).map(|i| Proxy::start(cluster.member(i).port())).collect();
    let hosts: Vec<String> = proxies.iter().map(|p| format!("127.0.0.1:{}", p.port())).collect();
    let through = StoreConfig::plain(&format!("etcd://{}", hosts.join(",")));
    let admin = runtime.block_on(Store::connect(&StoreConfig::plain(&cluster.endpoints()), "t")).unwrap();
    let seed = Desired { version: 1, rollout: None, at_ms: 0 };
    runtime.block_on(admin.put(&admin.keys.desired("f"), &seed, None)).unwrap();
    let versions = |repo: &baton_testkit::repo::TestRepo| {
        for n in 1..=2 {
            Replica::publisher(repo)(n, false);
        }
    };
    let replicas = [
        Replica::start(&runtime, &through, LEASE_TTL, "r1", true, versions),
        Replica::start(&runtime, &through, LEASE_TTL, "r2", true, versions),
    ];
    wait_until("both ready", || replicas.iter().all(Replica::ready));
    wait_until("both registered", || {
        replicas.iter().all(|r| {
            let key = admin.keys.replica(&r.id);
            runtime.block_on(admin.get::<baton_cluster::records::ReplicaRecord>(&key)).is_ok_and(|r| r.is_some())
        })
    });
    const INTERVAL: Duration = Duration::from_secs(5);
    commit_first_step(&runtime, &admin, INTERVAL.as_millis() as u64);
    let committed = Instant::now();
    let sessions: Vec<u64> = replicas.iter().map(|r| r.health.state().sessions).collect();
    let leases: Vec<Option<i64>> = replicas.iter().map(|r| r.health.lease()).collect();

    // From now on every answer etcd gives a replica arrives 0.8 s late:
    // more than a third of what is left of the lease at a renewal.
    for proxy in &proxies {
        proxy.set_delay(Duration::from_millis(800));
    }
    wait_until("the committed step is judged", || judged(&runtime, &admin));
    let judged_after = committed.elapsed();
    // The slow etcd lasts three intervals in all, whatever the judgement took.
    std::thread::sleep((3 * INTERVAL).saturating_sub(committed.elapsed()));
    for proxy in &proxies {
        proxy.set_delay(Duration::ZERO);
    }
    for (r, before) in replicas.iter().zip(&sessions) {
        let state = r.health.state();
        assert_eq!(state.sessions, *before, "{} began another session while etcd was slow: {state:?}", r.id);
        assert_eq!(state.leases_lost, 0, "{} lost its lease while etcd was slow: {state:?}", r.id);
    }
    let now: Vec<Option<i64>> = replicas.iter().map(|r| r.health.lease()).collect();
    assert_eq!(now, leases, "a replica acts under another lease");
    assert!(judged_after < 2 * INTERVAL, "the step was judged {judged_after:?} after its commit");
}

#[test]
fn a_coordinator_whose_session_is_cut_and_found_again_keeps_its_clocks() {
    logs();
    let etcd = Etcd::start();
    let runtime = runtime();
    let direct = StoreConfig::plain(&format!("etcd://127.0.0.1:{}", etcd.port()));
    // r1 coordinates, through a proxy that cuts its connections.
    let proxy = Proxy::start(etcd.port());
    let through = StoreConfig::plain(&format!("etcd://127.0.0.1:{}", proxy.port()));
    let admin = runtime.block_on(Store::connect(&direct, "t")).unwrap();
    let seed = Desired { version: 1, rollout: None, at_ms: 0 };
    runtime.block_on(admin.put(&admin.keys.desired("f"), &seed, None)).unwrap();
    let versions = |repo: &baton_testkit::repo::TestRepo| {
        for n in 1..=2 {
            Replica::publisher(repo)(n, false);
        }
    };
    // A lease long enough for the reconnects' growing waits.
    let r1 = Replica::start(&runtime, &through, 10, "r1", true, versions);
    let r2 = Replica::start(&runtime, &direct, 10, "r2", false, versions);
    wait_until("both ready", || r1.ready() && r2.ready());
    const INTERVAL: Duration = Duration::from_secs(4);
    commit_first_step(&runtime, &admin, INTERVAL.as_millis() as u64);
    let lease = r1.health.lease();

    // r1's connections are cut more often than the interval: each time it
    // reconnects under its lease and takes its coordinator key over.
    for _ in 0..4 {
        std::thread::sleep(INTERVAL * 5 / 8);
        let sessions = r1.health.state().sessions;
        proxy.cut();
        wait_until("r1 joined again", || r1.health.connected() && r1.health.state().sessions > sessions);
    }
    assert_eq!(r1.health.lease(), lease, "r1 kept its lease: {:?}", r1.health.state());
    assert!(
        judged(&runtime, &admin),
        "no judgement in {:?} of a step judged every {INTERVAL:?}: the coordinator started its clock again at each reconnect",
        INTERVAL * 5 / 2
    );
}
