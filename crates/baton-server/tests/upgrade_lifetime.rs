//! The upgrade's life from the request to its end, whatever the client
//! does: a client that hangs up neither cancels the upgrade nor leaves the
//! server held (model operations refused, rollouts frozen) once it failed,
//! and a successful one still ends the old process. A cold upgrade
//! answers only once the new process has checked what a start checks (its
//! flags, the state file, the token file), so a new process that refuses
//! them leaves the old one serving. A warm upgrade that gives up stops its
//! new process with SIGTERM, which it obeys at once, whether it is still
//! loading what serves or already loading the versions kept for rollback.
//! An operator's operation already running when an upgrade starts ends
//! before the new process reads what should serve.

mod common;

use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::{Client, Server, eventually};
use common::upgrade::{Adopted, Installed, gone, stamped, upgrade, upgrade_then_hang_up};
use common::{SIZES, repo_with};

/// A warmup that takes seconds with the large MLP, and a moment with a
/// small one of the same signature.
const SLOW_WARMUP: &str = "[warmup]\nbatch_sizes = [2048, 4096, 4096, 8192]\nmax_latency_ms = 60000\n";

/// Model `s`: version 1 slow to warm up, version 2 quick, both with 64
/// inputs and 2 outputs.
fn slow_then_quick() -> TestRepo {
    let repo = TestRepo::new();
    let slow = Mlp::new(&[64, 1024, 1024, 2], 2001);
    repo.add_model("s", &mlp_toml(&slow, SLOW_WARMUP));
    repo.publish_mlp("s", 1, &slow);
    repo
}

fn quick() -> Mlp {
    Mlp::new(&[64, 16, 2], 2002)
}

/// The version of `s` that answers a request to `server`.
fn answering(server: &Server) -> u64 {
    common::infer(server, "s", &[0.5; 64], 1).0
}

/// A rollout that judges a window every 300 ms and, with no traffic,
/// finds each inconclusive: its count of inconclusive windows moves while
/// rollouts are judged, and stands still while they are held.
const ROLLOUT: &str = "[rollout]\nauto = true\nsteps = [10, 50, 100]\ninterval_ms = 300\nmax_inconclusive = 100000";

fn inconclusive(server: &baton_testkit::server::Server) -> Option<u64> {
    server.status("m")["rollout"]["inconclusive"].as_u64()
}

#[test]
fn a_client_that_hangs_up_on_a_failing_upgrade_leaves_nothing_held() {
    let repo = repo_with("m", &[1], ROLLOUT);
    let installed = Installed::new();
    let server = installed.start(&repo, &[]);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &common::mlp(2));
    eventually("rollout windows being judged", || (inconclusive(&server)? > 0).then_some(()));
    // The "new binary" says it started, then fails when the test says so.
    let (started, go) = (installed.dir().join("started"), installed.dir().join("go"));
    installed.replace_with_script(&format!(
        "touch '{}'\nwhile [ ! -e '{}' ]; do sleep 0.05; done\nexit 3",
        started.display(),
        go.display()
    ));
    let rollback = || Client::new(server.base()).post_json("/baton/v1/models/m/rollback", &serde_json::json!({}));
    let connection = upgrade_then_hang_up(server.base(), b"{}");
    eventually("the new process to start", || started.exists().then_some(()));
    assert_eq!(rollback().json()["kind"], "upgrade_in_progress", "model operations are held meanwhile");
    drop(connection);
    std::fs::write(&go, "").expect("letting the new process fail");
    eventually("model operations to be accepted again once the upgrade failed", || {
        (rollback().json()["kind"] != "upgrade_in_progress").then_some(())
    });
    let before = inconclusive(&server).expect("a running rollout");
    eventually("rollout windows to be judged again", || (inconclusive(&server)? > before).then_some(()));
    assert!(server.log().contains("The upgrade did not happen"), "the failure is in the log");
    assert!(!gone(server.pid()), "the old process serves on");
}

#[test]
fn a_client_that_hangs_up_on_a_successful_upgrade_still_ends_the_old_process() {
    let repo = repo_with("m", &[1], "");
    let installed = Installed::new();
    let mut server = installed.start(&repo, &[]);
    server.wait_serving("m", 1);
    let old = server.pid();
    installed.replace(&stamped("after-hangup"));
    let connection = upgrade_then_hang_up(server.base(), b"{}");
    let new = eventually("the new process to start", || common::children_of(old, "serve").first().copied());
    let _new = Adopted(new);
    drop(connection);
    server.wait_exit();
    let status = Client::new(server.base()).get("/baton/v1/status").json();
    assert_eq!(status["pid"], new, "the new process serves: {status}");
    assert!(status["version"].as_str().is_some_and(|v| v.ends_with("+after-hangup")), "{status}");
    assert_eq!(common::infer(&server, "m", &sample_input(SIZES[0], 1, 1), 1).0, 1);
}

#[test]
fn a_cold_upgrade_whose_new_process_refuses_its_start_leaves_the_old_one_serving() {
    let token_dir = tempfile::tempdir().expect("a temp dir");
    let token = token_dir.path().join("token");
    let state_dir = tempfile::tempdir().expect("a temp dir");
    let state = state_dir.path().join("state.json");
    let state_arg = state_dir.path().to_str().expect("UTF-8").to_owned();
    let token_arg = token.to_str().expect("UTF-8").to_owned();
    // Each case breaks, after the old process started, something a start
    // checks: the new binary's flags, the state file, the token file.
    type Break<'a> = Box<dyn Fn(&Installed) + 'a>;
    let cases: [(&str, Vec<&str>, Break, &str); 3] = [
        (
            "flags",
            vec![],
            Box::new(|i: &Installed| {
                i.replace_with_script("echo \"error: unexpected argument '--poll-ms' found\" >&2\nexit 2")
            }),
            "exit status: 2",
        ),
        (
            "state file",
            vec!["--state-dir", &state_arg],
            Box::new(|_: &Installed| std::fs::write(&state, "{ not json").expect("damaging the state file")),
            "state file",
        ),
        (
            "token file",
            vec!["--admin-token-file", &token_arg],
            Box::new(|_: &Installed| std::fs::write(&token, "\n").expect("emptying the token file")),
            "is empty",
        ),
    ];
    for (what, args, damage, needle) in cases {
        std::fs::write(&token, "cold-token\n").expect("the token file");
        let _ = std::fs::remove_file(&state);
        let repo = repo_with("m", &[1], "");
        let installed = Installed::new();
        let server = installed.start(&repo, &args);
        server.wait_serving("m", 1);
        damage(&installed);
        let client = Client::new(server.base());
        let refused = client.post_raw(
            "/baton/v1/upgrade",
            br#"{"cold": true}"#,
            &[("content-type", "application/json"), ("authorization", "Bearer cold-token")],
        );
        assert_eq!(refused.status, 422, "{what}: {}", common::text(&refused.body));
        assert_eq!(refused.json()["kind"], "upgrade_failed", "{what}");
        assert!(refused.error().contains(needle), "{what}: the reason should say {needle:?}: {}", refused.error());
        assert_eq!(server.get("/v2/health/ready").status, 200, "{what}: the old process serves on, ready");
        assert_eq!(common::infer(&server, "m", &sample_input(SIZES[0], 1, 3), 1).0, 1, "{what}");
        assert!(!gone(server.pid()), "{what}: the old process serves on");
        assert!(common::children_of(server.pid(), "serve").is_empty(), "{what}: the new process was not stopped");
    }
}

#[test]
fn a_warm_upgrade_that_gives_up_stops_its_new_process_with_sigterm_which_it_obeys() {
    // A model whose warmup takes seconds: the new process is not ready
    // within the upgrade's one second.
    let repo = baton_testkit::repo::TestRepo::new();
    let slow = baton_testkit::onnx::Mlp::new(&[64, 1024, 1024, 2], 2001);
    let toml = "[warmup]\nbatch_sizes = [2048, 4096, 4096, 8192]\nmax_latency_ms = 60000\n";
    repo.add_model("s", &baton_testkit::repo::mlp_toml(&slow, toml));
    repo.publish_mlp("s", 1, &slow);
    let server = common::start(&repo, &[]);
    server.wait_serving("s", 1);
    let began = std::time::Instant::now();
    let refused = upgrade(server.base(), br#"{"timeout_s": 1}"#);
    let took = began.elapsed();
    eprintln!("a warm upgrade with a timeout of 1 s was answered in {took:?}");
    // 1 s, then the new process's exit on SIGTERM: far less than the 5 s
    // grace before SIGKILL, which the reason would name.
    assert!(took < std::time::Duration::from_secs(8), "answered in {took:?}");
    assert_eq!(refused.status, 422, "{}", common::text(&refused.body));
    let reason = refused.error();
    assert!(reason.contains("not ready within"), "{reason}");
    assert!(reason.contains("exited on SIGTERM (exit status: 0)"), "the new process obeyed SIGTERM: {reason}");
    assert!(!reason.contains("SIGKILL"), "{reason}");
    assert!(common::children_of(server.pid(), "serve").is_empty(), "the new process was not stopped");
    let log = server.log();
    assert!(log.contains("Stopped before it was ready"), "the new process said why it stopped:\n{log}");
    assert_eq!(server.get("/v2/health/ready").status, 200, "the old process serves on, ready");
}

#[test]
fn a_warm_upgrade_that_gives_up_while_the_new_process_keeps_a_version_stops_it_with_sigterm() {
    // Version 2 serves and version 1 is kept for rollback, both loaded
    // with the default warmup, quick. Then the warmup grows to large
    // batches, which take version 1 (a large MLP) far longer than the
    // grace before SIGKILL, and version 2 (a small one) a moment: the new
    // process is ready in a moment, then spends that long loading version
    // 1 to keep it, and the upgrade's 3 s run out there.
    let repo = TestRepo::new();
    let slow = Mlp::new(&[64, 4096, 4096, 2], 2001);
    repo.add_model("s", &mlp_toml(&slow, ""));
    repo.publish_mlp("s", 1, &slow);
    let server = common::start(&repo, &["--no-watch"]);
    server.wait_settled("s", 1);
    repo.publish_mlp("s", 2, &quick());
    let loaded = server.post_json("/baton/v1/models/s/load", &serde_json::json!({}));
    assert_eq!(loaded.status, 200, "{}", common::text(&loaded.body));
    server.wait_settled("s", 2);
    assert_eq!(server.status("s")["previous"], serde_json::json!([1]), "version 1 is kept");
    let long = "[warmup]\nbatch_sizes = [1024, 1024, 1024, 1024]\nmax_latency_ms = 600000\n";
    repo.add_model("s", &mlp_toml(&slow, long));

    let began = std::time::Instant::now();
    let refused = upgrade(server.base(), br#"{"timeout_s": 3}"#);
    let took = began.elapsed();
    assert_eq!(refused.status, 422, "{}", common::text(&refused.body));
    let reason = refused.error();
    assert!(reason.contains("not ready within"), "{reason}");
    assert!(reason.contains("exited on SIGTERM (exit status: 0)"), "the new process obeyed SIGTERM: {reason}");
    assert!(!reason.contains("SIGKILL"), "{reason}");
    // 3 s, then the exit on SIGTERM: well within the 5 s grace.
    assert!(took < std::time::Duration::from_secs(8), "answered in {took:?}");
    assert!(common::children_of(server.pid(), "serve").is_empty(), "the new process was not stopped");
    assert!(server.log().contains("Stopped before it was ready"), "the new process said why it stopped");
    assert_eq!(server.get("/v2/health/ready").status, 200, "the old process serves on, ready");
    assert_eq!(answering(&server), 2);
}

#[test]
fn an_operators_load_running_when_an_upgrade_starts_is_what_the_new_process_serves() {
    // Version 2 serves; an operator loads version 1, slow to warm up, and
    // the upgrade is asked for while that load runs.
    let repo = slow_then_quick();
    repo.publish_mlp("s", 2, &quick());
    let mut server = common::start(&repo, &[]);
    server.wait_settled("s", 2);
    let client = server.client();
    let load = std::thread::spawn(move || {
        client.post_raw("/baton/v1/models/s/load", br#"{"version": 1}"#, &[("content-type", "application/json")])
    });
    eventually("the operator's load to run", || (server.status("s")["busy"] == true).then_some(()));
    let answer = upgrade(server.base(), b"{}");
    assert_eq!(answer.status, 200, "{}", common::text(&answer.body));
    let _new = Adopted(answer.json()["new_pid"].as_u64().expect("the new pid") as u32);
    let loaded = load.join().expect("the load's thread");
    assert_eq!(loaded.status, 200, "the operator's load: {}", common::text(&loaded.body));
    server.wait_exit();
    let status = Client::new(server.base()).get("/baton/v1/models/s/status").json();
    assert_eq!(status["serving"], 1, "the new process serves what the operator was answered: {status}");
    assert_eq!(answering(&server), 1);
}

#[test]
fn a_sigusr2_upgrade_refused_at_once_says_so_in_the_log() {
    let repo = repo_with("m", &[1], "");
    let installed = Installed::new();
    let server = installed.start(&repo, &[]);
    server.wait_serving("m", 1);
    // An upgrade through the API runs (its "new binary" waits), so the one
    // SIGUSR2 asks for is refused before it starts anything.
    let (started, go) = (installed.dir().join("started"), installed.dir().join("go"));
    installed.replace_with_script(&format!(
        "touch '{}'\nwhile [ ! -e '{}' ]; do sleep 0.05; done\nexit 3",
        started.display(),
        go.display()
    ));
    let connection = upgrade_then_hang_up(server.base(), b"{}");
    eventually("the new process to start", || started.exists().then_some(()));
    server.signal("USR2");
    eventually("the refusal of the SIGUSR2 upgrade in the log", || {
        let log = server.log();
        log.lines().any(|l| l.contains("did not happen") && l.contains("an upgrade is already running")).then_some(())
    });
    std::fs::write(&go, "").expect("letting the new process fail");
    drop(connection);
    eventually("the API's upgrade to fail", || server.log().contains("exit status: 3").then_some(()));
    assert!(!gone(server.pid()), "the old process serves on");
}
