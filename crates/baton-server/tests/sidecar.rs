//! The sidecar agent speaking for another server in a fleet, against a real
//! etcd and a real target server started as a child process: a baton
//! without cluster mode in explicit model control, and MLServer from the
//! benchmarks' virtual environment (`scripts/test.sh` installs it with
//! `bash bench/setup-peers.sh --only mlserver`). A rollout makes the agent stage,
//! verify, place and load the candidate; a damaged candidate aborts the
//! rollout at the agent's verify stage with the server untouched; a subset
//! step switches the server whole and an abort brings the kept version
//! back; when the server cannot load the kept version again, the agent is
//! not ready until it has the server serve the published one. Each test
//! waits for the state it expects within a bound.

mod sidecar_kit;

use std::sync::Arc;
use std::time::Duration;

use baton_cluster::node::Node;
use baton_cluster::ops::{self, Request};
use baton_cluster::records::{FleetPhase, FleetPlan};
use baton_cluster::{Store, TargetLayout};
use baton_core::files::source::Source;
use baton_store::{Options, StoreSource};
use baton_testkit::onnx::Mlp;
use baton_testkit::repo::{Damage, TestRepo};
use baton_testkit::s3::S3;
use baton_testkit::server::{Client, Server};
use serde_json::Value;
use sidecar_kit::{
    Agent, Fleet, Peer, TargetRepo, answering_version, baton_bin, mlps, placed, plain, source, wait_until,
};

/// A baton target serving `m` version 1 through the agent.
struct OnBaton {
    fleet: Fleet,
    store: Store,
    source: TestRepo,
    target: TargetRepo,
    server: Server,
    agent: Agent,
    v2: Mlp,
}

/// Starts a baton without cluster mode, loading only what it is told, and
/// its agent over a source holding `m` version 1 (and 2 unless
/// `only_one`); waits until the agent is ready and the server serves 1.
/// Unless `seeded`, the fleet has no version yet and the agent seeds its
/// newest.
fn on_baton(only_one: bool, seeded: bool) -> OnBaton {
    let fleet = Fleet::new();
    let store = fleet.store();
    if seeded {
        fleet.seed(&store, 1);
    }
    let (v1, v2) = mlps();
    let source = source(&v1, &v2, only_one);
    let target = TargetRepo::new();
    let server = Server::start(&baton_bin(), &target.path(), &["--model-control", "explicit"]);
    server.wait_ready();
    let agent = fleet.agent(source.root(), &target.path(), server.base(), TargetLayout::Baton);
    wait_until("the agent is ready", || agent.ready());
    server.wait_serving("m", 1);
    assert_eq!(placed(&target.path()), ["1"]);
    OnBaton { fleet, store, source, target, server, agent, v2 }
}

#[test]
fn a_fleet_rollout_makes_the_agent_stage_verify_place_and_load_the_candidate_on_a_baton() {
    // The fleet has no version yet: the agent seeds its newest, 1, and has
    // the server load it before it reports ready.
    let OnBaton { fleet, store, source, target, server, agent, v2 } = on_baton(true, false);
    source.publish_mlp("m", 2, &v2);
    let done = fleet.roll_out(&store, 2, plain());
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    assert_eq!(done.switch.as_ref().map(|s| s.replicas), Some(1), "the agent reported its switch");
    wait_until("the agent put 2 into place", || agent.serves() == Some(2) && agent.candidate().is_none());
    server.wait_serving("m", 2);
    assert_eq!(answering_version(&server.client()).as_deref(), Some("2"));
    assert_eq!(placed(&target.path()), ["2"], "one version in place; 1 was moved out and deleted");
    assert!(!target.staging().join("staged/m/2").exists(), "nothing left staged");
    assert!(!target.path().join(".baton-agent").exists(), "the agent stages outside the target's repository");
    fleet.stop(agent);
}

#[test]
fn the_agent_reports_ready_only_once_its_registration_says_it_is() {
    let fleet = Fleet::new();
    let store = fleet.store();
    fleet.seed(&store, 1);
    let (v1, v2) = mlps();
    let source = source(&v1, &v2, true);
    let target = TargetRepo::new();
    let server = Server::start(&baton_bin(), &target.path(), &["--model-control", "explicit"]);
    server.wait_ready();
    let agent = fleet.agent(source.root(), &target.path(), server.base(), TargetLayout::Baton);
    // The first instant the agent says ready, the fleet must see it so.
    let deadline = std::time::Instant::now() + sidecar_kit::LONG;
    while !agent.ready() {
        assert!(std::time::Instant::now() < deadline, "the agent never became ready");
        std::thread::sleep(Duration::from_millis(1));
    }
    let registered = fleet.registration(&store, "agent").expect("the agent registered");
    assert!(registered.ready, "the agent said ready before its registration did: {registered:?}");
    fleet.stop(agent);
}

#[test]
fn a_candidate_the_target_cannot_load_aborts_the_rollout_at_the_agents_prepare() {
    let OnBaton { fleet, store, source, target, server, agent, .. } = on_baton(true, false);
    // Files that verify against their MANIFEST, but no model the server can load.
    source.write_files("m", 2, &[("model.onnx", b"these bytes are no ONNX model")]);
    source.seal("m", 2);
    let done = fleet.roll_out(&store, 2, plain());
    assert_eq!(done.phase, FleetPhase::Aborted, "{:?}", done.decisions);
    let reason = done.reason.unwrap_or_default();
    assert!(reason.contains("replica agent could not prepare: load"), "{reason}");
    assert_eq!(agent.serves(), Some(1));
    assert_eq!(agent.candidate(), None);
    assert!(agent.ready());
    assert_eq!(server.status("m")["serving"], 1, "the server kept its version");
    assert_eq!(answering_version(&server.client()).as_deref(), Some("1"));
    assert_eq!(placed(&target.path()), ["1"]);
    let entries: Vec<String> = std::fs::read_dir(target.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    assert_eq!(entries, ["m"], "nothing of the prepare is left in the target's repository");
    fleet.stop(agent);
}

#[test]
fn an_agent_over_an_object_store_fetches_the_candidate_in_prepare_and_places_it() {
    let s3 = S3::start();
    s3.create_bucket("models");
    let (v1, v2) = mlps();
    let published = source(&v1, &v2, true);
    s3.publish_model("models", "prod", &published.root().join("m"));
    let cache = tempfile::tempdir().unwrap();
    let mut options = Options::new("s3://models/prod", cache.path().to_owned());
    options.settings = s3.env().into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
    options.poll = Duration::from_millis(100);
    let store = Arc::new(StoreSource::open(options).unwrap());
    let fleet = Fleet::new();
    let etcd_store = fleet.store();
    let target = TargetRepo::new();
    let server = Server::start(&baton_bin(), &target.path(), &["--model-control", "explicit"]);
    server.wait_ready();
    let agent = fleet.agent_over(store.clone(), cache.path(), &target.path(), server.base(), TargetLayout::Baton);
    wait_until("the agent is ready", || agent.ready());
    server.wait_serving("m", 1);

    published.publish_mlp("m", 2, &v2);
    s3.publish_version("models", "prod", "m", 2, &published.version_dir("m", 2));
    store.refresh();
    let done = fleet.roll_out(&etcd_store, 2, plain());
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    wait_until("the agent put 2 into place", || agent.serves() == Some(2) && agent.candidate().is_none());
    server.wait_serving("m", 2);
    assert_eq!(answering_version(&server.client()).as_deref(), Some("2"));
    assert_eq!(placed(&target.path()), ["2"]);
    assert!(store.store_answer().unwrap().bytes_fetched > 0, "downloaded from the store");
    fleet.stop(agent);
}

#[test]
fn a_damaged_candidate_aborts_with_the_agents_verify_reason_and_the_server_keeps_its_version() {
    let OnBaton { fleet, store, source, target, server, agent, v2 } = on_baton(true, false);
    source.publish_damaged("m", 2, &v2, Damage::FlipByte);
    let done = fleet.roll_out(&store, 2, plain());
    assert_eq!(done.phase, FleetPhase::Aborted);
    let reason = done.reason.unwrap_or_default();
    assert!(reason.contains("replica agent could not prepare: verify"), "{reason}");
    assert!(reason.contains("SHA-256"), "the manifest check names the mismatch: {reason}");
    assert_eq!(agent.serves(), Some(1));
    assert_eq!(agent.candidate(), None);
    assert_eq!(server.status("m")["serving"], 1, "the server saw nothing");
    assert_eq!(placed(&target.path()), ["1"]);
    assert!(!target.staging().join("staged/m/2").exists(), "the damaged copy is not kept");
    fleet.stop(agent);
}

#[test]
fn a_subset_step_switches_the_server_whole_and_an_abort_brings_the_kept_version_back() {
    // The source must outlive the test: the agent stages from it.
    let OnBaton { fleet, store, source: _source, target, server, agent, .. } = on_baton(false, true);
    // Gray: the first step's subset is this agent alone. It sends no
    // observations, so the judgement can only be inconclusive and the
    // rollout holds at the step until an operator acts.
    let plan = FleetPlan { steps: vec![50.0, 100.0], interval_ms: 500, ..plain() };
    fleet.runtime.block_on(ops::start(&store, "m", 2, plan, "test")).unwrap();
    let coordinator = fleet.coordinate(&store);
    wait_until("the subset is committed", || fleet.record(&store).is_some_and(|r| r.phase == FleetPhase::Committed));
    wait_until("the agent switched the server whole", || agent.node.serving("m").candidate_percent == 100.0);
    server.wait_serving("m", 2);
    assert_eq!(placed(&target.path()), ["2"]);
    assert!(target.staging().join("kept/m/1").is_dir(), "the stable version is kept aside");
    wait_until("a judgement was made", || {
        fleet.record(&store).is_some_and(|r| r.decisions.iter().any(|d| d.action == "held"))
    });
    let record = fleet.record(&store).unwrap();
    let verdict = record.decisions.last().and_then(|d| d.verdict.clone()).expect("a verdict");
    assert!(verdict.reason.contains("merged from 0 replicas"), "no observations from a sidecar: {}", verdict.reason);

    fleet.runtime.block_on(ops::request(&store, "m", Request::Abort, "test")).unwrap();
    let done = fleet.runtime.block_on(coordinator).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Aborted);
    wait_until("the agent brought 1 back", || agent.candidate().is_none());
    server.wait_serving("m", 1);
    assert_eq!(agent.serves(), Some(1));
    assert_eq!(placed(&target.path()), ["1"]);
    fleet.stop(agent);
}

#[test]
fn a_kept_version_the_server_cannot_load_again_never_leaves_the_agent_ready_beside_the_candidate() {
    let OnBaton { fleet, store, source: _source, target, server, agent, .. } = on_baton(false, true);
    let plan = FleetPlan { steps: vec![50.0, 100.0], interval_ms: 500, ..plain() };
    fleet.runtime.block_on(ops::start(&store, "m", 2, plan, "test")).unwrap();
    let coordinator = fleet.coordinate(&store);
    wait_until("the agent switched the server whole", || agent.node.serving("m").candidate_percent == 100.0);
    server.wait_serving("m", 2);
    // The copy kept aside is damaged: the server cannot load it again.
    let kept = target.staging().join("kept/m/1/model.onnx");
    assert!(kept.is_file(), "the stable version is kept aside");
    std::fs::write(&kept, b"not the bytes its MANIFEST names").unwrap();

    fleet.runtime.block_on(ops::request(&store, "m", Request::Abort, "test")).unwrap();
    let done = fleet.runtime.block_on(coordinator).unwrap().unwrap();
    assert_eq!(done.phase, FleetPhase::Aborted);
    wait_until("the agent took the candidate back", || agent.candidate().is_none());
    // Whenever the agent says it is ready on version 1, its server answers
    // with version 1: it went back to the published copy.
    wait_until("the agent is ready on version 1 and its server answers 1", || {
        let ready = agent.ready() && agent.serves() == Some(1);
        if ready {
            assert_eq!(answering_version(&server.client()).as_deref(), Some("1"), "ready beside the candidate");
        }
        ready
    });
    assert_eq!(placed(&target.path()), ["1"]);
    fleet.stop(agent);
}

#[test]
fn against_mlserver_the_agent_places_versions_in_its_layout_and_rolls_forward_and_back() {
    let fleet = Fleet::new();
    let (v1, v2) = mlps();
    let source = source(&v1, &v2, false);
    let target = TargetRepo::new();
    let server = Peer::mlserver(&target.path());
    let client = Client::new(&server.base);
    let store = fleet.store();
    fleet.seed(&store, 1);
    let agent = fleet.agent(source.root(), &target.path(), &server.base, TargetLayout::Mlserver);
    wait_until("the agent is ready", || agent.ready());
    assert_eq!(answering_version(&client).as_deref(), Some("1"));
    let settings: Value =
        serde_json::from_slice(&std::fs::read(target.path().join("m/1/model-settings.json")).unwrap()).unwrap();
    assert_eq!(settings["parameters"]["version"], "1");

    for version in [2, 1] {
        let done = fleet.roll_out(&store, version, plain());
        assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
        wait_until("the agent put the version into place", || agent.serves() == Some(version));
        assert_eq!(answering_version(&client), Some(version.to_string()));
        assert_eq!(placed(&target.path()), [version.to_string()]);
        let other = 3 - version;
        let stale = client.get(&format!("/v2/models/m/versions/{other}/ready"));
        assert_ne!(stale.status, 200, "MLServer unloaded version {other}, gone from its repository");
        let switch = done.switch.expect("the switch was summarised");
        println!("MLServer switch to version {version}: {:.1} ms after the commit write", switch.last_ms);
    }
    fleet.stop(agent);
}
