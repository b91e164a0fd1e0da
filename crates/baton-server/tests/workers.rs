//! A version in a worker process, through the real binary: a model whose
//! `[engine]` says `isolation = "process"` is served by a child process
//! (`baton worker`) with answers equal to the reference forward pass; a
//! new version starts a new worker and the old one exits once drained; a
//! worker killed with SIGKILL fails requests at once (503, never a hang)
//! while a model of the server's own keeps serving, and the version is
//! loaded again in a new worker, or the route rolls back to the kept
//! previous version when there is one; a worker's weights are
//! validated through the hop, and a NaN refuses the version at validate;
//! an unknown isolation is refused at load; a stopped worker is found by
//! a call's deadline, or idle by its heartbeat, and replaced; a worker's
//! resident memory counts against the memory budgets. The active version
//! keeps serving through every refusal.

mod common;

use std::time::{Duration, Instant};

use baton_testkit::onnx::sample_input;
use common::{SIZES, assert_close, infer, mlp, repo_with, start};

const IN_WORKER: &str = "[engine]\nisolation = \"process\"\nsessions = 1\n";
const LONG: Duration = Duration::from_secs(60);

/// The pids of `baton worker` processes whose parent is `server`.
fn workers_of(server: u32) -> Vec<u32> {
    common::children_of(server, "worker")
}

/// Waits until model `m`'s status records a failure, and returns it.
fn refusal(server: &baton_testkit::server::Server) -> serde_json::Value {
    let last_error = || common::server_status(server)["models"][0]["last_error"].clone();
    wait_until("a version was refused", || !last_error().is_null());
    last_error()
}

/// Waits, within a bound, until `done` holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_version_in_a_worker_answers_as_in_the_server_and_its_worker_exits_when_it_is_replaced() {
    let repo = repo_with("m", &[1], IN_WORKER);
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let first = workers_of(server.pid());
    assert_eq!(first.len(), 1, "one worker for version 1: {first:?}");
    for seed in 0..20 {
        let input = sample_input(SIZES[0], 2, seed);
        let (version, output) = infer(&server, "m", &input, 2);
        assert_eq!(version, 1);
        assert_close(&output, &mlp(1).forward(&input, 2), "version 1 in its worker");
    }
    repo.publish_mlp("m", 2, &mlp(2));
    server.wait_serving("m", 2);
    let input = sample_input(SIZES[0], 1, 7);
    let (version, output) = infer(&server, "m", &input, 1);
    assert_eq!(version, 2);
    assert_close(&output, &mlp(2).forward(&input, 1), "version 2 in its worker");
    // Version 1 is kept as previous by default: set it free by loading a
    // third, and its worker goes once it is no longer kept.
    repo.publish_mlp("m", 3, &mlp(3));
    server.wait_serving("m", 3);
    // Exited and reaped: no zombie is left behind either.
    wait_until("version 1's worker has exited and been reaped", || {
        !std::path::Path::new(&format!("/proc/{}", first[0])).exists()
    });
    assert_eq!(workers_of(server.pid()).len(), 2, "versions 2 and 3 each in a worker");
    // The unload check names the worker, what it held, and that it is gone.
    let unloads = || server.get("/baton/v1/unloads").json();
    wait_until("version 1's free is recorded", || unloads().to_string().contains("\"version\":1"));
    let all = unloads();
    let record = all.as_array().into_iter().flatten().find(|r| r["version"] == 1).expect("version 1's record");
    let worker = &record["worker"];
    assert_eq!((worker["pid"].as_u64(), worker["gone"].as_bool()), (Some(u64::from(first[0])), Some(true)), "{record}");
    assert!(worker["rss"].as_u64().is_some_and(|rss| rss > 1 << 20), "{record}");
}

/// Kills `pid` with SIGKILL.
fn kill(pid: u32) {
    assert!(std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
}

/// The `exited` events' actions in the server's metrics, for `model`.
fn exits(server: &baton_testkit::server::Server, model: &str) -> Vec<String> {
    let metrics = String::from_utf8_lossy(&server.get("/metrics").body).into_owned();
    metrics
        .lines()
        .filter(|l| l.starts_with("baton_worker_exits_total{") && l.contains(&format!("model=\"{model}\"")))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_killed_worker_with_no_version_kept_fails_fast_and_is_restarted_while_another_model_serves() {
    let toml = format!("{IN_WORKER}[policy]\nkeep_previous = 0\n");
    let repo = repo_with("m", &[1], &toml);
    repo.add_model("own", &baton_testkit::repo::mlp_toml(&mlp(1), ""));
    repo.publish_mlp("own", 1, &mlp(1));
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    server.wait_serving("own", 1);
    let first = workers_of(server.pid());
    assert_eq!(first.len(), 1);
    let input = sample_input(SIZES[0], 1, 3);
    assert_eq!(infer(&server, "m", &input, 1).0, 1);
    kill(first[0]);
    // Every request answers at once: 503 naming the worker until the
    // version is loaded again in a new worker, then version 1's answer.
    let deadline = Instant::now() + LONG;
    let (mut refused, mut own) = (0, 0);
    loop {
        assert!(Instant::now() < deadline, "the version was not restarted");
        let began = Instant::now();
        let answer = server.post_json("/v2/models/m/infer", &common::request(&input, 1));
        assert!(began.elapsed() < LONG / 4, "a request waited {:?}", began.elapsed());
        if answer.status == 200 {
            assert_close(&common::output_f32(&answer.json(), "output"), &mlp(1).forward(&input, 1), "restarted");
            break;
        }
        assert_eq!(answer.status, 503, "{}", String::from_utf8_lossy(&answer.body));
        assert!(answer.json()["kind"].as_str().is_some_and(|k| k.starts_with("worker_")), "{}", answer.error());
        refused += 1;
        // The server's own model answers meanwhile.
        assert_eq!(infer(&server, "own", &input, 1).0, 1);
        own += 1;
    }
    let now = workers_of(server.pid());
    assert!(now.len() == 1 && now[0] != first[0], "a new worker serves: {now:?} (was {first:?})");
    wait_until("the exit is counted", || exits(&server, "m").iter().any(|l| l.contains("action=\"restarting\"")));
    // The status names the new worker and counts the exit and the restart.
    let status = server.status("m");
    assert_eq!(status["workers"], serde_json::json!({"exits": 1, "restarts": 1}), "{status}");
    let worker = &status["live"][0]["worker"];
    assert_eq!(worker["pid"], now[0], "{status}");
    assert!(worker["rss"].as_u64().is_some_and(|rss| rss > 0) && worker["started_at"].as_u64() > Some(0), "{status}");
    assert_eq!(
        (status["live"][0]["update"].as_str(), status["live"][0]["update_reason"].as_str()),
        (Some("runtime"), Some("operator_choice"))
    );
    eprintln!("{refused} requests refused while the version restarted, {own} answered by the other model");
}

#[test]
fn a_killed_worker_of_the_stable_version_rolls_back_to_the_kept_one_by_one_store() {
    let repo = repo_with("m", &[1], IN_WORKER);
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    server.wait_serving("m", 2);
    let workers = workers_of(server.pid());
    assert_eq!(workers.len(), 2, "versions 1 and 2 each in a worker: {workers:?}");
    let live = common::server_status(&server)["models"][0]["live"].clone();
    let worker_of = |version: u64| {
        live.as_array().unwrap().iter().find(|l| l["version"] == version).and_then(|l| l["worker"]["pid"].as_u64())
    };
    let (one, two) = (worker_of(1).expect("version 1's worker in status"), worker_of(2).expect("version 2's"));
    assert!(workers.contains(&(one as u32)) && workers.contains(&(two as u32)), "{live}");
    kill(two as u32);
    server.wait_serving("m", 1);
    let input = sample_input(SIZES[0], 1, 9);
    let (version, output) = infer(&server, "m", &input, 1);
    assert_eq!(version, 1);
    assert_close(&output, &mlp(1).forward(&input, 1), "rolled back to version 1");
    assert_eq!(workers_of(server.pid()), vec![one as u32], "version 1's worker is the one left");
    wait_until("the exit is counted", || exits(&server, "m").iter().any(|l| l.contains("action=\"rolled_back\"")));
}

#[test]
fn an_unknown_isolation_is_refused_at_load_and_the_active_version_keeps_serving() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    repo.add_model("m", &baton_testkit::repo::mlp_toml(&mlp(1), "[engine]\nisolation = \"container\"\n"));
    repo.publish_mlp("m", 2, &mlp(2));
    let error = refusal(&server);
    assert_eq!(
        (error["reason"].as_str(), error["version"].as_u64()),
        (Some("invalid_engine_options"), Some(2)),
        "{error}"
    );
    assert!(error["message"].as_str().unwrap_or_default().contains("isolation"), "{error}");
    assert_eq!(infer(&server, "m", &sample_input(SIZES[0], 1, 1), 1).0, 1);
}

#[test]
fn a_worker_s_weights_are_validated_a_nan_is_refused_and_its_worker_does_not_stay() {
    let repo = repo_with("m", &[1], IN_WORKER);
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let serving = workers_of(server.pid());
    // The region the weights crossed for validation is gone on both sides
    // once the version serves: it is as large as the largest tensor.
    for pid in [server.pid(), serving[0]] {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        assert!(!maps.contains("baton-weights"), "process {pid} still maps the weights region");
    }
    let mut bad = mlp(2);
    bad.layers[0].weight[3] = f32::NAN;
    repo.publish_mlp("m", 2, &bad);
    let error = refusal(&server);
    assert_eq!((error["stage"].as_str(), error["version"].as_u64()), (Some("validate"), Some(2)), "{error}");
    assert!(error["message"].as_str().unwrap_or_default().to_lowercase().contains("nan"), "{error}");
    wait_until("only version 1's worker is left", || workers_of(server.pid()) == serving);
    let input = sample_input(SIZES[0], 1, 5);
    let (version, output) = infer(&server, "m", &input, 1);
    assert_eq!(version, 1);
    assert_close(&output, &mlp(1).forward(&input, 1), "version 1 after the refusal");
}

#[test]
fn no_worker_outlives_its_server_killed_with_sigkill() {
    let repo = repo_with("m", &[1], IN_WORKER);
    let mut server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let workers = workers_of(server.pid());
    assert_eq!(workers.len(), 1);
    assert!(std::process::Command::new("kill").args(["-KILL", &server.pid().to_string()]).status().unwrap().success());
    server.wait_exit();
    wait_until("the worker has ended with its server", || {
        // A zombie waiting for its new parent counts as ended.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", workers[0])).unwrap_or_default();
        stat.is_empty() || stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'))
    });
}

/// Whether process `pid` maps a file at `path`.
fn maps(pid: u32, path: &std::path::Path) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines().any(|line| line.ends_with(&path.display().to_string()))
}

/// The second ONNX Runtime, an older build than the server's, that
/// scripts/test.sh fetches.
fn second_runtime() -> std::path::PathBuf {
    let link = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.baton/lib/second/libonnxruntime.so");
    link.canonicalize().unwrap_or_else(|e| {
        panic!(
            "{}: {e}; fetch it with `ORT_VERSION=1.24.4 ORT_LIB_DIR=.baton/lib/second bash \
             scripts/fetch-onnxruntime.sh` (scripts/test.sh does)",
            link.display()
        )
    })
}

/// Two ONNX Runtime builds serve side by side: model `m` in the server's
/// process on the server's runtime, model `n` in a worker on the older
/// build its `[engine] runtime` names, chosen by that key alone.
#[test]
fn a_version_on_another_runtime_runs_in_a_worker_beside_the_server_s_own() {
    let repo = repo_with("m", &[1], "");
    let second = second_runtime();
    let engine = format!("[engine]\nruntime = \"{}\"\n", second.display());
    repo.add_model("n", &baton_testkit::repo::mlp_toml(&mlp(1), &engine));
    repo.publish_mlp("n", 1, &mlp(3));
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    server.wait_serving("n", 1);
    let worker = workers_of(server.pid());
    assert_eq!(worker.len(), 1);
    let own = baton_onnx::runtime_path().unwrap().canonicalize().unwrap();
    assert_ne!(own, second, "the two runtimes are two files");
    assert!(maps(worker[0], &second) && !maps(worker[0], &own), "the worker maps the runtime named in [engine] alone");
    assert!(maps(server.pid(), &own) && !maps(server.pid(), &second), "the server maps its own alone");
    let input = sample_input(SIZES[0], 1, 4);
    assert_close(&infer(&server, "m", &input, 1).1, &mlp(1).forward(&input, 1), "m on the server's runtime");
    assert_close(&infer(&server, "n", &input, 1).1, &mlp(3).forward(&input, 1), "n on the second runtime");
    let status = server.status("n");
    let live = &status["live"][0];
    assert_eq!((live["update"].as_str(), live["update_reason"].as_str()), (Some("runtime"), Some("runtime_library")));
}

#[test]
fn a_runtime_that_is_missing_refuses_the_version_at_load_with_its_reason() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let engine = "[engine]\nisolation = \"process\"\nruntime = \"/nonexistent/libonnxruntime.so\"\n";
    repo.add_model("m", &baton_testkit::repo::mlp_toml(&mlp(1), engine));
    repo.publish_mlp("m", 2, &mlp(2));
    let error = refusal(&server);
    assert_eq!((error["stage"].as_str(), error["reason"].as_str()), (Some("load"), Some("runtime_missing")), "{error}");
    assert!(error["message"].as_str().unwrap_or_default().contains("/nonexistent/libonnxruntime.so"), "{error}");
    wait_until("no worker is left", || workers_of(server.pid()).is_empty());
    assert_eq!(infer(&server, "m", &sample_input(SIZES[0], 1, 2), 1).0, 1);
}

/// Starts model `m` (version 1, `toml`) in a worker and stops the worker
/// with SIGSTOP: stopped, it answers nothing, as hung as it gets. Returns
/// the repository, the server and the stopped worker's pid (one, in a
/// vector to compare with [`workers_of`]).
fn serving_then_stopped(toml: &str) -> (baton_testkit::repo::TestRepo, baton_testkit::server::Server, Vec<u32>) {
    let repo = repo_with("m", &[1], toml);
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let first = workers_of(server.pid());
    assert_eq!(first.len(), 1);
    // The stop is asynchronous: this waits until every thread shows stopped.
    baton_testkit::signals::stop(first[0]);
    (repo, server, first)
}

#[test]
fn a_hung_worker_is_cut_off_at_its_deadline_killed_and_replaced() {
    // No heartbeat: the call's own deadline is what finds it here.
    let toml = format!("{IN_WORKER}worker_timeout_ms = 300\nworker_heartbeat_ms = 0\n[policy]\nkeep_previous = 0\n");
    let (_repo, server, first) = serving_then_stopped(&toml);
    let input = sample_input(SIZES[0], 1, 6);
    let answer = server.post_json("/v2/models/m/infer", &common::request(&input, 1));
    assert_eq!(answer.status, 503, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json()["kind"], "worker_timed_out", "{}", answer.error());
    // Killed for it, and loaded again in a new worker.
    wait_until("a new worker serves version 1", || {
        let answer = server.post_json("/v2/models/m/infer", &common::request(&input, 1));
        answer.status == 200 && workers_of(server.pid()).iter().all(|pid| *pid != first[0])
    });
    assert_close(&infer(&server, "m", &input, 1).1, &mlp(1).forward(&input, 1), "the new worker");
    wait_until("the exit is counted", || exits(&server, "m").iter().any(|l| l.contains("action=\"restarting\"")));
}

/// A canary that promotes an equal candidate by itself: windows of 300 ms,
/// 20 samples a side, drift guarded, latency not (a worker's hop costs
/// microseconds that a latency ratio on a busy machine would read as a
/// regression; the guards are tested elsewhere).
const CANARY: &str = "[policy]\nkeep_previous = 0\n[rollout]\nauto = true\nsteps = [50, 100]\ninterval_ms = 300\n\
                      watch_ms = 0\nmax_inconclusive = 1000\n[rollout.guards]\nmin_samples = 20\nmax_p99_ratio = 100\n\
                      max_rel_l2 = 0.05\n";

/// Publishes `version` (the same weights as version 1) with `engine`, and
/// waits until its canary has promoted it.
fn canary_to(server: &baton_testkit::server::Server, repo: &baton_testkit::repo::TestRepo, version: u64, engine: &str) {
    repo.add_model("m", &baton_testkit::repo::mlp_toml(&mlp(1), &format!("{engine}{CANARY}")));
    repo.publish_mlp("m", version, &mlp(1));
    baton_testkit::server::eventually(&format!("version {version} promoted by its canary"), || {
        let status = server.status("m");
        (status["serving"] == version && status["rollout"]["phase"] == "promoted").then_some(())
    });
}

#[test]
fn a_canary_moves_a_model_into_a_worker_and_back_with_no_failed_request() {
    let repo = repo_with("m", &[], "");
    repo.add_model("m", &baton_testkit::repo::mlp_toml(&mlp(1), CANARY));
    repo.publish_mlp("m", 1, &mlp(1));
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    assert!(workers_of(server.pid()).is_empty());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (answered, failures) = std::thread::scope(|scope| {
        let traffic = scope.spawn(|| {
            let client = server.client();
            let (mut answered, mut failures) = (0u64, Vec::new());
            let mut seed = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seed += 1;
                let input = sample_input(SIZES[0], 1, seed);
                let answer = client.post_json("/v2/models/m/infer", &common::request(&input, 1));
                match answer.status {
                    200 => {
                        let got = common::output_f32(&answer.json(), "output");
                        assert_close(&got, &mlp(1).forward(&input, 1), "an answer during the canaries");
                        answered += 1;
                    }
                    status => failures.push(format!("{status}: {}", answer.error())),
                }
            }
            (answered, failures)
        });
        canary_to(&server, &repo, 2, IN_WORKER);
        wait_until("version 2 alone runs in a worker", || workers_of(server.pid()).len() == 1);
        canary_to(&server, &repo, 3, "");
        wait_until("no worker is left", || workers_of(server.pid()).is_empty());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        traffic.join().unwrap()
    });
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {:?}",
        failures.len(),
        answered,
        &failures[..failures.len().min(5)]
    );
    assert!(answered > 40, "only {answered} requests were answered");
}

#[test]
fn a_worker_runs_at_its_nice_level_looks_as_told_and_within_its_memory_limit_and_one_too_small_refuses_the_load() {
    let limits = format!("{IN_WORKER}worker_nice = 5\nworker_memory_mb = 16384\nworker_spin_us = 250\n");
    let repo = repo_with("m", &[1], &limits);
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let worker = workers_of(server.pid())[0];
    let stat = std::fs::read_to_string(format!("/proc/{worker}/stat")).unwrap();
    // After the command's closing parenthesis, the nice level is the 17th field.
    let nice = stat.rsplit_once(") ").unwrap().1.split(' ').nth(16).unwrap();
    assert_eq!(nice, "5", "{stat}");
    // How long its slots look for the next call before they sleep.
    let environ = std::fs::read(format!("/proc/{worker}/environ")).unwrap();
    let spin = environ.split(|&b| b == 0).find_map(|v| v.strip_prefix(b"BATON_WORKER_SPIN_US="));
    assert_eq!(spin, Some(&b"250"[..]));
    let limit = &server.status("m")["live"][0]["worker"]["memory_limit"];
    assert_eq!(limit["bytes"].as_u64(), Some(16384 << 20), "{limit}");
    match limit["by"].as_str().unwrap() {
        by @ ("cgroup_v1" | "cgroup_v2") => {
            // In a memory cgroup of its own, holding the limit.
            let groups = std::fs::read_to_string(format!("/proc/{worker}/cgroup")).unwrap();
            let line = groups.lines().find(|l| l.contains("baton-worker-")).unwrap_or_else(|| panic!("{groups}"));
            let path = line.splitn(3, ':').nth(2).unwrap();
            let file = if by == "cgroup_v1" { "memory.limit_in_bytes" } else { "memory.max" };
            let found = memory_group_file(path, file);
            assert_eq!(found.trim(), (16384u64 << 20).to_string(), "{by} {path}");
        }
        "address_space" => {
            // Only where no memory cgroup could be made: not as root with
            // a memory hierarchy mounted.
            assert!(!can_make_memory_groups(), "a memory cgroup could be made, yet {limit}");
            let limits_file = std::fs::read_to_string(format!("/proc/{worker}/limits")).unwrap();
            let address_space = limits_file.lines().find(|l| l.starts_with("Max address space")).unwrap();
            assert!(address_space.contains(&(16384u64 << 20).to_string()), "{address_space}");
        }
        other => panic!("memory limit kept by {other}"),
    }
    eprintln!("the worker's memory limit: {limit}");
    assert_eq!(infer(&server, "m", &sample_input(SIZES[0], 1, 1), 1).0, 1);
    // 4 MiB cannot hold the engine, resident (the kernel kills the worker)
    // or as address space (an allocation fails): version 2 is refused at
    // load, and version 1 serves on.
    repo.add_model("m", &baton_testkit::repo::mlp_toml(&mlp(1), &format!("{IN_WORKER}worker_memory_mb = 4\n")));
    repo.publish_mlp("m", 2, &mlp(2));
    let error = refusal(&server);
    assert_eq!((error["stage"].as_str(), error["version"].as_u64()), (Some("load"), Some(2)), "{error}");
    wait_until("only version 1's worker is left", || workers_of(server.pid()) == vec![worker]);
    assert_eq!(infer(&server, "m", &sample_input(SIZES[0], 1, 2), 1).0, 1);
    eprintln!("refused: {error}");
}

/// The content of `file` of the memory cgroup at `path` (as
/// `/proc/PID/cgroup` gives it), in whichever hierarchy holds it.
fn memory_group_file(path: &str, file: &str) -> String {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let found = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .find_map(|mount| std::fs::read_to_string(format!("{mount}{path}/{file}")).ok());
    found.unwrap_or_else(|| panic!("no {file} for {path}"))
}

/// Whether this machine lets a root process make memory cgroups of its
/// own: cgroup v1's memory hierarchy is mounted writable and this test
/// runs as root.
fn can_make_memory_groups() -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let v1 = mounts.lines().any(|l| l.contains(" - cgroup ") && l.contains(",memory") && l.contains(" rw,"));
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    v1 && root
}

/// The stable version's worker killed while a canary runs: the rollout is
/// aborted (no version loads while one runs, and the canary leaned on the
/// stable version), then the stable version is loaded again in a new
/// worker and serves alone.
#[test]
fn a_stable_worker_killed_during_a_canary_ends_the_canary_and_is_restarted() {
    let slow = "[policy]\nkeep_previous = 0\n[rollout]\nauto = true\nsteps = [50]\ninterval_ms = 600000\n";
    let repo = repo_with("m", &[1], &format!("{IN_WORKER}{slow}"));
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let stable = workers_of(server.pid());
    assert_eq!(stable.len(), 1);
    repo.publish_mlp("m", 2, &mlp(1));
    wait_until("the canary runs", || server.status("m")["rollout"]["phase"] == "running");
    kill(stable[0]);
    wait_until("the canary is aborted", || server.status("m")["rollout"]["phase"] == "aborted");
    // The server decided, not an operator.
    let ended = server.status("m");
    let last = ended["rollout"]["decisions"].as_array().and_then(|d| d.last()).cloned().unwrap_or_default();
    assert_eq!((last["action"].as_str(), last["by"].as_str()), (Some("aborted"), Some("server")), "{last}");
    let input = sample_input(SIZES[0], 1, 8);
    wait_until("version 1 serves again in a new worker", || {
        let answer = server.post_json("/v2/models/m/infer", &common::request(&input, 1));
        answer.status == 200 && !workers_of(server.pid()).contains(&stable[0])
    });
    let (version, output) = infer(&server, "m", &input, 1);
    assert_eq!(version, 1);
    assert_close(&output, &mlp(1).forward(&input, 1), "version 1 restarted");
    wait_until("the exit is counted as a restart", || {
        exits(&server, "m").iter().any(|l| l.contains("action=\"restarting\""))
    });
    assert_eq!(server.status("m")["workers"]["restarts"], 1);
}

#[test]
fn an_idle_worker_that_hangs_is_found_by_its_heartbeat_and_replaced_before_any_call() {
    let toml = format!("{IN_WORKER}worker_timeout_ms = 1000\nworker_heartbeat_ms = 100\n[policy]\nkeep_previous = 0\n");
    let (_repo, server, first) = serving_then_stopped(&toml);
    // No call is made: the heartbeat alone finds it, and it is replaced.
    wait_until("the stopped worker is replaced by a new one", || {
        let now = workers_of(server.pid());
        now.len() == 1 && now[0] != first[0]
    });
    wait_until("the exit is counted", || exits(&server, "m").iter().any(|l| l.contains("action=\"restarting\"")));
    wait_until("model m is ready again", || server.get("/v2/models/m/ready").status == 200);
    let input = sample_input(SIZES[0], 1, 3);
    assert_close(&infer(&server, "m", &input, 1).1, &mlp(1).forward(&input, 1), "the new worker");
}

/// A version in a worker holds what its worker process holds: the memory
/// budgets count the worker's resident memory, the candidate's and every
/// live version's, so the second of two ~60 MiB workers does not fit in
/// 90 MiB, which the server's own growth (a few MiB each) would let pass.
#[test]
fn a_worker_s_resident_memory_counts_against_the_memory_budget() {
    let toml = format!("{IN_WORKER}[policy]\nmemory_budget = \"90MiB\"\nkeep_previous = 1\n");
    let repo = repo_with("m", &[1], &toml);
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let worker = workers_of(server.pid());
    let rss = common::server_status(&server)["models"][0]["live"][0]["worker"]["rss"].as_u64().unwrap();
    assert!(rss > 45 << 20, "the test assumes a worker holds more than half of the budget: {rss}");
    repo.publish_mlp("m", 2, &mlp(2));
    let error = refusal(&server);
    assert_eq!((error["stage"].as_str(), error["version"].as_u64()), (Some("load"), Some(2)), "{error}");
    assert!(error.to_string().contains("memory_budget_exceeded"), "{error}");
    assert!(error.to_string().contains("worker process"), "{error}");
    wait_until("only version 1's worker is left", || workers_of(server.pid()) == worker);
    assert_eq!(infer(&server, "m", &sample_input(SIZES[0], 1, 2), 1).0, 1);
}

/// Two models' workers killed: one whose version cannot be loaded again
/// (its files are gone), which is retried with backoff for about a
/// minute, and another, loaded again at once. One model's restarts hold up
/// no other's: the second serves again while the first is still retried.
#[test]
fn a_model_retried_with_backoff_holds_up_no_other_model_s_restart() {
    let toml = format!("{IN_WORKER}[policy]\nkeep_previous = 0\n");
    let repo = repo_with("m", &[1], &toml);
    repo.add_model("n", &baton_testkit::repo::mlp_toml(&mlp(1), &toml));
    repo.publish_mlp("n", 1, &mlp(1));
    // Explicit: no poll notices the files gone and unloads the model.
    let server = start(&repo, &["--model-control", "explicit", "--load-model", "m", "--load-model", "n"]);
    server.wait_serving("m", 1);
    server.wait_serving("n", 1);
    let worker = |model: &str| server.status(model)["live"][0]["worker"]["pid"].as_u64().unwrap() as u32;
    let (m, n) = (worker("m"), worker("n"));
    repo.remove_version("m", 1);
    kill(m);
    wait_until("m's first restart fails", || server.status("m")["workers"]["restarts"].as_u64() >= Some(2));
    kill(n);
    let input = sample_input(SIZES[0], 1, 9);
    // A kill takes effect a moment after it is sent: until the server sees
    // the worker gone, the old one may still answer.
    let serving_pid = |model: &str| server.status(model)["live"][0]["worker"]["pid"].as_u64();
    wait_until("n serves again in a new worker", || {
        serving_pid("n").is_some_and(|pid| pid != u64::from(n))
            && server.post_json("/v2/models/n/infer", &common::request(&input, 1)).status == 200
    });
    // m is still being retried: it has not given up.
    let m_exits = exits(&server, "m");
    assert!(m_exits.iter().all(|l| !l.contains("gave_up")), "n waited for m's restarts to end: {m_exits:?}");
    assert_ne!(worker("n"), n);
}
