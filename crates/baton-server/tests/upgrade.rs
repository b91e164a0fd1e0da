//! `POST /baton/v1/upgrade` through the real binary, under traffic: the
//! server starts a new process of itself, hands it its listening sockets,
//! and once the new one serves it drains and exits; clients on keep-alive
//! connections and on fresh ones see no failed request, through two
//! upgrades in a row, and through one SIGUSR2 starts. A new binary that
//! exits at start, or a new process that cannot load what serves, changes
//! nothing: the upgrade says why, the new process is stopped and the old
//! one serves on. A rollout in progress goes on in the new process at its
//! step.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use baton_testkit::onnx::sample_input;
use baton_testkit::server::Client;
use common::upgrade::{Adopted, Installed, gone, upgrade};
use common::{SIZES, repo_with, request, start};

/// Requests to model `m` in a loop until stopped: over one keep-alive
/// client, or a new client (a new connection) each time.
struct Traffic {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<(u64, Vec<String>)>>,
}

impl Traffic {
    fn start(base: &str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [true, false]
            .into_iter()
            .map(|keep_alive| {
                let (stop, base) = (Arc::clone(&stop), base.to_owned());
                std::thread::spawn(move || {
                    let body = request(&sample_input(SIZES[0], 1, 3), 1).to_string();
                    let headers = [("content-type", "application/json")];
                    let shared = Client::new(&base);
                    let (mut answered, mut failed) = (0, Vec::new());
                    while !stop.load(Ordering::SeqCst) {
                        let client = if keep_alive { shared.clone() } else { Client::new(&base) };
                        match client.try_post_raw("/v2/models/m/infer", body.as_bytes(), &headers) {
                            Ok(answer) if answer.status == 200 => answered += 1,
                            Ok(answer) => failed.push(format!("{}: {}", answer.status, common::text(&answer.body))),
                            Err(error) => failed.push(error),
                        }
                    }
                    (answered, failed)
                })
            })
            .collect();
        Traffic { stop, threads }
    }

    /// Stops, and asserts that some requests were answered and none failed.
    fn assert_clean(self) {
        let (answered, failed) = self.stop();
        assert!(failed.is_empty(), "{failed:?}");
        assert!(answered > 0);
    }

    /// Stops, and returns the requests answered and the failures.
    fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = (0, Vec::new());
        for thread in self.threads {
            let (answered, failed) = thread.join().unwrap();
            all.0 += answered;
            all.1.extend(failed);
        }
        all
    }
}

#[test]
fn two_upgrades_in_a_row_under_traffic_fail_no_request_and_each_old_process_exits() {
    let repo = repo_with("m", &[1], "");
    let mut server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let traffic = Traffic::start(server.base());
    let first = upgrade(server.base(), b"{}");
    assert_eq!(first.status, 200, "{}", common::text(&first.body));
    let (old, new) = (first.json()["old_pid"].as_u64().unwrap() as u32, first.json()["new_pid"].as_u64().unwrap());
    let new = Adopted(new as u32);
    assert_eq!(old, server.pid());
    assert_ne!(new.0, old);
    server.wait_exit();
    // The new process serves on the same address, and hands over in turn.
    let second = upgrade(server.base(), b"{}");
    assert_eq!(second.status, 200, "{}", common::text(&second.body));
    assert_eq!(second.json()["old_pid"].as_u64(), Some(u64::from(new.0)));
    let newest = Adopted(second.json()["new_pid"].as_u64().unwrap() as u32);
    baton_testkit::server::eventually("the first new process to exit", || gone(new.0).then_some(()));
    // Some requests go to the newest alone.
    let before = Instant::now();
    while before.elapsed() < Duration::from_millis(300) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (answered, failed) = traffic.stop();
    assert!(
        failed.is_empty(),
        "{} failed of {}: {:?}",
        failed.len(),
        answered + failed.len() as u64,
        &failed[..failed.len().min(5)]
    );
    assert!(answered > 100, "{answered} requests answered");
    assert!(!gone(newest.0), "the newest process serves");
    eprintln!("{answered} requests answered through two upgrades, none failed");
}

#[test]
fn an_upgrade_to_a_binary_that_exits_at_start_changes_nothing() {
    let repo = repo_with("m", &[1], "");
    let installed = Installed::new();
    let server = installed.start(&repo, &[]);
    server.wait_serving("m", 1);
    let traffic = Traffic::start(server.base());
    installed.replace_with_script("exit 1");
    let refused = upgrade(server.base(), b"{}");
    assert_eq!(refused.status, 422, "{}", common::text(&refused.body));
    assert_eq!(refused.json()["kind"], "upgrade_failed");
    assert!(refused.error().contains("exited before it was ready"), "{}", refused.error());
    traffic.assert_clean();
    assert!(!gone(server.pid()), "the old process serves on");
    assert_eq!(common::infer(&server, "m", &sample_input(SIZES[0], 1, 1), 1).0, 1);
}

#[test]
fn sigusr2_upgrades_as_the_api_does() {
    let repo = repo_with("m", &[1], "");
    let mut server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let old = server.pid();
    let traffic = Traffic::start(server.base());
    server.signal("USR2");
    server.wait_exit();
    let status = Client::new(server.base()).get("/baton/v1/status").json();
    let new = Adopted(status["pid"].as_u64().expect("the server's pid in its status") as u32);
    assert_ne!(new.0, old);
    assert_eq!(status["ready"], true, "{status}");
    traffic.assert_clean();
}

#[test]
fn an_upgrade_whose_new_process_cannot_load_what_serves_changes_nothing() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    // The old process verified version 1 when it loaded it; the new one
    // reads the files again, and finds them damaged.
    repo.damage("m", 1, baton_testkit::repo::Damage::FlipByte);
    let traffic = Traffic::start(server.base());
    let refused = upgrade(server.base(), b"{}");
    assert_eq!(refused.status, 422, "{}", common::text(&refused.body));
    assert!(refused.error().contains("a load failed") && refused.error().contains("model m"), "{}", refused.error());
    traffic.assert_clean();
    assert!(common::children_of(server.pid(), "serve").is_empty(), "the new process was not stopped");
    assert_eq!(common::infer(&server, "m", &sample_input(SIZES[0], 1, 2), 1).0, 1);
}

#[test]
fn an_upgrade_during_a_rollout_carries_it_over_at_its_step() {
    let repo = repo_with("m", &[1], "[rollout]\nauto = true\nsteps = [10, 50, 100]\ninterval_ms = 600000");
    let mut server = start(&repo, &[]);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &common::mlp(2));
    baton_testkit::server::eventually("a running rollout of version 2", || {
        let rollout = server.status("m")["rollout"].clone();
        (rollout["phase"] == "running" && rollout["candidate"] == 2).then_some(())
    });
    let traffic = Traffic::start(server.base());
    let answer = upgrade(server.base(), b"{}");
    assert_eq!(answer.status, 200, "{}", common::text(&answer.body));
    let _new = Adopted(answer.json()["new_pid"].as_u64().unwrap() as u32);
    server.wait_exit();
    let status = Client::new(server.base()).get("/baton/v1/models/m/status").json();
    let rollout = &status["rollout"];
    assert_eq!((rollout["phase"].as_str(), rollout["stable"].as_u64()), (Some("running"), Some(1)), "{status}");
    assert_eq!((rollout["candidate"].as_u64(), rollout["step"].as_u64()), (Some(2), Some(0)), "{status}");
    assert_eq!(rollout["weight_percent"], 10.0, "{status}");
    traffic.assert_clean();
}

#[test]
fn the_new_process_keeps_the_versions_the_old_one_kept_for_rollback() {
    let repo = repo_with("m", &[1], "");
    let mut server = start(&repo, &[]);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &common::mlp(2));
    server.wait_settled("m", 2);
    assert_eq!(server.status("m")["previous"], serde_json::json!([1]), "the old process keeps 1");
    let answer = upgrade(server.base(), b"{}");
    assert_eq!(answer.status, 200, "{}", common::text(&answer.body));
    let _new = Adopted(answer.json()["new_pid"].as_u64().unwrap() as u32);
    server.wait_exit();
    let status = Client::new(server.base()).get("/baton/v1/models/m/status").json();
    assert_eq!((status["serving"].as_u64(), status["previous"].clone()), (Some(2), serde_json::json!([1])), "{status}");
    // A rollback right after the upgrade goes back to it, without a load.
    let rolled = Client::new(server.base()).post_json("/baton/v1/models/m/rollback", &serde_json::json!({}));
    assert_eq!(rolled.status, 200, "{}", common::text(&rolled.body));
    assert_eq!(common::infer(&server, "m", &sample_input(SIZES[0], 1, 4), 1).0, 1);
}

#[test]
fn a_cold_upgrade_loads_only_once_the_old_process_has_exited_and_fails_no_request() {
    let repo = repo_with("m", &[1], "");
    let mut server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let traffic = Traffic::start(server.base());
    let answer = upgrade(server.base(), br#"{"cold": true}"#);
    assert_eq!(answer.status, 200, "{}", common::text(&answer.body));
    assert_eq!(answer.json()["cold"], true);
    let new = Adopted(answer.json()["new_pid"].as_u64().unwrap() as u32);
    server.wait_exit();
    baton_testkit::server::eventually("the new process to serve", || {
        let status = Client::new(server.base()).try_get("/baton/v1/status").ok()?.json();
        (status["pid"] == new.0 && status["ready"] == true).then_some(())
    });
    traffic.assert_clean();
    // In the log both processes share: the old one stopped before the new
    // one loaded anything.
    let log = server.log();
    let waiting = log.find("Waiting for the server this one replaces to exit").expect("the new process waited");
    let after = &log[waiting..];
    let (stopped, loaded) = (after.find("baton stopped."), after.find("Model operation finished"));
    assert!(stopped.is_some() && loaded.is_some() && stopped < loaded, "{after}");
}

#[test]
fn model_operations_wait_while_an_upgrade_runs_and_go_on_once_it_failed() {
    let repo = repo_with("m", &[1], "");
    let installed = Installed::new();
    let server = installed.start(&repo, &[]);
    server.wait_serving("m", 1);
    // A "binary" that fails once the test lets it.
    let go = installed.dir().join("go");
    installed.replace_with_script(&format!("while [ ! -e '{}' ]; do sleep 0.05; done\nexit 3", go.display()));
    let rollback = || Client::new(server.base()).post_json("/baton/v1/models/m/rollback", &serde_json::json!({}));
    assert_eq!(rollback().json()["kind"], "no_previous_version");
    let base = server.base().to_owned();
    let upgrading = std::thread::spawn(move || upgrade(&base, b"{}"));
    let held = baton_testkit::server::eventually("a model operation held by the upgrade", || {
        let answer = rollback();
        (answer.json()["kind"] == "upgrade_in_progress").then_some(answer)
    });
    assert_eq!(held.status, 409, "{}", common::text(&held.body));
    std::fs::write(&go, "").expect("letting the new process fail");
    let failed = upgrading.join().expect("the upgrade's thread");
    assert_eq!(failed.status, 422, "{}", common::text(&failed.body));
    assert!(failed.error().contains("exit status: 3"), "{}", failed.error());
    assert_eq!(rollback().json()["kind"], "no_previous_version", "released once the upgrade failed");
}
