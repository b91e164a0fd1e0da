//! A fleet of real `baton serve --cluster` replicas under traffic, with
//! processes killed for real: a replica killed with SIGKILL while it
//! prepares a model that takes seconds to prepare, the `baton fleet
//! rollout` process killed mid-rollout, and etcd restarted while a gray
//! step is committed. In each case no replica serves a version the fleet
//! did not commit, every live replica ends on one version, and the live
//! replicas fail no request. And a replica upgraded to a new process
//! (`baton upgrade`) during a gray step: the fleet sees the same replica
//! under the same lease throughout, its coordination goes on, and the
//! rollout promotes. And `baton fleet rollout`, given every member of a
//! three-member etcd, whose member hangs mid-rollout: it coordinates on
//! through another to the end.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_testkit::etcd::{Etcd, EtcdCluster};
use baton_testkit::onnx::Mlp;
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::{Client, Server, eventually};
use common::{Reaper, bin};

use serde_json::Value;

/// A model that takes seconds to prepare: its warmup runs large batches.
fn slow_mlp(version: u64) -> Mlp {
    Mlp::new(&[64, 1024, 1024, 2], 2000 + version)
}

const SLOW_TOML: &str = "[warmup]\nbatch_sizes = [2048, 4096, 4096, 8192]\nmax_latency_ms = 60000\n";

fn slow_repo(versions: &[u64]) -> TestRepo {
    let repo = TestRepo::new();
    repo.add_model("s", &mlp_toml(&slow_mlp(1), SLOW_TOML));
    for &v in versions {
        repo.publish_mlp("s", v, &slow_mlp(v));
    }
    repo
}

fn cluster(etcd: &Etcd) -> String {
    format!("etcd://127.0.0.1:{}", etcd.port())
}

fn replica(etcd: &Etcd, repo: &TestRepo, id: &str) -> Server {
    let cluster = cluster(etcd);
    let args = ["--cluster", &cluster, "--cluster-name", "ff", "--replica-id", id, "--lease-ttl", "2"];
    common::start(repo, &args)
}

/// `baton fleet … ARGS`, started and left running.
fn fleet_child(etcd: &Etcd, args: &[&str]) -> Child {
    Command::new(bin())
        .args(["fleet", "--cluster", &cluster(etcd), "--cluster-name", "ff"])
        .args(args)
        .env("BATON_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting baton fleet")
}

/// The JSON record at `key` under the fleet's keys, read from etcd.
fn read(etcd: &Etcd, key: &str) -> Option<Value> {
    let bytes = etcd.get(&format!("/baton/ff/{key}"))?;
    Some(serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{key} is not JSON ({e})")))
}

/// The rollout record of `s`, if any.
fn record(etcd: &Etcd) -> Option<Value> {
    read(etcd, "record/s")
}

/// The version the fleet committed for `s`.
fn desired(etcd: &Etcd) -> Option<u64> {
    read(etcd, "desired/s")?["version"].as_u64()
}

/// Requests to one replica from a thread until stopped: how many were
/// sent and failed, and which versions answered.
struct Traffic {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<BTreeSet<u64>>>,
    base: String,
}

impl Traffic {
    fn start(server: &Server) -> Traffic {
        let (stop, sent, failed) =
            (Arc::<AtomicBool>::default(), Arc::<AtomicU64>::default(), Arc::<AtomicU64>::default());
        let (s, n, f) = (Arc::clone(&stop), Arc::clone(&sent), Arc::clone(&failed));
        let client: Client = server.client();
        let thread = std::thread::spawn(move || {
            let mut versions = BTreeSet::new();
            let body = common::request(&[0.5; 64], 1);
            while !s.load(Ordering::Relaxed) {
                n.fetch_add(1, Ordering::Relaxed);
                match client.try_post_raw("/v2/models/s/infer", body.to_string().as_bytes(), &[]) {
                    Ok(answer) if answer.status == 200 => {
                        versions.insert(common::version_of(&answer.json()));
                    }
                    _ => {
                        f.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            versions
        });
        Traffic { stop, sent, failed, thread: Some(thread), base: server.base().to_owned() }
    }

    /// Stops; returns what was sent, what failed and the versions seen.
    fn stop(mut self) -> (u64, u64, BTreeSet<u64>) {
        self.stop.store(true, Ordering::Relaxed);
        let versions = self.thread.take().expect("running").join().expect("the traffic thread");
        (self.sent.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed), versions)
    }

    fn assert_clean(self, allowed: &[u64]) {
        let base = self.base.clone();
        let (sent, failed, versions) = self.stop();
        assert!(sent > 0, "no request was sent to {base}");
        assert_eq!(failed, 0, "{failed} of {sent} requests to {base} failed");
        assert!(versions.iter().all(|v| allowed.contains(v)), "{base} answered from {versions:?}");
    }
}

/// Repositories of `s` version 1 that prepare quickly: the default warmup.
fn quick_repos(count: usize) -> Vec<TestRepo> {
    (0..count)
        .map(|_| {
            let repo = TestRepo::new();
            repo.add_model("s", &mlp_toml(&slow_mlp(1), ""));
            repo.publish_mlp("s", 1, &slow_mlp(1));
            repo
        })
        .collect()
}

/// Starts a replica on each repository (`r1`, `r2`, …), waits until all
/// are ready, publishes version 2 in every repository and starts traffic
/// to each.
fn fleet_of(etcd: &Etcd, repos: &[TestRepo]) -> (Vec<Server>, Vec<Traffic>) {
    let replicas: Vec<Server> =
        repos.iter().enumerate().map(|(i, repo)| replica(etcd, repo, &format!("r{}", i + 1))).collect();
    for r in &replicas {
        r.wait_ready();
    }
    for repo in repos {
        repo.publish_mlp("s", 2, &slow_mlp(2));
    }
    let traffic = replicas.iter().map(Traffic::start).collect();
    (replicas, traffic)
}

/// What `s` serves on a replica, from its status.
fn serving(server: &Server) -> (Option<u64>, bool) {
    let status = server.status("s");
    let phase = status["rollout"]["phase"].as_str().unwrap_or_default();
    (status["serving"].as_u64(), phase == "running" || phase == "paused")
}

/// Whether the replica is working on a candidate of `s` (preparing it).
fn preparing(server: &Server) -> bool {
    let status = server.status("s");
    status["busy"] == true
}

#[test]
fn a_replica_killed_while_it_prepares_aborts_the_rollout_and_the_others_serve_on() {
    let etcd = Etcd::start();
    let repos: Vec<TestRepo> = (0..3).map(|_| slow_repo(&[1])).collect();
    let (mut replicas, traffic) = fleet_of(&etcd, &repos);
    let mut rollout =
        Reaper(Some(fleet_child(&etcd, &["rollout", "s", "--version", "2", "--prepare-timeout", "120s"])));
    eventually("r3 to be preparing version 2", || preparing(&replicas[2]).then_some(()));
    let mut traffic = traffic;
    let victim_traffic = traffic.pop().expect("three");
    let _ = victim_traffic.stop();
    let mut victim = replicas.pop().expect("three");
    victim.signal("KILL");
    victim.wait_exit();
    let output = rollout.0.take().expect("running").wait_with_output().expect("the rollout's end");
    let out = format!("{}{}", common::text(&output.stdout), common::text(&output.stderr));
    assert!(!output.status.success(), "the rollout should abort: {out}");
    assert!(out.contains("r3") && out.contains("lost its lease"), "{out}");
    eventually("the survivors drop the candidate", || {
        replicas.iter().all(|r| serving(r) == (Some(1), false)).then_some(())
    });
    for t in traffic {
        t.assert_clean(&[1]);
    }
    assert_eq!(desired(&etcd), Some(1));
    // Restarted, it serves what the fleet committed.
    let back = replica(&etcd, &repos[2], "r3");
    back.wait_ready();
    assert_eq!(serving(&back).0, Some(1));
}

#[test]
fn a_rollout_whose_fleet_process_is_killed_is_finished_by_a_replica() {
    let etcd = Etcd::start();
    let repos: Vec<TestRepo> = (0..2).map(|_| slow_repo(&[1])).collect();
    let (replicas, traffic) = fleet_of(&etcd, &repos);
    let mut rollout = Reaper(Some(fleet_child(&etcd, &["rollout", "s", "--version", "2"])));
    eventually("the replicas to be preparing version 2", || {
        record(&etcd).filter(|r| r["phase"] == "preparing").map(drop)
    });
    let mut child = rollout.0.take().expect("running");
    child.kill().expect("SIGKILL to baton fleet rollout");
    child.wait().expect("reaping it");
    assert_eq!(record(&etcd).expect("the record")["phase"], "preparing", "killed before it committed");
    eventually("a replica to finish the rollout", || record(&etcd).filter(|r| r["phase"] == "promoted").map(drop));
    eventually("both serve 2", || replicas.iter().all(|r| serving(r) == (Some(2), false)).then_some(()));
    for t in traffic {
        t.assert_clean(&[1, 2]);
    }
    assert_eq!(desired(&etcd), Some(2));
}

#[test]
fn etcd_restarted_while_a_step_is_committed_leaves_every_replica_on_one_version() {
    let mut etcd = Etcd::start();
    let repos = quick_repos(2);
    let (replicas, traffic) = fleet_of(&etcd, &repos);
    let guards = ["--min-samples", "1", "--max-error-rate-increase", "0.5"];
    let mut args = vec!["rollout", "s", "--version", "2", "--steps", "50,100", "--interval", "3s"];
    args.extend_from_slice(&guards);
    let _rollout = Reaper(Some(fleet_child(&etcd, &args)));
    eventually("the first step to be committed", || record(&etcd).filter(|r| r["phase"] == "committed").map(drop));
    etcd.kill();
    std::thread::sleep(Duration::from_secs(1));
    etcd.restart();
    eventually("the rollout to end", || {
        record(&etcd).filter(|r| r["phase"] != "committed" && r["phase"] != "preparing").map(drop)
    });
    let done = record(&etcd).expect("a record");
    let version = desired(&etcd).expect("a committed version");
    assert_eq!(version, if done["phase"] == "promoted" { 2 } else { 1 }, "{done}");
    eventually("every replica serves the committed version", || {
        replicas.iter().all(|r| serving(r) == (Some(version), false)).then_some(())
    });
    for t in traffic {
        t.assert_clean(&[1, 2]);
    }
}

#[test]
fn a_replica_upgraded_while_it_coordinates_a_gray_step_stays_in_the_fleet_and_the_rollout_promotes() {
    let etcd = Etcd::start();
    let repos = quick_repos(2);
    let (replicas, traffic) = fleet_of(&etcd, &repos);
    let guards = ["--min-samples", "1", "--max-error-rate-increase", "0.5"];
    let mut args = vec!["rollout", "s", "--version", "2", "--steps", "50,100", "--interval", "6s", "--detach"];
    args.extend_from_slice(&guards);
    let detached = fleet_child(&etcd, &args).wait_with_output().expect("baton fleet rollout --detach");
    assert!(detached.status.success(), "{}", common::text(&detached.stderr));
    eventually("the first step to be committed", || record(&etcd).filter(|r| r["phase"] == "committed").map(drop));
    // The replica that coordinates is the one upgraded.
    let coordinator_key = "/baton/ff/coordinator/s";
    let held = eventually("a replica to coordinate", || etcd.get_kv(coordinator_key));
    let holder = read(&etcd, "coordinator/s").and_then(|v| v.as_str().map(str::to_owned)).expect("the holder's id");
    let upgraded: usize = holder.trim_start_matches('r').parse::<usize>().expect("r1 or r2") - 1;
    let registration = format!("/baton/ff/replicas/{holder}");
    let lease_before = etcd.get_kv(&registration).expect("the holder's registration")["lease"].clone();

    // The registration is looked at all through the handover.
    let stop = AtomicBool::new(false);
    let _new = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let (mut looks, mut missing) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                looks += 1;
                missing += u64::from(etcd.get_kv(&registration).is_none());
                std::thread::sleep(Duration::from_millis(10));
            }
            (looks, missing)
        });
        // Stops the watcher however this closure ends.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let stopping = Stop(&stop);
        let server = &replicas[upgraded];
        let answer = common::upgrade::upgrade(server.base(), b"{}");
        assert_eq!(answer.status, 200, "{}", common::text(&answer.body));
        let new = common::upgrade::Adopted(answer.json()["new_pid"].as_u64().expect("the new pid") as u32);
        eventually("the old process to exit", || common::upgrade::gone(server.pid()).then_some(()));
        drop(stopping);
        let (looks, missing) = watcher.join().expect("the watcher");
        assert_eq!(missing, 0, "the registration of {holder} was missing {missing} of {looks} times");
        new
    });
    assert_eq!(etcd.get_kv(&registration).expect("the registration")["lease"], lease_before, "the same lease");
    let still = etcd.get_kv(coordinator_key).expect("the coordinator key");
    assert_eq!(still["create_revision"], held["create_revision"], "the same tenure: {still} after {held}");

    eventually("the rollout to end", || {
        record(&etcd).filter(|r| r["phase"] != "committed" && r["phase"] != "preparing")
    });
    let done = record(&etcd).expect("a record");
    assert_eq!(done["phase"], "promoted", "{done}");
    assert_eq!(desired(&etcd), Some(2));
    eventually("both serve 2", || replicas.iter().all(|r| serving(r) == (Some(2), false)).then_some(()));
    for t in traffic {
        t.assert_clean(&[1, 2]);
    }
}

#[test]
fn a_failed_upgrade_of_a_replica_leaves_its_lease_and_registration_alone() {
    let etcd = Etcd::start();
    // The new process takes seconds to warm the model up: the old one
    // gives up first and stops it, while it takes part in the fleet.
    let repos = [slow_repo(&[1])];
    let (replicas, traffic) = fleet_of(&etcd, &repos);
    let registration = "/baton/ff/replicas/r1";
    let before = etcd.get_kv(registration).expect("the registration");
    let refused = common::upgrade::upgrade(replicas[0].base(), br#"{"timeout_s": 1}"#);
    assert_eq!(refused.status, 422, "{}", common::text(&refused.body));
    assert!(refused.error().contains("not ready within"), "{}", refused.error());
    assert!(common::children_of(replicas[0].pid(), "serve").is_empty(), "the new process was not stopped");
    let after = etcd.get_kv(registration).expect("the registration after the failed upgrade");
    assert_eq!(after["lease"], before["lease"], "the new process took the replica's lease with it");
    let metrics = String::from_utf8(replicas[0].get("/metrics").body).expect("UTF-8 metrics");
    assert_eq!(baton_testkit::server::metric(&metrics, "baton_cluster_leases_lost_total"), Some(0.0), "{metrics}");
    for t in traffic {
        t.assert_clean(&[1]);
    }
}

#[test]
fn an_upgraded_coordinator_and_its_successor_never_both_judge_a_window() {
    let etcd = Etcd::start();
    // A model that takes seconds to warm up: the new process of the
    // upgrade loads for several windows while the old one coordinates.
    let repos: Vec<TestRepo> = (0..2).map(|_| slow_repo(&[1])).collect();
    let (replicas, traffic) = fleet_of(&etcd, &repos);
    // Every judgement is inconclusive (no window has a billion samples), so
    // the step holds and each window's judgement is written as a decision.
    let interval_ms = 500;
    let args = [
        "rollout",
        "s",
        "--version",
        "2",
        "--steps",
        "50,100",
        "--interval",
        "500ms",
        "--min-samples",
        "1000000000",
        "--max-inconclusive",
        "100000",
        "--detach",
    ];
    let detached = fleet_child(&etcd, &args).wait_with_output().expect("baton fleet rollout --detach");
    assert!(detached.status.success(), "{}", common::text(&detached.stderr));
    eventually("the first step to be committed", || record(&etcd).filter(|r| r["phase"] == "committed").map(drop));
    let coordinator_key = "/baton/ff/coordinator/s";
    let held = eventually("a replica to coordinate", || etcd.get_kv(coordinator_key));
    let holder = read(&etcd, "coordinator/s").and_then(|v| v.as_str().map(str::to_owned)).expect("the holder's id");
    let upgraded = &replicas[holder.trim_start_matches('r').parse::<usize>().expect("r1 or r2") - 1];
    let judged = |record: &Value| -> Vec<u64> {
        let decisions = record["decisions"].as_array().cloned().unwrap_or_default();
        decisions.iter().filter(|d| d["action"] == "held").filter_map(|d| d["at_ms"].as_u64()).collect()
    };
    eventually("a first judgement", || record(&etcd).filter(|r| !judged(r).is_empty()).map(drop));

    let answer = common::upgrade::upgrade(upgraded.base(), b"{}");
    assert_eq!(answer.status, 200, "{}", common::text(&answer.body));
    let _new = common::upgrade::Adopted(answer.json()["new_pid"].as_u64().expect("the new pid") as u32);
    eventually("the old process to exit", || common::upgrade::gone(upgraded.pid()).then_some(()));
    let at_exit = judged(&record(&etcd).expect("the record")).len();
    eventually("three judgements after the old process exited", || {
        record(&etcd).filter(|r| judged(r).len() >= at_exit + 3).map(drop)
    });
    let done = record(&etcd).expect("the record");
    let mut times = judged(&done);
    times.sort_unstable();
    let gaps: Vec<u64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    // One coordinator judges a window every interval on its own clock; two
    // at once judge at interleaved instants, some closer than half of it.
    assert!(
        gaps.iter().all(|gap| *gap * 10 >= interval_ms * 8),
        "two judgements closer than the interval ({interval_ms} ms): gaps {gaps:?}"
    );
    let still = etcd.get_kv(coordinator_key).expect("the coordinator key");
    assert_eq!(still["create_revision"], held["create_revision"], "the same tenure: {still} after {held}");
    assert_ne!(still["mod_revision"], held["mod_revision"], "the new process took the key over: {still}");
    assert_eq!(done["phase"], "committed", "{done}");
    for t in traffic {
        t.assert_clean(&[1, 2]);
    }
}

#[test]
fn a_fleet_rollout_whose_etcd_member_hangs_is_coordinated_to_its_end_through_another() {
    let mut cluster = EtcdCluster::start(3);
    let endpoints = cluster.endpoints();
    let repo = slow_repo(&[1]);
    // The replica leaves the coordination to the CLI.
    let args = ["--cluster", &endpoints, "--cluster-name", "ff", "--replica-id", "r1", "--lease-ttl", "3"];
    let replica = common::start(&repo, &[&args[..], &["--no-coordinate"]].concat());
    replica.wait_ready();
    repo.publish_mlp("s", 2, &slow_mlp(2));
    let child = Command::new(bin())
        .args(["fleet", "--cluster", &endpoints, "--cluster-name", "ff"])
        .args(["rollout", "s", "--version", "2", "--prepare-timeout", "120s"])
        .env("BATON_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting baton fleet");
    let mut rollout = Reaper(Some(child));
    let running = rollout.0.as_mut().expect("running");
    let printed: Arc<Mutex<Vec<String>>> = Arc::default();
    let reader = {
        let (stdout, printed) = (running.stdout.take().expect("piped"), Arc::clone(&printed));
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                printed.lock().unwrap().push(line);
            }
        })
    };
    let mut stderr = running.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    // The member it coordinates through hangs while the replica prepares
    // (as a follower: a hung leader of the etcd the tests use revokes every
    // lease when it resumes, docs/fleet.md).
    let member = eventually("the CLI names the member it coordinates through", || {
        printed.lock().unwrap().iter().find_map(|l| l.split("through etcd member ").nth(1).map(str::to_owned))
    });
    let hung = cluster.index_of(member.trim_end_matches('.')).expect("one of the members");
    if cluster.leader() == hung {
        cluster.move_leader((hung + 1) % cluster.len());
    }
    cluster.pause(hung);
    let status = eventually("the rollout to end", || rollout.0.as_mut().expect("running").try_wait().unwrap());
    cluster.resume(hung);
    reader.join().unwrap();
    let out = format!("{}\n{}", printed.lock().unwrap().join("\n"), errors.join().unwrap());
    assert!(status.success(), "the rollout did not go on through another member: {out}");
    assert!(out.contains("coordinating on through another"), "{out}");
    let other = cluster.member((hung + 1) % cluster.len());
    let desired: Value = serde_json::from_slice(&other.get("/baton/ff/desired/s").expect("committed")).unwrap();
    assert_eq!(desired["version"], 2, "{desired}");
    eventually("the replica serves 2", || (serving(&replica) == (Some(2), false)).then_some(()));
}
