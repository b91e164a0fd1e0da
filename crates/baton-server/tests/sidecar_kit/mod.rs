//! What the sidecar agent's tests share: a fleet over a real etcd with the
//! agent in this process, the `baton agent` and `baton fleet` binaries,
//! and the real target servers (MLServer and Triton from the benchmarks'
//! virtual environments, started by the bench scripts on free ports and
//! stopped by their pid).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_cluster::node::Node;
use baton_cluster::ops;
use baton_cluster::records::{Desired, FleetPlan, ReplicaRecord, RolloutRecord};
use baton_cluster::{
    Health, Participant, ReplicaConfig, SidecarConfig, SidecarNode, Store, StoreConfig, TargetLayout, coordinator,
};
use baton_core::files::source::{LocalRepository, Source};
use baton_testkit::etcd::Etcd;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::{Client, free_port};
use serde_json::json;

pub const LONG: Duration = Duration::from_secs(90);

pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `baton` binary under test.
pub fn baton_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_baton"))
}

/// A target server's repository, `<root>/repo`, in a temporary directory
/// removed on drop: the agent's default staging directory, beside the
/// repository, goes with it.
pub struct TargetRepo {
    root: tempfile::TempDir,
}

impl TargetRepo {
    pub fn new() -> TargetRepo {
        let root = tempfile::Builder::new().prefix("baton-target-").tempdir().unwrap();
        std::fs::create_dir(root.path().join("repo")).unwrap();
        TargetRepo { root }
    }

    pub fn path(&self) -> PathBuf {
        self.root.path().join("repo")
    }

    /// The agent's default staging directory.
    pub fn staging(&self) -> PathBuf {
        self.root.path().join("repo.baton-staging")
    }
}

/// A fleet with the agent in this process, over a real etcd.
pub struct Fleet {
    pub etcd: Etcd,
    pub runtime: tokio::runtime::Runtime,
}

/// The agent taking part for a target server.
pub struct Agent {
    pub node: Arc<SidecarNode>,
    pub stop: tokio::sync::watch::Sender<bool>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Agent {
    pub fn serves(&self) -> Option<u64> {
        self.node.serving("m").stable
    }

    pub fn candidate(&self) -> Option<u64> {
        self.node.serving("m").candidate
    }

    pub fn ready(&self) -> bool {
        self.node.readiness().is_some()
    }
}

impl Fleet {
    pub fn new() -> Fleet {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        Fleet { etcd: Etcd::start(), runtime }
    }

    pub fn spec(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.etcd.port())
    }

    pub fn store(&self) -> Store {
        self.runtime.block_on(Store::connect(&StoreConfig::plain(&self.spec()), "test")).unwrap()
    }

    pub fn agent(&self, source: &Path, target_repo: &Path, target_url: &str, layout: TargetLayout) -> Agent {
        let local = Arc::new(LocalRepository::new(source));
        self.agent_over(local, source, target_repo, target_url, layout)
    }

    /// An agent reading `source`, whose models' `model.toml` are under `specs`.
    pub fn agent_over(
        &self,
        source: Arc<dyn Source>,
        specs: &Path,
        target_repo: &Path,
        target_url: &str,
        layout: TargetLayout,
    ) -> Agent {
        let node = SidecarNode::new(SidecarConfig {
            source,
            specs: specs.to_owned(),
            target_repo: target_repo.to_owned(),
            staging: None,
            target_url: target_url.to_owned(),
            target_token: None,
            layout,
            load_timeout: Duration::from_secs(60),
        })
        .expect("the agent's directories");
        let node = Arc::new(node);
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

    pub fn stop(&self, agent: Agent) {
        let _ = agent.stop.send(true);
        self.runtime.block_on(agent.task).unwrap();
    }

    pub fn seed(&self, store: &Store, version: u64) {
        let seed = Desired { version, rollout: None, at_ms: 0 };
        self.runtime.block_on(store.put(&store.keys.desired("m"), &seed, None)).unwrap();
    }

    pub fn record(&self, store: &Store) -> Option<RolloutRecord> {
        self.runtime.block_on(store.get::<RolloutRecord>(&store.keys.record("m"))).unwrap().map(|r| r.value)
    }

    pub fn registration(&self, store: &Store, id: &str) -> Option<ReplicaRecord> {
        self.runtime.block_on(store.get::<ReplicaRecord>(&store.keys.replica(id))).unwrap().map(|r| r.value)
    }

    /// Coordinates the rollout of `m` from this test, as the CLI does.
    pub fn coordinate(&self, store: &Store) -> tokio::task::JoinHandle<Result<RolloutRecord, String>> {
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
    pub fn roll_out(&self, store: &Store, version: u64, plan: FleetPlan) -> RolloutRecord {
        self.runtime.block_on(ops::start(store, "m", version, plan, "test")).unwrap();
        self.runtime.block_on(self.coordinate(store)).unwrap().unwrap()
    }
}

pub fn plain() -> FleetPlan {
    FleetPlan { prepare_timeout_ms: 60_000, ..FleetPlan::default() }
}

pub fn mlps() -> (Mlp, Mlp) {
    (Mlp::new(&[8, 16, 1], 1), Mlp::new(&[8, 16, 1], 2))
}

/// The source repository, `m` at version 1 (and 2 unless `only_one`).
pub fn source(v1: &Mlp, v2: &Mlp, only_one: bool) -> TestRepo {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(v1, ""));
    repo.publish_mlp("m", 1, v1);
    if !only_one {
        repo.publish_mlp("m", 2, v2);
    }
    repo
}

/// The version directories in the target repository's `m`.
pub fn placed(target: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(target.join("m"))
        .map(|d| d.filter_map(Result::ok).filter(|e| e.path().is_dir()))
        .into_iter()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.parse::<u64>().is_ok())
        .collect();
    names.sort();
    names
}

/// The answer of `m` to one inference request: the version that
/// answered and the first output value.
pub fn answer(client: &Client) -> Option<(String, f64)> {
    let body = json!({ "inputs": [{ "name": "input", "shape": [1, 8], "datatype": "FP32",
                                     "data": sample_input(8, 1, 3) }] });
    let answer =
        client.try_post_raw("/v2/models/m/infer", body.to_string().as_bytes(), &[("content-type", "application/json")]);
    let answer = answer.ok().filter(|a| a.status == 200)?;
    let json = answer.json();
    let version = json["model_version"].as_str()?.to_owned();
    Some((version, json["outputs"][0]["data"][0].as_f64().unwrap_or(f64::NAN)))
}

/// A port whose next two are free too, as far as binding them says now.
fn free_run_of_three() -> u16 {
    loop {
        let port = free_port();
        let Some(last) = port.checked_add(2) else { continue };
        if (port..=last).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return port;
        }
    }
}

/// Which version of `m` answers an inference request.
pub fn answering_version(client: &Client) -> Option<String> {
    answer(client).map(|(version, _)| version)
}

/// A peer server started by a bench script, in its own process group,
/// stopped by `bench/stop.sh` on drop.
pub struct Peer {
    pub pid: String,
    pub base: String,
}

impl Peer {
    /// MLServer from `bash bench/setup-peers.sh --only mlserver`, serving
    /// `repo`, started by `bench/run-mlserver.sh`.
    pub fn mlserver(repo: &Path) -> Peer {
        let root = workspace();
        let bin = root.join(".baton/bench-venv-mlserver/bin/mlserver");
        assert!(
            bin.is_file(),
            "MLServer is not installed at {} (run `bash bench/setup-peers.sh --only mlserver`)",
            bin.display()
        );
        // The script binds PORT, PORT+1 and PORT+2; a port found free can
        // be taken by another process before MLServer binds it, so a start
        // that fails to bind is tried again on other ports.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_run_of_three();
            let output = Command::new("bash")
                .arg(root.join("bench/run-mlserver.sh"))
                .arg(repo)
                .arg(port.to_string())
                .env("MLSERVER_WORKERS", "0")
                .output()
                .expect("running bench/run-mlserver.sh");
            let said =
                format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
            if output.status.success() {
                let pid = String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or_default().trim().to_owned();
                return Peer { pid, base: format!("http://127.0.0.1:{port}") };
            }
            let lower = said.to_lowercase();
            let port_taken =
                ["port_binding_failed", "failed to bind", "already in use"].iter().any(|m| lower.contains(m));
            assert!(port_taken && attempt < 4, "MLServer did not start: {said}");
        }
    }

    /// Triton 2.51 (the tritonserver of the nvidia-pytriton wheel, from
    /// `bash bench/setup-triton.sh`) serving `repo` as it is, in explicit
    /// model control, with `args` added (e.g. `--load-model=*`); started by
    /// `bench/run-triton.sh --repo`. `Err` with the script's words when it
    /// could not start.
    pub fn try_triton(repo: &Path, args: &[&str]) -> Result<Peer, String> {
        let root = workspace();
        let bin = root.join(".baton/bench-venv-triton/tritonserver/bin/tritonserver");
        assert!(bin.is_file(), "Triton is not installed at {} (run `bash bench/setup-triton.sh`)", bin.display());
        // As for MLServer: three ports, and other ones when one of them
        // was taken before Triton bound it.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_run_of_three();
            let output = Command::new("bash")
                .arg(root.join("bench/run-triton.sh"))
                .arg("--repo")
                .arg(repo)
                .arg(port.to_string())
                .args(args)
                .env("READY_TIMEOUT", "120")
                .output()
                .expect("running bench/run-triton.sh");
            let stdout = String::from_utf8_lossy(&output.stdout);
            if output.status.success() {
                let pid = stdout.lines().last().unwrap_or_default().trim().to_owned();
                return Ok(Peer { pid, base: format!("http://127.0.0.1:{port}") });
            }
            let said = format!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
            if !said.to_lowercase().contains("already in use") || attempt >= 4 {
                return Err(said);
            }
        }
    }

    pub fn triton(repo: &Path, args: &[&str]) -> Peer {
        Peer::try_triton(repo, args).unwrap_or_else(|e| panic!("Triton did not start: {e}"))
    }

    pub fn client(&self) -> Client {
        Client::new(&self.base)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(workspace().join("bench/stop.sh")).arg(&self.pid).status();
    }
}

/// `baton agent`, the binary, with its health listener on a free loopback
/// port; stopped by SIGTERM on drop, its log printed if it was still
/// running (the test failed before stopping it).
pub struct AgentProcess {
    pub child: Child,
    pub log: tempfile::NamedTempFile,
    /// Its health listener.
    pub http: Client,
}

impl AgentProcess {
    /// Starts `baton agent` with `args` (its target, repositories and
    /// fleet) and `--http 127.0.0.1:0`, and waits until it listens. `Err`
    /// with its log when it exits first.
    pub fn try_start(args: &[String]) -> Result<AgentProcess, String> {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut child = Command::new(baton_bin())
            .arg("agent")
            .args(args)
            .args(["--http", "127.0.0.1:0"])
            .env("BATON_LOG", "info,baton=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("starting baton agent");
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        let Some(address) = line.split("http://").nth(1).and_then(|s| s.split_whitespace().next()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::fs::read_to_string(log.path()).unwrap_or_default());
        };
        let http = Client::new(&format!("http://{address}"));
        Ok(AgentProcess { child, log, http })
    }

    pub fn start(args: &[String]) -> AgentProcess {
        AgentProcess::try_start(args).unwrap_or_else(|log| panic!("baton agent did not start: {log}"))
    }

    pub fn ready(&self) -> bool {
        self.http.get("/v2/health/ready").status == 200
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
            if std::thread::panicking() {
                eprintln!("--- agent log ---\n{}", std::fs::read_to_string(self.log.path()).unwrap_or_default());
            }
        }
    }
}

/// Runs `baton fleet --cluster etcd://… --cluster-name NAME ARGS…`: whether
/// it succeeded, and what it printed.
pub fn fleet_cli(etcd: &Etcd, name: &str, args: &[&str]) -> (bool, String) {
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let output = Command::new(baton_bin())
        .args(["fleet", "--cluster", &cluster, "--cluster-name", name])
        .args(args)
        .env("BATON_LOG", "warn")
        .output()
        .expect("running baton fleet");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}
