//! A worker's hop at and past its limits, and worker processes that end at
//! awkward moments, through the real binary and real workers running ONNX
//! Runtime: a string model's answer with hundreds of kilobytes of element
//! lengths is served and the worker serves on; an answer larger than the
//! worker's shared region is refused with a clear error and the next one
//! is answered; a slot whose worker sends what baton does not read gets
//! the worker replaced, and no answer ever reaches the wrong request; a
//! rollout's twin that dies ends the twin and counts nothing against the
//! stable version; the stable version's worker that dies during the watch
//! after a promotion goes back to the version it replaced; and a rollout
//! is refused while the stable version has no worker.

mod common;

use std::time::{Duration, Instant};

use baton_onnx::mlp::sample_input;
use baton_onnx::proto::elem;
use baton_onnx::writer::{Attr, Dim, GraphWriter};
use baton_testkit::server::Server;
use common::{SIZES, assert_close, infer, mlp, repo_with, start};
use serde_json::json;

const IN_WORKER: &str = "[engine]\nisolation = \"process\"\nsessions = 1\n";
const LONG: Duration = Duration::from_secs(60);

/// Waits, within a bound, until `done` holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pids of `baton worker` processes whose parent is `server`.
fn workers_of(server: u32) -> Vec<u32> {
    common::children_of(server, "worker")
}

/// Kills `pid` with SIGKILL.
fn kill(pid: u32) {
    signal(pid, "KILL");
}

/// Sends `pid` the signal named `name`.
fn signal(pid: u32, name: &str) {
    let sent = std::process::Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status().unwrap();
    assert!(sent.success(), "kill -{name} {pid}");
}

/// The `exited` events' actions in the server's metrics, for `model`.
fn exits(server: &Server, model: &str) -> Vec<String> {
    let metrics = server.metrics();
    metrics
        .lines()
        .filter(|l| l.starts_with("baton_worker_exits_total{") && l.contains(&format!("model=\"{model}\"")))
        .map(str::to_owned)
        .collect()
}

/// A string model: `output = Gather(input, indices, axis 1)` with
/// `fanout` indices alternating 0 and 1, so a `[n, 2]` BYTES input
/// answers `[n, fanout]` strings, each a copy of one of its row's two.
fn fanout_model(fanout: usize) -> Vec<u8> {
    let mut graph = GraphWriter::new("baton_fanout");
    let indices: Vec<i64> = (0..fanout as i64).map(|i| i % 2).collect();
    graph.initializer_i64("indices", &[fanout as i64], &indices);
    graph.node("Gather", &["input", "indices"], &["output"], &[Attr::Int("axis", 1)]);
    graph.input("input", elem::STRING, &[Dim::Named("batch"), Dim::Fixed(2)]);
    graph.output("output", elem::STRING, &[Dim::Named("batch"), Dim::Fixed(fanout as i64)]);
    graph.model(13)
}

/// A repository whose model `s` is [`fanout_model`] in a worker, with
/// `engine` added to its `[engine]` table.
fn fanout_repo(fanout: usize, engine: &str) -> baton_testkit::repo::TestRepo {
    let repo = baton_testkit::repo::TestRepo::new();
    let toml = format!(
        "backend = \"onnx\"\n\
         inputs = [{{ name = \"input\", datatype = \"BYTES\", shape = [-1, 2] }}]\n\
         outputs = [{{ name = \"output\", datatype = \"BYTES\", shape = [-1, {fanout}] }}]\n\
         {IN_WORKER}{engine}\n[warmup]\nbatch_sizes = [1]\n[policy]\nkeep_previous = 0\n"
    );
    repo.add_model("s", &toml);
    repo.write_files("s", 1, &[("model.onnx", &fanout_model(fanout))]);
    repo.seal("s", 1);
    repo
}

/// Asks model `s` to fan out the strings `a` and `b`.
fn fan_out(server: &Server, a: &str, b: &str) -> baton_testkit::server::Answer {
    let body = json!({ "inputs": [{ "name": "input", "datatype": "BYTES", "shape": [1, 2], "data": [a, b] }] });
    server.post_json("/v2/models/s/infer", &body)
}

/// Asserts `answer` is `fanout` strings alternating `a` and `b`.
fn assert_fanned_out(answer: &baton_testkit::server::Answer, fanout: usize, a: &str, b: &str) {
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body[..answer.body.len().min(500)]));
    let body = answer.json();
    let output = &body["outputs"][0];
    assert_eq!(output["shape"], json!([1, fanout]));
    let data = output["data"].as_array().expect("string data");
    assert_eq!(data.len(), fanout);
    for (i, value) in data.iter().enumerate() {
        assert_eq!(value.as_str(), Some(if i % 2 == 0 { a } else { b }), "element {i}");
    }
}

/// One answer of 100,000 strings: about 400 KB of element lengths, which
/// once travelled in the control message (256 KiB at most) and ended the
/// slot's thread, so that this and every later request failed while the
/// worker lived on. The lengths go through the shared region now.
#[test]
fn a_string_answer_with_large_metadata_is_served_and_the_worker_serves_on() {
    const FANOUT: usize = 100_000;
    let repo = fanout_repo(FANOUT, "");
    let server = start(&repo, &[]);
    server.wait_serving("s", 1);
    let worker = workers_of(server.pid());
    assert_eq!(worker.len(), 1);
    for (a, b) in [("abcdefghij", "klmnopqrst"), ("x", ""), ("abcdefghij", "klmnopqrst")] {
        assert_fanned_out(&fan_out(&server, a, b), FANOUT, a, b);
    }
    assert_eq!(workers_of(server.pid()), worker, "the same worker serves");
    assert!(exits(&server, "s").is_empty(), "{:?}", exits(&server, "s"));
}

/// A worker's shared regions are bounded (`worker_region_mb`): an answer
/// that does not fit is refused for its request alone, with a clear 413,
/// and the next request is answered by the same worker.
#[test]
fn an_answer_larger_than_the_worker_s_region_is_refused_and_the_next_is_answered() {
    const FANOUT: usize = 50_000;
    let repo = fanout_repo(FANOUT, "worker_region_mb = 1\n");
    let server = start(&repo, &[]);
    server.wait_serving("s", 1);
    let worker = workers_of(server.pid());
    // 50,000 strings of 30 bytes: 1.5 MB, more than the 1 MiB region.
    let long = "a".repeat(30);
    let refused = fan_out(&server, &long, &long);
    assert_eq!(refused.status, 413, "{}", String::from_utf8_lossy(&refused.body));
    assert_eq!(refused.json()["kind"], "worker_region_exceeded", "{}", refused.error());
    assert!(refused.error().contains("worker_region_mb"), "{}", refused.error());
    assert_fanned_out(&fan_out(&server, "a", "bc"), FANOUT, "a", "bc");
    assert_eq!(workers_of(server.pid()), worker, "the same worker serves");
}

/// A model of `outputs` outputs, each a copy of its one input (`[batch, 2]`
/// FP32), under names of about 80 characters.
fn many_outputs_model(outputs: usize) -> (Vec<u8>, Vec<String>) {
    let mut graph = GraphWriter::new("baton_many_outputs");
    graph.input("input", elem::FLOAT, &[Dim::Named("batch"), Dim::Fixed(2)]);
    let names: Vec<String> = (0..outputs).map(|i| format!("output_{i:05}_{}", "x".repeat(68))).collect();
    for name in &names {
        graph.node("Identity", &["input"], &[name], &[]);
        graph.output(name, elem::FLOAT, &[Dim::Named("batch"), Dim::Fixed(2)]);
    }
    (graph.model(13), names)
}

/// A version whose signature is larger than a setup message may be (2,000
/// outputs: about 250 KB as the worker reports it, past the setup
/// channel's 128 KiB) loads in a worker and answers. Before, the worker
/// could not send its report, exited, and the load failed, saying only
/// that the worker closed its channel.
#[test]
fn a_version_whose_signature_is_larger_than_a_setup_message_loads_in_a_worker() {
    const OUTPUTS: usize = 2000;
    let repo = baton_testkit::repo::TestRepo::new();
    repo.add_model("wide", &format!("backend = \"onnx\"\n{IN_WORKER}[warmup]\nbatch_sizes = [1]\n"));
    let (model, names) = many_outputs_model(OUTPUTS);
    repo.write_files("wide", 1, &[("model.onnx", &model)]);
    repo.seal("wide", 1);
    let server = start(&repo, &[]);
    server.wait_serving("wide", 1);
    let body = json!({ "inputs": [{ "name": "input", "datatype": "FP32", "shape": [1, 2], "data": [1.5, -2.0] }] });
    let answer = server.post_json("/v2/models/wide/infer", &body);
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body[..answer.body.len().min(500)]));
    let outputs = answer.json()["outputs"].as_array().cloned().unwrap_or_default();
    assert_eq!(outputs.len(), OUTPUTS);
    for name in [&names[0], &names[OUTPUTS - 1]] {
        assert_eq!(common::output_f32(&answer.json(), name), vec![1.5, -2.0], "{name}");
    }
}

/// The descriptors of a worker's slots, as its environment names them.
fn slot_descriptors(worker: u32) -> Vec<i32> {
    let environ = std::fs::read(format!("/proc/{worker}/environ")).unwrap();
    let fds = environ
        .split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(b"BATON_WORKER_FDS="))
        .expect("the worker's descriptors");
    // The setup channel's, the life channel's, then the slots'.
    String::from_utf8_lossy(fds).split(',').skip(2).map(|fd| fd.parse().unwrap()).collect()
}

/// A worker whose slots all hold a message baton does not read (the test
/// takes a copy of the worker's end of each slot, as root may, and writes
/// into it as the worker would): the first call that reads one fails, the
/// server replaces the worker, and the model serves again. No request ever
/// gets another request's answer (the worker's real answer waits behind
/// the bad message, and a slot used again would hand it to the next call).
#[test]
fn a_worker_whose_slot_sends_what_baton_does_not_read_is_replaced_and_no_answer_goes_astray() {
    use rustix::process::{PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};
    let repo = repo_with("m", &[1], &format!("{IN_WORKER}[policy]\nkeep_previous = 0\n"));
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let first = workers_of(server.pid());
    assert_eq!(first.len(), 1);
    let pid = rustix::process::Pid::from_raw(first[0] as i32).unwrap();
    let pidfd = pidfd_open(pid, PidfdFlags::empty()).expect("pidfd_open");
    for fd in slot_descriptors(first[0]) {
        let slot = pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()).expect("a copy of the worker's slot");
        rustix::net::send(&slot, b"this is no answer", rustix::net::SendFlags::empty()).unwrap();
    }
    let deadline = Instant::now() + LONG;
    let mut refused = 0;
    for seed in 0.. {
        assert!(Instant::now() < deadline, "the worker was not replaced");
        let input = sample_input(SIZES[0], 1, seed);
        let answer = server.post_json("/v2/models/m/infer", &common::request(&input, 1));
        if answer.status == 200 {
            // Whichever worker answered, the answer is this request's.
            let got = common::output_f32(&answer.json(), "output");
            assert_close(&got, &mlp(1).forward(&input, 1), &format!("request {seed}"));
            if !workers_of(server.pid()).contains(&first[0]) {
                break;
            }
            continue;
        }
        assert!([500, 503].contains(&answer.status), "{}", String::from_utf8_lossy(&answer.body));
        assert!(answer.json()["kind"].as_str().is_some_and(|k| k.starts_with("worker_")), "{}", answer.error());
        refused += 1;
    }
    assert!(refused >= 1, "no call read the bad message");
    wait_until("the exit is counted", || exits(&server, "m").iter().any(|l| l.contains("action=\"restarting\"")));
    let input = sample_input(SIZES[0], 1, 99);
    assert_close(&infer(&server, "m", &input, 1).1, &mlp(1).forward(&input, 1), "the new worker");
}

/// What a test does to each of a worker's slots, through a copy of the
/// worker's end of it.
#[derive(Clone, Copy, Debug)]
enum SlotFault {
    /// Sends a message of no bytes, which reads as the end of the channel.
    Empty,
    /// Shuts the slot's socket down: the server's end reads its close while
    /// the worker process lives on.
    Shut,
}

/// Does `fault` to every slot of the worker `pid` (the test takes a copy
/// of the worker's end of each, as root may).
fn break_slots(pid: u32, fault: SlotFault) {
    use rustix::process::{PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};
    let pidfd = pidfd_open(rustix::process::Pid::from_raw(pid as i32).unwrap(), PidfdFlags::empty()).unwrap();
    for fd in slot_descriptors(pid) {
        let slot = pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()).expect("a copy of the worker's slot");
        match fault {
            SlotFault::Empty => drop(rustix::net::send(&slot, b"", rustix::net::SendFlags::empty()).unwrap()),
            SlotFault::Shut => rustix::net::shutdown(&slot, rustix::net::Shutdown::Both).unwrap(),
        }
    }
}

/// A worker whose slots read as closed while its process lives on (a
/// message of no bytes on each, or each shut down): the first call that
/// reads one fails, the server ends that worker and loads the version
/// again in a new one, and the model serves again. Before, the server
/// counted such a worker as gone but never ended it, so nothing replaced
/// it: every request got 503 `worker_gone`, for good.
#[test]
fn a_worker_whose_slots_read_as_closed_while_it_lives_is_replaced() {
    let repo = repo_with("m", &[1], &format!("{IN_WORKER}[policy]\nkeep_previous = 0\n"));
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    for (round, fault) in [SlotFault::Empty, SlotFault::Shut].into_iter().enumerate() {
        let worker = workers_of(server.pid());
        assert_eq!(worker.len(), 1, "{fault:?}");
        break_slots(worker[0], fault);
        let deadline = Instant::now() + LONG;
        let mut refused = 0;
        for seed in 0.. {
            assert!(Instant::now() < deadline, "{fault:?}: the worker was not replaced ({refused} refused)");
            let input = sample_input(SIZES[0], 1, seed);
            let answer = server.post_json("/v2/models/m/infer", &common::request(&input, 1));
            if answer.status == 200 {
                let got = common::output_f32(&answer.json(), "output");
                assert_close(&got, &mlp(1).forward(&input, 1), &format!("{fault:?}: request {seed}"));
                let now = workers_of(server.pid());
                if now.len() == 1 && now != worker {
                    break;
                }
                continue;
            }
            assert_eq!(answer.status, 503, "{fault:?}: {}", String::from_utf8_lossy(&answer.body));
            refused += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(refused >= 1, "{fault:?}: no call read the broken slot");
        let restarted = round + 1;
        wait_until("the exit is counted", || {
            let counted = exits(&server, "m");
            counted.iter().any(|l| l.contains("action=\"restarting\"") && l.ends_with(&format!(" {restarted}")))
        });
    }
}

/// Whether a message waits, unread, on any of `slots` (copies of a
/// worker's ends of its slots).
fn a_call_waits(slots: &[std::os::fd::OwnedFd]) -> bool {
    let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
    slots.iter().any(|slot| rustix::net::recv(slot, &mut [0u8; 1], flags).is_ok())
}

/// A canary with a twin of the stable version in a worker of its own:
/// the twin's worker hangs (stopped) with a paired copy in one of its
/// slots, then is killed. The twin ends (status says why), the stable
/// version runs the paired copies from then on, and the copy that failed
/// on the dead twin counts as dropped, as do the copies the twin had no
/// room for: none counts as the stable version's error.
#[test]
fn a_twin_that_dies_ends_the_twin_and_counts_nothing_against_the_stable_version() {
    use rustix::process::{PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};
    let slow = "[policy]\nkeep_previous = 0\n[rollout]\nauto = true\nsteps = [50]\ninterval_ms = 600000\n";
    let repo = repo_with("m", &[1], &format!("{IN_WORKER}{slow}"));
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    repo.publish_mlp("m", 2, &mlp(1));
    wait_until("the canary runs with a twin", || {
        let rollout = &server.status("m")["rollout"];
        rollout["phase"] == "running" && rollout["twin"]["loaded"] == true
    });
    let live = server.status("m")["live"].clone();
    let twin = live.as_array().unwrap().iter().find(|v| v["twin"] == true).expect("the twin");
    let twin_pid = twin["worker"]["pid"].as_u64().unwrap() as u32;
    let pidfd = pidfd_open(rustix::process::Pid::from_raw(twin_pid as i32).unwrap(), PidfdFlags::empty()).unwrap();
    let slots: Vec<_> = slot_descriptors(twin_pid)
        .into_iter()
        .map(|fd| pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()).expect("a copy of the twin's slot"))
        .collect();
    baton_testkit::signals::stop(twin_pid);
    // Requests sent, and how many of them the candidate answered.
    let mut sent = (0u64, 0u64);
    let ask = |sent: &mut (u64, u64)| {
        let input = sample_input(SIZES[0], 1, sent.0);
        let (version, output) = infer(&server, "m", &input, 1);
        assert_close(&output, &mlp(1).forward(&input, 1), "an answer");
        *sent = (sent.0 + 1, sent.1 + u64::from(version == 2));
    };
    // Until a paired copy waits for the stopped twin.
    let deadline = Instant::now() + LONG;
    while !a_call_waits(&slots) {
        assert!(Instant::now() < deadline, "no copy reached the twin in {} requests", sent.0);
        ask(&mut sent);
    }
    drop(slots);
    kill(twin_pid);
    while sent.0 < 80 {
        ask(&mut sent);
    }
    let (sent, by_candidate) = sent;
    assert!(by_candidate >= 5, "the candidate answered {by_candidate} of {sent}");
    // Every request the stable version answered counts once on its side,
    // and so does every copy of one the candidate answered, run or dropped.
    let totals = || server.status("m")["rollout"]["totals"].clone();
    wait_until("every copy is accounted for", || {
        let t = totals();
        t["stable"]["requests"].as_u64().unwrap() + t["dropped"].as_u64().unwrap() >= sent
    });
    let t = totals();
    assert_eq!(t["stable"]["errors"], 0, "the dead twin's failures counted against stable: {t}");
    assert!(t["dropped"].as_u64() >= Some(1), "the copy the twin failed was not dropped: {t}");
    assert_eq!(t["comparison_errors"], 0, "{t}");
    let rollout = server.status("m")["rollout"].clone();
    assert_eq!(rollout["phase"], "running", "{rollout}");
    assert_eq!(rollout["twin"]["loaded"], false, "{rollout}");
    assert!(rollout["twin"]["reason"].as_str().is_some_and(|r| r.contains("ended")), "{rollout}");
    wait_until("the twin's exit is counted", || {
        exits(&server, "m").iter().any(|l| l.contains("action=\"twin_ended\""))
    });
    assert!(!workers_of(server.pid()).contains(&twin_pid));
}

/// The promoted version's worker dies during the watch after its
/// promotion: the watch ends by going back to the version it replaced
/// (kept loaded for just that), which serves at once; the exit's action
/// says so.
#[test]
fn a_promoted_version_whose_worker_dies_during_its_watch_goes_back_to_the_version_it_replaced() {
    let watched = "[policy]\nkeep_previous = 1\n[rollout]\nauto = true\nsteps = [50]\ninterval_ms = 600000\n\
                   watch_ms = 600000\n";
    let repo = repo_with("m", &[1], &format!("{IN_WORKER}{watched}"));
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    wait_until("the canary runs", || server.status("m")["rollout"]["phase"] == "running");
    let promoted = server.post_json("/baton/v1/models/m/rollout/promote", &json!({}));
    assert_eq!(promoted.status, 200, "{}", String::from_utf8_lossy(&promoted.body));
    wait_until("version 2 is watched", || {
        let status = server.status("m");
        status["serving"] == 2 && status["rollout"]["phase"] == "watching"
    });
    let live = server.status("m")["live"].clone();
    let two = live.as_array().unwrap().iter().find(|v| v["version"] == 2 && v["twin"] != true).expect("version 2");
    kill(two["worker"]["pid"].as_u64().unwrap() as u32);
    wait_until("version 1 serves again", || server.status("m")["serving"] == 1);
    let input = sample_input(SIZES[0], 1, 4);
    assert_close(&infer(&server, "m", &input, 1).1, &mlp(1).forward(&input, 1), "version 1");
    let rollout = server.status("m")["rollout"].clone();
    assert_eq!(rollout["phase"], "rolled_back", "{rollout}");
    let last = rollout["decisions"].as_array().and_then(|d| d.last()).cloned().unwrap_or_default();
    assert_eq!(last["by"], "server", "{last}");
    wait_until("the exit is counted", || !exits(&server, "m").is_empty());
    let counted = exits(&server, "m");
    assert!(counted.iter().any(|l| l.contains("action=\"rolled_back\"")), "{counted:?}");
}

/// Posts `body` to `path` until the answer is not 409 (another operation
/// on the model runs), within a bound.
fn unless_busy(server: &Server, path: &str, body: &serde_json::Value) -> baton_testkit::server::Answer {
    let deadline = Instant::now() + LONG;
    loop {
        let answer = server.post_json(path, body);
        if answer.status != 409 {
            return answer;
        }
        assert!(Instant::now() < deadline, "{path} stayed refused: {}", answer.error());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// While the stable version has no worker (its worker died and it cannot
/// be loaded again: its files are gone), a rollout is refused: its guards
/// would compare the candidate with a version that answers nothing. A
/// load of another version is what brings the model back, and does.
#[test]
fn a_rollout_is_refused_while_the_stable_version_has_no_worker() {
    let repo = repo_with("m", &[1, 2], &format!("{IN_WORKER}[policy]\nkeep_previous = 0\n"));
    let server = start(&repo, &["--model-control", "explicit", "--load-model", "m"]);
    server.wait_serving("m", 2);
    // Version 1 serves, version 2 is published beside it.
    let loaded = server.post_json("/baton/v1/models/m/load", &json!({ "version": 1 }));
    assert_eq!(loaded.status, 200, "{}", String::from_utf8_lossy(&loaded.body));
    server.wait_settled("m", 1);
    // Version 2's worker exits once it is freed, which may come later.
    wait_until("version 1's worker alone runs", || workers_of(server.pid()).len() == 1);
    let first = server.status("m")["live"][0]["worker"]["pid"].as_u64().unwrap() as u32;
    assert_eq!(workers_of(server.pid()), [first]);
    repo.remove_version("m", 1);
    kill(first);
    wait_until("a restart failed", || server.status("m")["workers"]["restarts"].as_u64() >= Some(2));
    // The server's own attempts to load version 1 again hold the model
    // for a moment each (409): asked again until one is not refused so.
    let refused = unless_busy(&server, "/baton/v1/models/m/rollout", &json!({ "version": 2 }));
    assert_eq!(refused.status, 400, "{}", String::from_utf8_lossy(&refused.body));
    assert_eq!(refused.json()["kind"], "rollout_refused", "{}", refused.error());
    assert!(refused.error().contains("no worker"), "{}", refused.error());
    let loaded = unless_busy(&server, "/baton/v1/models/m/load", &json!({ "version": 2 }));
    assert_eq!(loaded.status, 200, "{}", String::from_utf8_lossy(&loaded.body));
    let input = sample_input(SIZES[0], 1, 5);
    assert_close(&infer(&server, "m", &input, 1).1, &mlp(2).forward(&input, 1), "version 2");
}

/// A model that rolls new versions out by itself, whose stable version
/// has no worker (it died, and cannot be loaded again: its files are
/// gone): a version published then is loaded rather than rolled out
/// against a version that answers nothing, and the model serves again.
#[test]
fn a_version_published_while_the_stable_version_has_no_worker_is_loaded_rather_than_rolled_out() {
    let auto = "[policy]\nkeep_previous = 0\n[rollout]\nauto = true\nsteps = [50]\ninterval_ms = 600000\n";
    let repo = repo_with("m", &[1], &format!("{IN_WORKER}{auto}"));
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    let first = workers_of(server.pid());
    assert_eq!(first.len(), 1);
    repo.remove_version("m", 1);
    kill(first[0]);
    wait_until("a restart failed", || server.status("m")["workers"]["restarts"].as_u64() >= Some(2));
    repo.publish_mlp("m", 2, &mlp(2));
    wait_until("version 2 serves", || server.status("m")["serving"] == 2);
    let status = server.status("m");
    assert!(status["rollout"].is_null(), "a rollout was started: {status}");
    let input = sample_input(SIZES[0], 1, 6);
    assert_close(&infer(&server, "m", &input, 1).1, &mlp(2).forward(&input, 1), "version 2");
}
