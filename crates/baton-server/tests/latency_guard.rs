//! The latency guard sees what the user waits for, wherever a version runs,
//! through the real binary and real ONNX Runtime work. A canary from a
//! stable version in the server's process to a candidate several times as
//! costly (the same answers for more matrix work: `baton_onnx::costly`) is
//! rolled back on its p99 ratio with the default guards when the candidate
//! runs in a worker process, and when it runs on several engine threads
//! that do its work while the calling thread sleeps, or busy-waits; an
//! identical candidate in a worker reads a ratio of 1.0 ± 0.2 at every step
//! and is promoted.
//!
//! No assertion reads a wall-clock time: only the guard's ratio of the two
//! sides, timed alike on the same machine at the same moments, and the
//! decisions it led to.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::Server;
use serde_json::Value;

/// The MLP every version computes.
const SIZES: [usize; 4] = [256, 512, 512, 16];

/// How long a rollout may take, held windows included.
const LONG: Duration = Duration::from_secs(300);

fn mlp() -> Mlp {
    Mlp::new(&SIZES, 49)
}

/// A canary through `steps` with windows of `interval_ms`, the default
/// guards, no watch after promotion, and no limit on held windows.
fn canary(steps: &str, interval_ms: u64) -> String {
    format!(
        "[policy]\nkeep_previous = 0\n[rollout]\nauto = true\nsteps = [{steps}]\ninterval_ms = {interval_ms}\n\
         watch_ms = 0\nmax_inconclusive = 1000\n"
    )
}

/// Rows of work per row asked for, of the stable version: about a
/// millisecond of arithmetic on one core.
const ROWS: usize = 128;

/// The same for the identical candidate's test, about three and a half
/// milliseconds: the hop's own cost in a debug build (a few hundred
/// microseconds each way, serialising and copying) is then under a tenth
/// of a run, as it is for a small model in a release build.
const HEAVY_ROWS: usize = 384;

/// Warmup at batch sizes 1 and 2 only: a batch of 64 rows of a version
/// three times as costly is seconds of work, past the warmup's budget.
const WARMUP: &str = "[warmup]\nbatch_sizes = [1, 2]\n";

/// Each test keeps both cores busy on its own: they run one at a time, so
/// that a window gathers its samples in a few seconds on a busy machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A repository serving version 1 of `m` in the server's process (`rows`
/// rows of work per row), with `[rollout]` as `rollout` says.
fn serving_stable(rows: usize, rollout: &str) -> (TestRepo, Server) {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(), &format!("{WARMUP}{rollout}")));
    repo.publish_costly("m", 1, &mlp(), rows);
    let server = common::start(&repo, &[]);
    server.wait_settled("m", 1);
    (repo, server)
}

/// Closed-loop clients sending keyless requests until stopped.
struct Traffic {
    stop: std::sync::Arc<AtomicBool>,
    failed: std::sync::Arc<AtomicU64>,
    sent: std::sync::Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<Vec<String>>>,
}

impl Traffic {
    fn start(server: &Server, clients: usize) -> Traffic {
        let (stop, failed, sent) = (std::sync::Arc::default(), std::sync::Arc::default(), std::sync::Arc::default());
        let threads = (0..clients)
            .map(|c| {
                let client = server.client();
                let (stop, failed, sent): (std::sync::Arc<AtomicBool>, std::sync::Arc<AtomicU64>, _) =
                    (std::sync::Arc::clone(&stop), std::sync::Arc::clone(&failed), std::sync::Arc::clone(&sent));
                let sent: std::sync::Arc<AtomicU64> = sent;
                std::thread::spawn(move || {
                    let mut errors = Vec::new();
                    let mut seed = c as u64 * 1_000_000;
                    while !stop.load(Ordering::Relaxed) {
                        seed += 1;
                        let input = sample_input(SIZES[0], 1, seed);
                        let answer = client.post_json("/v2/models/m/infer", &common::request(&input, 1));
                        sent.fetch_add(1, Ordering::Relaxed);
                        if answer.status != 200 {
                            failed.fetch_add(1, Ordering::Relaxed);
                            if errors.len() < 5 {
                                errors.push(format!("{}: {}", answer.status, answer.error()));
                            }
                        }
                    }
                    errors
                })
            })
            .collect();
        Traffic { stop, failed, sent, threads }
    }

    /// Stops the clients and asserts that none of their requests failed.
    fn assert_clean(self) {
        self.stop.store(true, Ordering::Relaxed);
        let errors: Vec<String> = self.threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let (failed, sent) = (self.failed.load(Ordering::Relaxed), self.sent.load(Ordering::Relaxed));
        assert_eq!(failed, 0, "{failed} of {sent} requests failed: {errors:?}");
    }
}

/// Publishes version 2 of `m`, `rows` rows of work per row asked for, with
/// `engine` lines for its `[engine]` table and `rollout` for its
/// `[rollout]`, and follows the canary the watcher starts until it is
/// promoted or rolled back; returns every decision the guards made, in
/// order.
fn roll_out(server: &Server, repo: &TestRepo, rows: usize, engine: &str, rollout: &str) -> Vec<Value> {
    repo.add_model("m", &mlp_toml(&mlp(), &format!("{WARMUP}[engine]\n{engine}\n{rollout}")));
    repo.publish_costly("m", 2, &mlp(), rows);
    let deadline = Instant::now() + LONG;
    let mut seen: BTreeMap<(u64, String), Value> = BTreeMap::new();
    loop {
        let status = server.status("m");
        let rollout = &status["rollout"];
        if rollout["candidate"] == 2 {
            for d in rollout["decisions"].as_array().into_iter().flatten() {
                let key =
                    (d["at_ms"].as_u64().unwrap_or_default(), d["action"].as_str().unwrap_or_default().to_owned());
                seen.entry(key).or_insert_with(|| d.clone());
            }
            if rollout["phase"] == "promoted" || rollout["phase"] == "rolled_back" {
                return seen.into_values().filter(|d| d["by"] == "guards").collect();
            }
        }
        assert!(Instant::now() < deadline, "no end to the rollout: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The p99 ratio a decision was made on, if its window had one.
fn p99_ratio(decision: &Value) -> Option<f64> {
    let checks = decision["verdict"]["checks"].as_array()?;
    checks.iter().find(|c| c["guard"] == "p99_ratio")?["value"].as_f64()
}

fn summary(decisions: &[Value]) -> Vec<String> {
    decisions
        .iter()
        .map(|d| format!("{} at {}%: p99 ratio {:?}", d["action"], d["weight_percent"], p99_ratio(d)))
        .collect()
}

/// Asserts that the last decision rolled the candidate back on its p99
/// ratio, well past the default bound of 1.5.
fn assert_rolled_back_on_latency(decisions: &[Value]) {
    let last = decisions.last().unwrap_or_else(|| panic!("no decision"));
    assert_eq!(last["action"], "rolled_back", "{:#?}", summary(decisions));
    let checks = last["verdict"]["checks"].as_array().cloned().unwrap_or_default();
    let latency = checks.iter().find(|c| c["guard"] == "p99_ratio").cloned().unwrap_or_default();
    assert_eq!(latency["outcome"], "fail", "rolled back on something else: {last}");
    assert!(latency["value"].as_f64().is_some_and(|r| r > 1.5), "{latency}");
}

/// Runs a canary of a candidate `times` as costly with `engine`, under
/// two closed-loop clients, and asserts that it is rolled back on its p99
/// ratio and that no request failed.
fn assert_costly_candidate_rolled_back(times: usize, engine: &str) {
    let _alone = alone();
    let rollout = canary("50, 100", 4000);
    let (repo, server) = serving_stable(ROWS, &rollout);
    let traffic = Traffic::start(&server, 2);
    let decisions = roll_out(&server, &repo, ROWS * times, engine, &rollout);
    traffic.assert_clean();
    eprintln!("{:#?}", summary(&decisions));
    assert_rolled_back_on_latency(&decisions);
}

#[test]
fn a_candidate_in_a_worker_three_times_as_costly_is_rolled_back_on_its_p99_ratio() {
    // Timed by the calling thread's CPU, it read about 0.5 (the hop's
    // copies, not the run) and was promoted.
    assert_costly_candidate_rolled_back(3, "isolation = \"process\"");
}

#[test]
fn a_candidate_whose_engine_threads_work_while_its_calling_thread_sleeps_is_rolled_back_on_its_p99_ratio() {
    // Four times the work, a quarter of it on the calling thread, which
    // sleeps while three engine threads do the rest: on two cores the user
    // waits at least twice as long, and the calling thread's CPU time read
    // about one.
    assert_costly_candidate_rolled_back(4, "sessions = 1\nintra_op_threads = 4\nallow_spinning = false");
}

#[test]
fn a_candidate_whose_engine_threads_work_while_its_calling_thread_busy_waits_is_rolled_back_on_its_p99_ratio() {
    // ONNX Runtime's default: the calling thread busy-waits for its
    // engine threads, so its CPU time covers their work (and was already
    // rolled back when timed by it alone).
    assert_costly_candidate_rolled_back(3, "sessions = 1\nintra_op_threads = 2");
}

#[test]
fn an_identical_candidate_in_a_worker_reads_a_p99_ratio_near_one_at_every_step_and_is_promoted() {
    let _alone = alone();
    let rollout = canary("25, 50, 100", 4000);
    let (repo, server) = serving_stable(HEAVY_ROWS, &rollout);
    let traffic = Traffic::start(&server, 2);
    let decisions = roll_out(&server, &repo, HEAVY_ROWS, "isolation = \"process\"", &rollout);
    traffic.assert_clean();
    let summary = summary(&decisions);
    eprintln!("{summary:#?}");
    assert_eq!(decisions.last().map(|d| d["action"].clone()), Some("promoted".into()), "{summary:#?}");
    let judged: Vec<&Value> = decisions.iter().filter(|d| d["action"] != "held").collect();
    assert!(judged.len() >= 3, "every step judged: {summary:#?}");
    for d in judged {
        let ratio = p99_ratio(d).unwrap_or_else(|| panic!("no p99 ratio: {summary:#?}"));
        assert!((0.8..=1.2).contains(&ratio), "an identical candidate read {ratio}: {summary:#?}");
    }
}
