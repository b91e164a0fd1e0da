//! The sidecar agent speaking for another server in a fleet, against a real
//! etcd and a real target server started as a child process: a baton
//! without cluster mode in explicit model control, and MLServer from the
//! benchmarks' virtual environment (`scripts/test.sh` installs it with
//! `bash bench/setup-peers.sh --only mlserver`). A rollout makes the agent stage,
//! verify, place and load the candidate; a damaged candidate aborts the
//! rollout at the agent's verify stage with the server untouched; a subset
//! step switches the server whole and an abort brings the kept version
//! back. Each test waits for the state it expects within a bound.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_cluster::node::Node;
use baton_cluster::ops::{self, Request};
use baton_cluster::records::{Desired, FleetPhase, FleetPlan, RolloutRecord};
use baton_cluster::{
    Health, Participant, ReplicaConfig, SidecarConfig, SidecarNode, Store, StoreConfig, TargetLayout, coordinator,
};
use baton_core::source::{LocalRepository, Source};
use baton_store::{Options, StoreSource};
use baton_testkit::etcd::Etcd;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{Damage, TestRepo, mlp_toml};
use baton_testkit::s3::S3;
use baton_testkit::server::{Client, Server, free_port};
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(90);

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `baton` binary under test.
fn baton_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_baton"))
}

/// A fleet of one sidecar agent, over a real etcd.
struct Fleet {
    etcd: Etcd,
    runtime: tokio::runtime::Runtime,
}

/// The agent taking part for a target server.
struct Agent {
    node: Arc<SidecarNode>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Agent {
    fn serves(&self) -> Option<u64> {
        self.node.serving("m").stable
    }

    fn candidate(&self) -> Option<u64> {
        self.node.serving("m").candidate
    }

    fn ready(&self) -> bool {
        self.node.readiness().is_some()
    }
}

impl Fleet {
    fn new() -> Fleet {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        Fleet { etcd: Etcd::start(), runtime }
    }

    fn spec(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.etcd.port())
    }

    fn store(&self) -> Store {
        self.runtime.block_on(Store::connect(&StoreConfig::plain(&self.spec()), "test")).unwrap()
    }

    fn agent(&self, source: &Path, target_repo: &Path, target_url: &str, layout: TargetLayout) -> Agent {
        let local = Arc::new(LocalRepository::new(source));
        self.agent_over(local, source, target_repo, target_url, layout)
    }

    /// An agent reading `source`, whose models' `model.toml` are under `specs`.
    fn agent_over(
        &self,
        source: Arc<dyn Source>,
        specs: &Path,
        target_repo: &Path,
        target_url: &str,
        layout: TargetLayout,
    ) -> Agent {
        let node = Arc::new(SidecarNode::new(SidecarConfig {
            source,
            specs: specs.to_owned(),
            target_repo: target_repo.to_owned(),
            staging: None,
            target_url: target_url.to_owned(),
            target_token: None,
            layout,
            load_timeout: Duration::from_secs(60),
        }));
        let config = ReplicaConfig {
            store: StoreConfig::plain(&self.spec()),
            name: "test".into(),
            id: "agent".into(),
            address: target_url.to_owned(),
            labels: Default::default(),
            lease_ttl: 2,
            coordinate: false,
            agent: true,
        };
        let participant = Participant::new(config, Arc::clone(&node), Arc::new(Health::default()));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = self.runtime.spawn(participant.run(stopped));
        Agent { node, stop, task }
    }

    fn stop(&self, agent: Agent) {
        let _ = agent.stop.send(true);
        self.runtime.block_on(agent.task).unwrap();
    }

    fn seed(&self, store: &Store, version: u64) {
        let seed = Desired { version, rollout: None, at_ms: 0 };
        self.runtime.block_on(store.put(&store.keys.desired("m"), &seed, None)).unwrap();
    }

    fn record(&self, store: &Store) -> Option<RolloutRecord> {
        self.runtime.block_on(store.get::<RolloutRecord>(&store.keys.record("m"))).unwrap().map(|r| r.value)
    }

    /// Coordinates the rollout of `m` from this test, as the CLI does.
    fn coordinate(&self, store: &Store) -> tokio::task::JoinHandle<Result<RolloutRecord, String>> {
        let store = store.clone();
        self.runtime.spawn(async move {
            let lease = store.grant(2).await.map_err(|e| e.to_string())?;
            let tenure = coordinator::campaign(&store, "m", "coordinator", lease).await.unwrap().expect("m is free");
            let health = Health::default();
            let result = tokio::select! {
                result = coordinator::coordinate(&store, "m", "coordinator", tenure, &health) => result,
                error = store.keep_alive(lease, 2) => Err(error),
            };
            coordinator::resign(&store, "m", tenure).await;
            result.map_err(|e| e.to_string())
        })
    }

    /// Starts a rollout of `m` to `version` and coordinates it to its end.
    fn roll_out(&self, store: &Store, version: u64, plan: FleetPlan) -> RolloutRecord {
        self.runtime.block_on(ops::start(store, "m", version, plan, "test")).unwrap();
        self.runtime.block_on(self.coordinate(store)).unwrap().unwrap()
    }
}

fn plain() -> FleetPlan {
    FleetPlan { prepare_timeout_ms: 60_000, ..FleetPlan::default() }
}

fn mlps() -> (Mlp, Mlp) {
    (Mlp::new(&[8, 16, 1], 1), Mlp::new(&[8, 16, 1], 2))
}

/// The source repository, `m` at version 1 (and 2 unless `only_one`).
fn source(v1: &Mlp, v2: &Mlp, only_one: bool) -> TestRepo {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(v1, ""));
    repo.publish_mlp("m", 1, v1);
    if !only_one {
        repo.publish_mlp("m", 2, v2);
    }
    repo
}

/// The version directories in the target repository's `m`.
fn placed(target: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(target.join("m"))
        .map(|d| d.filter_map(Result::ok).filter(|e| e.path().is_dir()))
        .into_iter()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// Which version of `m` answers an inference request.
fn answering_version(client: &Client) -> Option<String> {
    let body = json!({ "inputs": [{ "name": "input", "shape": [1, 8], "datatype": "FP32",
                                     "data": sample_input(8, 1, 3) }] });
    let answer =
        client.try_post_raw("/v2/models/m/infer", body.to_string().as_bytes(), &[("content-type", "application/json")]);
    let answer = answer.ok().filter(|a| a.status == 200)?;
    answer.json()["model_version"].as_str().map(str::to_owned)
}

/// A baton target serving `m` version 1 through the agent.
struct OnBaton {
    fleet: Fleet,
    store: Store,
    source: TestRepo,
    target: tempfile::TempDir,
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
    let target = tempfile::tempdir().unwrap();
    let server = Server::start(&baton_bin(), target.path(), &["--model-control", "explicit"]);
    server.wait_ready();
    let agent = fleet.agent(source.root(), target.path(), server.base(), TargetLayout::Baton);
    wait_until("the agent is ready", || agent.ready());
    server.wait_serving("m", 1);
    assert_eq!(placed(target.path()), ["1"]);
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
    assert_eq!(placed(target.path()), ["2"], "one version in place; 1 was moved out and deleted");
    assert!(!target.path().join(".baton-agent/staged/m/2").exists(), "nothing left staged");
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
    let target = tempfile::tempdir().unwrap();
    let server = Server::start(&baton_bin(), target.path(), &["--model-control", "explicit"]);
    server.wait_ready();
    let agent = fleet.agent_over(store.clone(), cache.path(), target.path(), server.base(), TargetLayout::Baton);
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
    assert_eq!(placed(target.path()), ["2"]);
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
    assert_eq!(placed(target.path()), ["1"]);
    assert!(!target.path().join(".baton-agent/staged/m/2").exists(), "the damaged copy is not kept");
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
    assert_eq!(placed(target.path()), ["2"]);
    assert!(target.path().join(".baton-agent/kept/m/1").is_dir(), "the stable version is kept aside");
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
    assert_eq!(placed(target.path()), ["1"]);
    fleet.stop(agent);
}

/// MLServer from `bash bench/setup-peers.sh`, started by
/// `bench/run-mlserver.sh` on a free port and stopped by its pid.
struct Mlserver {
    pid: String,
    base: String,
}

impl Mlserver {
    fn start(repo: &Path) -> Mlserver {
        let root = workspace();
        let venv = root.join(".baton/bench-venv-mlserver/bin/mlserver");
        assert!(
            venv.is_file(),
            "MLServer is not installed at {} (run `bash bench/setup-peers.sh --only mlserver`)",
            venv.display()
        );
        let port = free_port();
        let output = Command::new("bash")
            .arg(root.join("bench/run-mlserver.sh"))
            .arg(repo)
            .arg(port.to_string())
            .env("MLSERVER_WORKERS", "0")
            .output()
            .expect("running bench/run-mlserver.sh");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "MLServer did not start: {stdout}{}", String::from_utf8_lossy(&output.stderr));
        let pid = stdout.lines().last().unwrap_or_default().trim().to_owned();
        Mlserver { pid, base: format!("http://127.0.0.1:{port}") }
    }
}

impl Drop for Mlserver {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(workspace().join("bench/stop.sh")).arg(&self.pid).status();
    }
}

#[test]
fn against_mlserver_the_agent_places_versions_in_its_layout_and_rolls_forward_and_back() {
    let fleet = Fleet::new();
    let (v1, v2) = mlps();
    let source = source(&v1, &v2, false);
    let target = tempfile::tempdir().unwrap();
    let server = Mlserver::start(target.path());
    let client = Client::new(&server.base);
    let store = fleet.store();
    fleet.seed(&store, 1);
    let agent = fleet.agent(source.root(), target.path(), &server.base, TargetLayout::Mlserver);
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
        assert_eq!(placed(target.path()), [version.to_string()]);
        let other = 3 - version;
        let stale = client.get(&format!("/v2/models/m/versions/{other}/ready"));
        assert_ne!(stale.status, 200, "MLServer unloaded version {other}, gone from its repository");
        let switch = done.switch.expect("the switch was summarised");
        println!("MLServer switch to version {version}: {:.1} ms after the commit write", switch.last_ms);
    }
    fleet.stop(agent);
}
