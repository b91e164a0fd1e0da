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

    let staging = tempfile::tempdir().unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(bin())
        .arg("agent")
        .args(["--target", target.base(), "--target-kind", "baton", "--http", "127.0.0.1:0"])
        .arg("--target-repo")
        .arg(target_repo.root())
        .arg("--source-repo")
        .arg(source.root())
        .arg("--staging-dir")
        .arg(staging.path())
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

/// A source with `m` version 1, a baton target, and the arguments of an
/// agent for them in a fleet on `etcd`.
fn agent_setup(etcd: &Etcd) -> (TestRepo, TestRepo, baton_testkit::server::Server, tempfile::TempDir, Vec<String>) {
    let source = TestRepo::new();
    source.add_model("m", &mlp_toml(&mlp(1), ""));
    source.publish_mlp("m", 1, &mlp(1));
    let target_repo = TestRepo::new();
    let target = start(&target_repo, &["--model-control", "explicit"]);
    target.wait_ready();
    let staging = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        "--target",
        target.base(),
        "--target-kind",
        "baton",
        "--cluster",
        &format!("etcd://127.0.0.1:{}", etcd.port()),
        "--cluster-name",
        "t",
        "--replica-id",
        "sidecar-1",
        "--lease-ttl",
        "2",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain(["--target-repo".to_owned(), target_repo.root().display().to_string()])
    .chain(["--source-repo".to_owned(), source.root().display().to_string()])
    .chain(["--staging-dir".to_owned(), staging.path().display().to_string()])
    .collect();
    (source, target_repo, target, staging, args)
}

/// Starts `baton agent` with `args` and `--http 127.0.0.1:0`: the process
/// and its health listener, or what it printed when it exited.
fn spawn_agent(args: &[String]) -> Result<(AgentProcess, Client), String> {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(bin())
        .arg("agent")
        .args(args)
        .args(["--http", "127.0.0.1:0"])
        .env("BATON_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("starting baton agent");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let Some(address) = line.split("http://").nth(1).and_then(|s| s.split_whitespace().next()).map(str::to_owned)
    else {
        let _ = child.wait();
        return Err(std::fs::read_to_string(log.path()).unwrap_or_default());
    };
    Ok((AgentProcess { child, log }, Client::new(&format!("http://{address}"))))
}

#[test]
fn the_agents_state_needs_its_token_and_its_health_does_not() {
    let etcd = Etcd::start();
    let (_source, target_repo, _target, _staging, mut args) = agent_setup(&etcd);
    let (_dir, token) = common::token_file("agent-s3cret");
    args.extend(["--http-token-file".to_owned(), token]);
    let (agent, http) = spawn_agent(&args).unwrap_or_else(|log| panic!("the agent did not start: {log}"));
    eventually("the agent to be ready", || (http.get("/v2/health/ready").status == 200).then_some(()));
    assert_eq!(http.get("/v2/health/live").status, 200, "health stays open for probes");

    let refused = http.get("/baton/v1/agent");
    assert_eq!(refused.status, 401, "the state without a token");
    assert!(refused.error().contains("--http-token-file"), "{}", refused.error());
    let wrong = http.get_with("/baton/v1/agent", &[("authorization", "Bearer not-it")]);
    assert_eq!(wrong.status, 401);
    let state = http.get_with("/baton/v1/agent", &[("authorization", "Bearer agent-s3cret")]);
    assert_eq!(state.status, 200);
    assert_eq!(state.json()["models"]["m"]["stable"], 1, "{}", state.json());
    assert!(!String::from_utf8_lossy(&refused.body).contains("s3cret"));
    drop(agent);
    drop(target_repo);
}

#[test]
fn a_target_url_with_credentials_is_refused_without_echoing_them() {
    let etcd = Etcd::start();
    let (_source, _target_repo, target, _staging, mut args) = agent_setup(&etcd);
    let with_secret = target.base().replace("http://", "http://admin:pa55word@");
    let at = args.iter().position(|a| a == "--target").unwrap();
    args[at + 1] = with_secret;
    let log = spawn_agent(&args).err().expect("an agent given credentials in its target URL must not start");
    assert!(log.contains("--target-token-file"), "{log}");
    assert!(!log.contains("pa55word"), "the credentials are not repeated: {log}");
}
