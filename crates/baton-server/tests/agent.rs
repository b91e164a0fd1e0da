//! `baton agent`, black box: the real binary as the agent of a real baton
//! target (explicit model control) in a fleet over a real etcd. It joins,
//! has the target load the fleet's version, reports ready on its health
//! listener, registers as an agent, and on SIGTERM leaves the fleet (its
//! registration goes with its lease) and exits 0.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use baton_testkit::etcd::Etcd;
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::{Client, eventually};
use common::{bin, mlp, start};

/// The agent process; killed on drop if the test failed before stopping it.
struct AgentProcess {
    child: Child,
    log: tempfile::NamedTempFile,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            eprintln!("--- agent log ---\n{}", std::fs::read_to_string(self.log.path()).unwrap_or_default());
        }
    }
}

#[test]
fn the_agent_loads_the_fleets_version_on_its_target_reports_ready_and_leaves_on_sigterm() {
    let etcd = Etcd::start();
    let source = TestRepo::new();
    source.add_model("m", &mlp_toml(&mlp(1), ""));
    source.publish_mlp("m", 1, &mlp(1));
    let target_repo = TestRepo::new();
    let target = start(&target_repo, &["--model-control", "explicit"]);
    target.wait_ready();

    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(bin())
        .arg("agent")
        .args(["--target", target.base(), "--target-kind", "baton", "--http", "127.0.0.1:0"])
        .arg("--target-repo")
        .arg(target_repo.root())
        .arg("--source-repo")
        .arg(source.root())
        .args(["--cluster", &format!("etcd://127.0.0.1:{}", etcd.port()), "--cluster-name", "t"])
        .args(["--replica-id", "sidecar-1", "--label", "zone=a", "--lease-ttl", "2"])
        .env("BATON_LOG", "info,baton=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("starting baton agent");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let mut agent = AgentProcess { child, log };
    let address = line.split("http://").nth(1).and_then(|s| s.split_whitespace().next()).unwrap_or_else(|| {
        panic!("no address in {line:?}: {}", std::fs::read_to_string(agent.log.path()).unwrap_or_default())
    });
    let health = Client::new(&format!("http://{address}"));
    assert_eq!(health.get("/v2/health/live").status, 200);

    eventually("the agent to be ready", || (health.get("/v2/health/ready").status == 200).then_some(()));
    target.wait_serving("m", 1);
    let state = health.get("/baton/v1/agent").json();
    assert_eq!(state["replica"], "sidecar-1");
    assert_eq!(state["models"]["m"]["stable"], 1, "{state}");
    assert!(target_repo.root().join("m/1/MANIFEST").is_file(), "the version is in place in baton's layout");
    let registered = etcd.get("/baton/t/replicas/sidecar-1").expect("the agent registered");
    let record: serde_json::Value = serde_json::from_slice(&registered).unwrap();
    assert_eq!((record["agent"].as_bool(), record["labels"]["zone"].as_str()), (Some(true), Some("a")), "{record}");

    let pid = agent.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = eventually("the agent to exit", || agent.child.try_wait().unwrap());
    assert!(status.success(), "{status:?}");
    assert!(etcd.get("/baton/t/replicas/sidecar-1").is_none(), "its registration left with its lease");
    assert_eq!(target.status("m")["serving"], 1, "the target keeps serving");
}
