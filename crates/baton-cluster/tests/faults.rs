//! The faults every etcd deployment sees, against a real etcd and real
//! registries whose loads a test can hold (the fake backend's gate): loads
//! longer than the lease, compaction, a rollout nobody prepared, a switch
//! that fails, a pause during prepare, a reconnect during prepare, two
//! coordinators at once, records written by a newer baton, and a
//! coordinator whose clock is far off.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use baton_cluster::ops::{self, Request};
use baton_cluster::records::{Desired, FleetPhase, FleetPlan, RolloutRecord};
use baton_cluster::{Health, Store, coordinator};
use common::{Fleet, Replica, TTL, plan, wait_until};

/// Holds for several times the lease's time to live: what a load of a big
/// model does to a replica.
fn outlast_the_lease() {
    std::thread::sleep(Duration::from_secs(4 * TTL as u64));
}

#[test]
fn a_load_longer_than_the_lease_keeps_the_replica_registered() {
    let fleet = Fleet::new();
    fleet.seed(1);
    let r1 = fleet.replica("r1", &[(1, true)], false);
    r1.gate.wait_for_waiters(1);
    // Registered, not ready, while its first load is held.
    wait_until("r1 registered while loading", || fleet.registration("r1").is_some());
    outlast_the_lease();
    let during = fleet.registration("r1").expect("still registered after four times its lease");
    assert!(!during.ready, "not ready while it loads: {during:?}");
    assert!(r1.health.state().last_error.is_none(), "{:?}", r1.health.state());
    r1.gate.open();
    wait_until("r1 is ready", || r1.ready() && r1.serves() == Some(1));

    // Left out of a rollout (its prepare fails), it converges by a whole
    // load after the commit, again longer than its lease.
    let r2 = fleet.replica("r2", &[(1, false)], false);
    wait_until("r2 is ready", || r2.ready());
    r1.gate.close();
    for r in [&r1, &r2] {
        r.publish(2, true);
    }
    r2.gate.open();
    r1.fail_prepare.store(true, Ordering::SeqCst);
    let done = {
        fleet.start(2, FleetPlan { allow_missing: 1, ..plan() }).unwrap();
        fleet.finish("coordinator")
    };
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    assert_eq!(done.missing, ["r1"]);
    r1.gate.wait_for_waiters(1);
    outlast_the_lease();
    assert!(fleet.registration("r1").is_some(), "r1 kept its registration while converging");
    r1.gate.open();
    wait_until("r1 serves 2", || r1.serves() == Some(2) && r1.ready());
    assert!(r1.health.state().last_error.is_none(), "{:?}", r1.health.state());
}

#[test]
fn compaction_while_a_replica_converges_leaves_it_listening_and_the_next_rollout_commits() {
    let fleet = Fleet::new();
    fleet.seed(1);
    let r1 = fleet.replica("r1", &[(1, false), (2, false)], false);
    wait_until("r1 is ready", || r1.ready());
    // r2's first load is held while the store moves on and is compacted.
    let r2 = fleet.replica("r2", &[(1, true), (2, false)], false);
    r2.gate.wait_for_waiters(1);
    for n in 0..20 {
        fleet.etcd.put(&format!("/unrelated/{n}"), b"x");
    }
    fleet.etcd.compact();
    fleet.etcd.defrag();
    r2.gate.open();
    wait_until("r2 is ready", || r2.ready());
    fleet.start(2, FleetPlan { prepare_timeout_ms: 10_000, ..plan() }).unwrap();
    let done = fleet.finish("coordinator");
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    wait_until("both serve 2", || r1.serves() == Some(2) && r2.serves() == Some(2));

    // Compaction and defragmentation during a rollout, then between two.
    for r in [&r1, &r2] {
        r.gate.close();
        r.publish(3, true);
    }
    fleet.start(3, plan()).unwrap();
    let coordinator = fleet.coordinate("coordinator");
    r1.gate.wait_for_waiters(1);
    fleet.etcd.compact();
    fleet.etcd.defrag();
    for r in [&r1, &r2] {
        r.gate.open();
    }
    let done = fleet.runtime.block_on(coordinator).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    fleet.etcd.compact();
    fleet.etcd.defrag();
    fleet.start(2, plan()).unwrap();
    let done = fleet.finish("coordinator");
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    wait_until("both serve 2 again", || r1.serves() == Some(2) && r2.serves() == Some(2));
}

#[test]
fn a_rollout_nobody_prepared_never_commits_and_a_gray_step_never_panics() {
    let fleet = Fleet::new();
    fleet.seed(1);
    let replicas: Vec<Replica> = (1..=3).map(|i| fleet.replica(&format!("r{i}"), &[(1, false)], false)).collect();
    wait_until("all ready", || replicas.iter().all(Replica::ready));
    wait_until("all registered", || replicas.iter().all(|r| fleet.registration(&r.id).is_some()));
    for r in &replicas {
        r.gate.open();
        r.publish_broken(2);
    }
    // Leave to lose every participant is no rollout at all.
    let refused = fleet.start(2, FleetPlan { allow_missing: 3, ..plan() });
    assert!(refused.as_ref().is_err_and(|e| e.contains("allow_missing")), "{refused:?}");

    // A record that allows it anyway (written by hand, or by an older
    // baton), with a gray plan: aborted, with no panic.
    let mut record = fleet.start(2, FleetPlan { allow_missing: 2, steps: vec![50.0, 100.0], ..plan() }).unwrap();
    let read = fleet.runtime.block_on(fleet.store.get::<RolloutRecord>(&fleet.store.keys.record("f"))).unwrap();
    record.plan.allow_missing = 3;
    assert!(
        fleet
            .runtime
            .block_on(fleet.store.swap(&fleet.store.keys.record("f"), &record, read.unwrap().revision, Vec::new()))
            .unwrap()
    );
    let done = fleet.finish("coordinator");
    assert_eq!(done.phase, FleetPhase::Aborted, "{:?}", done.decisions);
    assert!(done.reason.as_deref().is_some_and(|r| r.contains("no participant")), "{:?}", done.reason);
    assert!(replicas.iter().all(|r| r.ready() && r.serves() == Some(1)), "every replica still serves 1, ready");
}

#[test]
fn a_replica_whose_switch_failed_is_not_ready_and_retries_until_it_serves_the_commit() {
    let fleet = Fleet::new();
    let (r1, r2) = fleet.pair(&[(1, false), (2, false)], &[(1, false), (2, false)], false);
    r2.fail_switch.store(true, Ordering::SeqCst);
    fleet.start(2, plan()).unwrap();
    let done = fleet.finish("coordinator");
    assert_eq!(done.phase, FleetPhase::Promoted);
    wait_until("r1 serves 2", || r1.serves() == Some(2));
    wait_until("r2, which could not switch, is not ready", || !r2.ready());
    assert_eq!(r2.serves(), Some(1));
    r2.fail_switch.store(false, Ordering::SeqCst);
    wait_until("r2 switched on a retry and is ready", || r2.serves() == Some(2) && r2.ready());
}

#[test]
fn a_pause_during_prepare_holds_the_rollout_until_resumed() {
    let fleet = Fleet::new();
    let (r1, r2) = fleet.pair(&[(1, false), (2, true)], &[(1, false), (2, false)], false);
    fleet.start(2, plan()).unwrap();
    let coordinator = fleet.coordinate("coordinator");
    r1.gate.wait_for_waiters(1);
    fleet.runtime.block_on(ops::request(&fleet.store, "f", Request::Pause, "alice")).unwrap();
    r1.gate.open();
    wait_until("both acked", || fleet.acks().iter().filter(|a| a.ok).count() == 2);
    // Held: prepared everywhere, and still not committed.
    hold_preparing(&fleet, Duration::from_secs(1));
    assert_eq!((r1.serves(), r2.serves()), (Some(1), Some(1)));
    fleet.runtime.block_on(ops::request(&fleet.store, "f", Request::Resume, "alice")).unwrap();
    let done = fleet.runtime.block_on(coordinator).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    wait_until("both serve 2", || r1.serves() == Some(2) && r2.serves() == Some(2));
}

#[test]
fn a_reconnect_during_prepare_acks_the_prepare_already_running() {
    let mut fleet = Fleet::new();
    let (r1, r2) = fleet.pair(&[(1, false), (2, true)], &[(1, false), (2, false)], false);
    fleet.start(2, plan()).unwrap();
    r1.gate.wait_for_waiters(1);
    fleet.etcd.kill();
    wait_until("r1 lost the store", || !r1.health.connected());
    fleet.etcd.restart();
    wait_until("r1 is back", || r1.health.connected());
    let store = fleet.runtime.block_on(Store::connect(&fleet.config, "t")).unwrap();
    fleet.store = store;
    // A coordinator looks while r1's first prepare is still held: the
    // rollout holds, waiting for it.
    let coordinator = fleet.coordinate("coordinator");
    hold_preparing(&fleet, Duration::from_secs(1));
    r1.gate.open();
    let done = fleet.runtime.block_on(coordinator).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    wait_until("both serve 2", || r1.serves() == Some(2) && r2.serves() == Some(2));
}

/// Asserts the rollout stays in prepare for `how_long`.
fn hold_preparing(fleet: &Fleet, how_long: Duration) {
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        let record = fleet.record().unwrap();
        assert_eq!(record.phase, FleetPhase::Preparing, "{:?}", record.decisions);
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn only_the_holder_of_the_coordinator_key_acts_and_gives_it_back() {
    let fleet = Fleet::new();
    let store = &fleet.store;
    let key = store.keys.coordinator("f");
    // A's lease runs out (a long pause, say), and B takes the key.
    let (a, b) = fleet.runtime.block_on(async { (store.grant(5).await.unwrap(), store.grant(5).await.unwrap()) });
    let tenure_a = fleet.runtime.block_on(coordinator::campaign(store, "f", "A", a)).unwrap().expect("A holds it");
    fleet.runtime.block_on(store.revoke(a)).unwrap();
    let tenure_b = fleet.runtime.block_on(coordinator::campaign(store, "f", "B", b)).unwrap().expect("B holds it");
    // A, waking up, gives back what it thinks is its key.
    fleet.runtime.block_on(coordinator::resign(store, "f", tenure_a));
    let holder = fleet.runtime.block_on(store.get::<String>(&key)).unwrap().map(|r| r.value);
    assert_eq!(holder.as_deref(), Some("B"), "A deleted B's key");

    // Both drive one rollout at once: only B's decisions are written.
    fleet.seed(1);
    let r1 = fleet.replica("r1", &[(1, false), (2, false)], false);
    wait_until("r1 ready", || r1.ready());
    wait_until("r1 registered", || fleet.registration("r1").is_some());
    fleet.start(2, plan()).unwrap();
    let (sa, sb) = (store.clone(), store.clone());
    let (ha, hb) = (Health::default(), Health::default());
    let (from_a, from_b) = fleet.runtime.block_on(async {
        tokio::join!(
            coordinator::coordinate(&sa, "f", "A", tenure_a, &ha),
            coordinator::coordinate(&sb, "f", "B", tenure_b, &hb)
        )
    });
    let done = from_b.expect("B coordinated");
    assert_eq!(done.phase, FleetPhase::Promoted);
    assert!(from_a.as_ref().is_err_and(|e| e.kind() == "cluster_fenced"), "A acted without the key: {from_a:?}");
    let by: BTreeSet<&str> = done.decisions.iter().filter(|d| d.by != "test").map(|d| d.by.as_str()).collect();
    assert_eq!(by, BTreeSet::from(["B"]), "{:?}", done.decisions);
}

#[test]
fn a_coordinator_taken_over_by_a_new_process_of_its_replica_writes_nothing_more() {
    let fleet = Fleet::new();
    let store = &fleet.store;
    let key = store.keys.coordinator("f");
    // One replica's lease, shared by its old and new process (an upgrade).
    let lease = fleet.runtime.block_on(store.grant(5)).unwrap();
    let old = fleet.runtime.block_on(coordinator::campaign(store, "f", "r1", lease)).unwrap().expect("it holds it");
    let new = fleet.runtime.block_on(coordinator::take_over(store, "f", "r1", lease, old.created)).unwrap();
    let new = new.expect("the new process takes the key over");
    assert_eq!((new.created, new.lease), (old.created, old.lease), "the same key, no new election");
    assert!(new.revision > old.revision, "a new epoch: {new:?} after {old:?}");
    // The old process, giving back what it thinks is its key, leaves the
    // new one's alone.
    fleet.runtime.block_on(coordinator::resign(store, "f", old));
    let holder = fleet.runtime.block_on(store.get::<String>(&key)).unwrap().expect("the key");
    assert_eq!((holder.created, holder.revision), (new.created, new.revision), "the old process deleted the key");

    // Both drive one rollout at once: only the new epoch's decisions are
    // written, and the old one stops.
    fleet.seed(1);
    let r1 = fleet.replica("r1", &[(1, false), (2, false)], false);
    wait_until("r1 ready", || r1.ready());
    wait_until("r1 registered", || fleet.registration("r1").is_some());
    fleet.start(2, plan()).unwrap();
    let (so, sn) = (store.clone(), store.clone());
    let (ho, hn) = (Health::default(), Health::default());
    let (from_old, from_new) = fleet.runtime.block_on(async {
        tokio::join!(
            coordinator::coordinate(&so, "f", "old", old, &ho),
            coordinator::coordinate(&sn, "f", "new", new, &hn)
        )
    });
    let done = from_new.expect("the new process coordinated");
    assert_eq!(done.phase, FleetPhase::Promoted);
    assert!(from_old.as_ref().is_err_and(|e| e.kind() == "cluster_fenced"), "the old one acted: {from_old:?}");
    let by: BTreeSet<&str> = done.decisions.iter().filter(|d| d.by != "test").map(|d| d.by.as_str()).collect();
    assert_eq!(by, BTreeSet::from(["new"]), "{:?}", done.decisions);
}

#[test]
fn records_with_fields_this_baton_does_not_know_are_followed() {
    let fleet = Fleet::new();
    let (r1, r2) = fleet.pair(&[(1, false), (2, false)], &[(1, false), (2, false)], false);
    // A newer baton's record: a field at the top, one in the plan, a guard
    // and a field of a decision.
    let record = fleet.start(2, plan()).unwrap();
    let mut json = serde_json::to_value(&record).unwrap();
    json["from_the_future"] = serde_json::json!({ "x": 1 });
    json["plan"]["warp"] = serde_json::json!(9);
    json["plan"]["guards"]["max_gpu_seconds_ratio"] = serde_json::json!(1.25);
    json["decisions"][0]["signed_by"] = serde_json::json!("operator-key-7");
    fleet.etcd.put(&fleet.store.keys.record("f"), json.to_string().as_bytes());
    let done = fleet.finish("coordinator");
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    wait_until("both serve 2", || r1.serves() == Some(2) && r2.serves() == Some(2));
    // This baton rewrote the record at every step: what it does not know
    // is still there, where the newer one wrote it.
    let raw = fleet.etcd.get(&fleet.store.keys.record("f")).expect("the record");
    let written: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(written["phase"], "promoted");
    assert_eq!(written["from_the_future"], serde_json::json!({ "x": 1 }), "{written}");
    assert_eq!(written["plan"]["warp"], 9, "{written}");
    assert_eq!(written["plan"]["guards"]["max_gpu_seconds_ratio"], 1.25, "{written}");
    assert_eq!(written["plan"]["guards"]["max_p99_ratio"], 1.5, "{written}");
    assert_eq!(written["decisions"][0]["signed_by"], "operator-key-7", "{written}");
}

#[test]
fn a_step_with_a_guard_this_baton_does_not_know_is_paused_not_judged() {
    let fleet = Fleet::new();
    let (r1, r2) = fleet.pair(&[(1, false), (2, false)], &[(1, false), (2, false)], false);
    // A newer baton's gray plan, with a guard this one cannot judge.
    let gray = FleetPlan { steps: vec![50.0, 100.0], interval_ms: 1000, ..plan() };
    let record = fleet.start(2, gray).unwrap();
    let mut json = serde_json::to_value(&record).unwrap();
    json["plan"]["guards"]["max_gpu_seconds_ratio"] = serde_json::json!(1.25);
    fleet.etcd.put(&fleet.store.keys.record("f"), json.to_string().as_bytes());
    let coordinator = fleet.coordinate("coordinator");
    wait_until("the committed step is paused or the rollout ends", || {
        fleet.record().is_some_and(|r| r.paused.is_some() || !r.phase.in_progress())
    });
    let record = fleet.record().unwrap();
    assert_eq!(record.phase, FleetPhase::Committed, "{:?}: {:?}", record.reason, record.decisions);
    let paused = record.paused.clone().unwrap_or_default();
    assert!(paused.contains("max_gpu_seconds_ratio"), "the pause names the guard: {paused}");
    assert!(record.decisions.iter().all(|d| d.verdict.is_none()), "judged on the known guards: {:?}", record.decisions);
    // Held for an operator: it ends when one acts.
    fleet.runtime.block_on(ops::request(&fleet.store, "f", Request::Abort, "test")).unwrap();
    let done = fleet.runtime.block_on(coordinator).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Aborted, "{:?}", done.decisions);
    wait_until("both serve 1 and hold no candidate", || {
        [&r1, &r2].iter().all(|r| r.serves() == Some(1) && r.candidate().is_none())
    });
}

#[test]
fn a_prepare_timeout_is_measured_on_the_coordinators_clock() {
    let fleet = Fleet::new();
    fleet.seed(1);
    let r1 = fleet.replica("r1", &[(1, false), (2, true)], false);
    wait_until("r1 ready", || r1.ready());
    wait_until("r1 registered", || fleet.registration("r1").is_some());
    // Started by a process whose clock is an hour behind the coordinator's.
    let record = fleet.start(2, FleetPlan { prepare_timeout_ms: 20_000, ..plan() }).unwrap();
    let mut json = serde_json::to_value(&record).unwrap();
    json["started_ms"] = serde_json::json!(record.started_ms - 3_600_000);
    fleet.etcd.put(&fleet.store.keys.record("f"), json.to_string().as_bytes());
    let coordinator = fleet.coordinate("coordinator");
    r1.gate.wait_for_waiters(1);
    std::thread::sleep(Duration::from_millis(500));
    r1.gate.open();
    let done = fleet.runtime.block_on(coordinator).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
}

#[test]
fn a_coordinator_clock_far_ahead_delays_no_switch_beyond_the_lead() {
    let fleet = Fleet::new();
    let (r1, r2) = fleet.pair(&[(1, false), (2, false)], &[(1, false), (2, false)], false);
    fleet.start(2, plan()).unwrap();
    wait_until("both acked", || fleet.acks().iter().filter(|a| a.ok).count() == 2);
    // Commit as a coordinator whose clock is ten minutes ahead would.
    let read = fleet.runtime.block_on(fleet.store.get::<RolloutRecord>(&fleet.store.keys.record("f"))).unwrap();
    let read = read.expect("the record");
    assert_eq!(read.value.phase, FleetPhase::Preparing);
    let mut next = read.value.clone();
    let ahead_us = baton_cluster::records::now_us() + 600_000_000;
    next.phase = FleetPhase::Promoted;
    next.members = next.participants.clone();
    next.step = Some(0);
    next.commit_us = Some(ahead_us);
    next.switch_at_us = Some(ahead_us + 250_000);
    let desired = Desired { version: 2, rollout: Some(next.id), at_ms: 0 };
    let also = vec![(fleet.store.keys.desired("f"), serde_json::to_vec(&desired).unwrap())];
    assert!(
        fleet.runtime.block_on(fleet.store.swap(&fleet.store.keys.record("f"), &next, read.revision, also)).unwrap()
    );
    let seen = Instant::now();
    wait_until("both serve 2", || r1.serves() == Some(2) && r2.serves() == Some(2));
    assert!(seen.elapsed() < Duration::from_secs(30), "the switch waited for the coordinator's clock");
    assert!(r1.candidate().is_none());
}

#[test]
fn a_prepare_waits_for_the_drain_of_the_last_switch_and_the_rollout_commits() {
    let fleet = Fleet::new();
    let versions = [(1, false), (2, false), (3, false)];
    let (r1, r2) = fleet.pair(&versions, &versions, false);
    fleet.start(2, plan()).unwrap();
    wait_until("both prepared", || fleet.acks().iter().filter(|a| a.ok).count() == 2);
    // A request in flight on r1 across the switch (it holds the routing
    // snapshot it took): the switch's drain waits for it.
    let in_flight = r1.registry.snapshot();
    let done = fleet.finish("coordinator");
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    wait_until("both serve 2", || r1.serves() == Some(2) && r2.serves() == Some(2));
    assert!(r1.registry.status("f").is_some_and(|s| s.busy), "r1's drain is under way");

    // The next rollout starts at once: r1's prepare waits for the drain.
    fleet.start(3, plan()).unwrap();
    let coordinator = fleet.coordinate("coordinator");
    wait_until("r1's prepare waits (or has failed)", || {
        r1.health.state().waiting.contains_key("f") || fleet.acks().iter().any(|a| !a.ok)
    });
    assert!(r1.candidate().is_none(), "r1 prepared before the drain ended");
    drop(in_flight);
    let done = fleet.runtime.block_on(coordinator).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?} {:?}", done.reason, done.decisions);
    wait_until("both serve 3", || r1.serves() == Some(3) && r2.serves() == Some(3));
    assert!(r1.health.state().waiting.is_empty(), "{:?}", r1.health.state().waiting);
}
