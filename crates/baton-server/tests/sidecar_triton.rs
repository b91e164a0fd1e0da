//! The sidecar agent speaking for a real Triton 2.51 (the tritonserver of
//! the nvidia-pytriton wheel, python backend; `scripts/test.sh` installs it
//! with `bash bench/setup-triton.sh`) in a fleet beside a real `baton
//! serve` replica, over a real etcd, driven by the real `baton agent` and
//! `baton fleet` binaries.
//!
//! The agent's source publishes python-backend versions that bring their
//! own `config.pbtxt` and `model.py`, whose answer is their version
//! number. Version 3's `model.py` raises in `initialize`, so Triton cannot
//! load it: the agent's prepare loads it in Triton, fails with Triton's
//! reason, and the rollout aborts with every replica on its old version; a
//! later good version commits. A version 3 committed without the agent
//! (`--allow-missing 1`) leaves it not ready, counted as not serving, tried
//! again only after a wait that grows, and does not block the next
//! rollout. A version whose own configuration names another model is
//! refused at the agent's prepare. Triton restarted with `--load-model=*`
//! on the repository the agent writes finds nothing of the agent's there.

mod common;
mod sidecar_kit;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_testkit::etcd::Etcd;
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Client, Server};
use sidecar_kit::{AgentProcess, Peer, TargetRepo, answer, fleet_cli, wait_until};

const CLUSTER: &str = "tri";

/// Triton's model configuration, brought by every version.
const CONFIG: &str = r#"name: "m"
backend: "python"
max_batch_size: 0
input [ { name: "input" data_type: TYPE_FP32 dims: [ -1, 8 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ -1, 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"#;

/// A python-backend model that answers its version number, or that cannot
/// be loaded.
fn model_py(loads: bool) -> String {
    let refuse = if loads { "" } else { "        raise RuntimeError(\"this version refuses to load\")\n" };
    format!(
        "import numpy as np\n\
         import triton_python_backend_utils as pb_utils\n\
         \n\
         class TritonPythonModel:\n    \
             def initialize(self, args):\n\
         {refuse}        \
                 self.version = float(args[\"model_version\"])\n\
         \n    \
             def execute(self, requests):\n        \
                 out = []\n        \
                 for r in requests:\n            \
                     x = pb_utils.get_input_tensor_by_name(r, \"input\").as_numpy()\n            \
                     y = np.full((x.shape[0], 1), self.version, dtype=np.float32)\n            \
                     out.append(pb_utils.InferenceResponse([pb_utils.Tensor(\"output\", y)]))\n        \
                 return out\n"
    )
}

/// The agent's source: `m` in baton's layout (a `model.toml` for the
/// agent's verify options), each version a sealed python-backend setup.
fn publish(source: &TestRepo, version: u64, loads: bool) {
    publish_with(source, version, CONFIG, loads);
}

/// [`publish`], with the configuration `config`.
fn publish_with(source: &TestRepo, version: u64, config: &str, loads: bool) {
    let py = model_py(loads);
    source.write_files("m", version, &[("config.pbtxt", config.as_bytes()), ("model.py", py.as_bytes())]);
    source.seal("m", version);
}

/// A fleet of a baton replica (`r1`, ONNX versions 1 to 4 published as the
/// test goes) and an agent (`t1`) for Triton, both serving version 1.
struct Setup {
    etcd: Etcd,
    replica_repo: TestRepo,
    replica: Server,
    source: TestRepo,
    target: TargetRepo,
    triton: Peer,
    agent: AgentProcess,
}

impl Setup {
    fn start() -> Setup {
        let etcd = Etcd::start();
        let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
        // The replica joins first and seeds the fleet's version: 1.
        let replica_repo = common::repo_with("m", &[1], "");
        let args = ["--cluster", &cluster, "--cluster-name", CLUSTER, "--replica-id", "r1", "--lease-ttl", "2"];
        let replica = common::start(&replica_repo, &args);
        replica.wait_ready();

        let source = TestRepo::new();
        source.add_model("m", &baton_testkit::repo::mlp_toml(&common::mlp(1), ""));
        publish(&source, 1, true);
        let target = TargetRepo::new();
        let triton = Peer::triton(&target.path(), &[]);
        let agent = AgentProcess::start(&agent_args(&cluster, &triton, &target.path(), source.root()));
        wait_until("the agent is ready", || agent.ready());
        assert_eq!(answer(&triton.client()), Some(("1".into(), 1.0)), "Triton loaded version 1");
        Setup { etcd, replica_repo, replica, source, target, triton, agent }
    }

    fn fleet(&self, args: &[&str]) -> (bool, String) {
        fleet_cli(&self.etcd, CLUSTER, args)
    }

    /// Publishes version `v` on both sides: ONNX for the replica, python
    /// for the agent (one that Triton cannot load unless `loads`).
    fn publish(&self, v: u64, loads: bool) {
        self.replica_repo.publish_mlp("m", v, &common::mlp(v));
        publish(&self.source, v, loads);
    }

    fn replica_serves(&self) -> u64 {
        common::infer(&self.replica, "m", &[0.5; 8], 1).0
    }

    fn status(&self) -> String {
        let (ok, status) = self.fleet(&["status"]);
        assert!(ok, "{status}");
        status
    }
}

/// Requests to Triton from a thread, one after another, until stopped:
/// how many were sent and failed, and which versions answered.
struct Traffic {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, u64, BTreeSet<String>)>,
}

impl Traffic {
    fn start(base: &str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let (done, client) = (Arc::clone(&stop), Client::new(base));
        let thread = std::thread::spawn(move || {
            let (mut sent, mut failed, mut versions) = (0, 0, BTreeSet::new());
            while !done.load(Ordering::Relaxed) {
                sent += 1;
                match answer(&client) {
                    Some((version, _)) => {
                        versions.insert(version);
                    }
                    None => failed += 1,
                }
            }
            (sent, failed, versions)
        });
        Traffic { stop, thread }
    }

    fn stop(self) -> (u64, u64, BTreeSet<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// How many trial loads in Triton the agent saw fail, from its log.
fn trials(agent: &AgentProcess) -> usize {
    let log = std::fs::read_to_string(agent.log.path()).unwrap_or_default();
    log.matches("The target server could not serve the candidate").count()
}

fn agent_args(cluster: &str, triton: &Peer, target: &Path, source: &Path) -> Vec<String> {
    let mut args: Vec<String> =
        ["--target", &triton.base, "--target-kind", "triton", "--cluster", cluster, "--cluster-name", CLUSTER]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
    args.extend(["--replica-id", "t1", "--lease-ttl", "2", "--load-timeout-s", "60"].map(str::to_owned));
    args.extend(["--target-repo".to_owned(), target.display().to_string()]);
    args.extend(["--source-repo".to_owned(), source.display().to_string()]);
    args
}

#[test]
fn a_version_triton_cannot_load_aborts_the_rollout_with_its_reason_and_a_later_good_one_commits() {
    let s = Setup::start();
    s.publish(2, true);
    let (ok, out) = s.fleet(&["rollout", "m", "--version", "2", "--prepare-timeout", "60s"]);
    assert!(ok, "{out}");
    assert_eq!(answer(&s.triton.client()), Some(("2".into(), 2.0)));
    assert_eq!(s.replica_serves(), 2);

    // Requests to Triton throughout, none naming a version: none may fail.
    let traffic = Traffic::start(&s.triton.base);

    // Triton refuses version 3 at the agent's prepare: the fleet aborts.
    s.publish(3, false);
    let (ok, out) = s.fleet(&["rollout", "m", "--version", "3", "--prepare-timeout", "60s"]);
    assert!(!ok, "the rollout of a version Triton cannot load must not commit: {out}");
    assert!(out.contains("replica t1 could not prepare: load"), "{out}");
    assert!(out.contains("this version refuses to load"), "Triton's reason reaches the operator: {out}");
    assert_eq!(answer(&s.triton.client()), Some(("2".into(), 2.0)), "Triton keeps version 2");
    assert_eq!(s.replica_serves(), 2, "the baton replica keeps version 2");
    let status = s.status();
    assert!(status.contains("the fleet serves version 2"), "{status}");
    assert!(s.agent.ready(), "the agent serves what the fleet committed");
    let models = s.triton.client().post_json("/v2/repository/index", &serde_json::json!({})).json();
    let names: Vec<&str> = models.as_array().unwrap().iter().filter_map(|m| m["name"].as_str()).collect();
    assert!(names.iter().all(|n| *n == "m"), "nothing of the prepare is left in Triton: {models}");

    // A good version goes through.
    s.publish(4, true);
    let (ok, out) = s.fleet(&["rollout", "m", "--version", "4", "--prepare-timeout", "60s"]);
    assert!(ok, "{out}");
    assert!(out.contains("2 replicas switched within"), "{out}");
    // For docs/fleet.md: how long each prepared, and how far apart they switched.
    let (_, json) = s.fleet(&["status", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    for id in ["r1", "t1"] {
        println!("prepare of version 4 on {id}: {} ms", json["acks"]["m"][id]["prepare_ms"]);
    }
    println!("{}", out.lines().find(|l| l.contains("switched within")).unwrap_or_default());
    assert_eq!(answer(&s.triton.client()), Some(("4".into(), 4.0)));
    assert_eq!(s.replica_serves(), 4);
    let (sent, failed, versions) = traffic.stop();
    println!(
        "requests to Triton during the rollouts of 3 and 4: {sent} sent, {failed} failed, answered by {versions:?}"
    );
    assert!(sent > 0);
    assert_eq!(failed, 0, "no request to Triton failed during the trial loads and the switch");
    assert!(!versions.contains("3"), "version 3 never answered: {versions:?}");
    let config = std::fs::read_to_string(s.target.path().join("m/config.pbtxt")).unwrap();
    assert_eq!(config, CONFIG, "the configuration the version brought is the one in place");

    // A version whose configuration names another model: Triton would
    // refuse it under the model's directory, so the agent refuses it at
    // prepare, and nobody switches.
    s.replica_repo.publish_mlp("m", 5, &common::mlp(5));
    publish_with(&s.source, 5, &CONFIG.replace("name: \"m\"", "name: \"other\""), true);
    let (ok, out) = s.fleet(&["rollout", "m", "--version", "5", "--prepare-timeout", "60s"]);
    assert!(!ok, "a version whose configuration names another model must not commit: {out}");
    assert!(out.contains("replica t1 could not prepare: verify"), "{out}");
    assert!(out.contains("names model \"other\", not \"m\""), "{out}");
    assert_eq!(answer(&s.triton.client()), Some(("4".into(), 4.0)), "Triton keeps version 4");
    assert_eq!(s.replica_serves(), 4);
}

#[test]
fn a_version_committed_without_the_agent_leaves_it_not_ready_and_does_not_block_the_next_rollout() {
    let s = Setup::start();
    s.publish(2, true);
    let (ok, out) = s.fleet(&["rollout", "m", "--version", "2", "--prepare-timeout", "60s"]);
    assert!(ok, "{out}");

    // Version 3 is committed without the agent, which cannot load it.
    s.publish(3, false);
    let args = ["rollout", "m", "--version", "3", "--prepare-timeout", "60s", "--allow-missing", "1"];
    let (ok, out) = s.fleet(&args);
    assert!(ok, "{out}");
    let (committed, trials_at_commit) = (Instant::now(), trials(&s.agent));
    assert_eq!(s.replica_serves(), 3);
    assert_eq!(answer(&s.triton.client()), Some(("2".into(), 2.0)), "Triton keeps version 2");
    wait_until("the agent says it is not ready", || !s.agent.ready());
    // Counted from the registrations, which follow a switch within moments.
    wait_until("status counts the replica that switched, and only it", || {
        s.status().contains("1 of 2 replicas serve it")
    });
    // After its first try of version 3 (its converge) failed, it says why.
    wait_until("status names the agent, what it serves and why", || {
        s.status().contains("t1 serves version 2: could not load version 3, which the fleet committed: load:")
    });
    let (ok, json) = s.fleet(&["status", "--json"]);
    assert!(ok, "{json}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let t1 = json["replicas"].as_array().unwrap().iter().find(|r| r["id"] == "t1").expect("t1 registered").clone();
    assert_eq!(t1["ready"], false, "{t1}");
    assert_eq!(t1["models"]["m"]["stable"], 2, "it says what it serves: {t1}");
    assert!(t1["note"].as_str().is_some_and(|n| n.contains("3")), "it says why: {t1}");
    // Nor is it tried again every few seconds: each try loads the whole
    // version in Triton, beside the one it serves. Counted over 30 s from
    // the commit (after the trial of its prepare).
    let window = Duration::from_secs(30);
    std::thread::sleep(window.saturating_sub(committed.elapsed()));
    let tried = trials(&s.agent) - trials_at_commit;
    assert!(tried <= 2, "{tried} trial loads of a version Triton refused, within {window:?} of its commit");

    // The next rollout is not blocked by the version the agent cannot load.
    s.publish(4, true);
    let (ok, out) = s.fleet(&["rollout", "m", "--version", "4", "--prepare-timeout", "30s"]);
    assert!(ok, "{out}");
    assert_eq!(answer(&s.triton.client()), Some(("4".into(), 4.0)));
    assert_eq!(s.replica_serves(), 4);
    wait_until("the agent is ready again", || s.agent.ready());
    wait_until("status counts both", || s.status().contains("2 of 2 replicas serve it"));
}

#[test]
fn triton_restarted_with_every_model_starts_after_the_agent_staged_and_placed_versions() {
    let s = Setup::start();
    s.publish(2, true);
    let (ok, out) = s.fleet(&["rollout", "m", "--version", "2", "--prepare-timeout", "60s"]);
    assert!(ok, "{out}");
    let Setup { triton, target, agent, .. } = s;
    drop(agent);
    drop(triton);
    // Explicit model control, every model in the repository at start.
    let again = Peer::try_triton(&target.path(), &["--load-model=*"]);
    let again = again.unwrap_or_else(|e| panic!("Triton could not start on the repository the agent wrote: {e}"));
    assert_eq!(answer(&again.client()), Some(("2".into(), 2.0)));
}
