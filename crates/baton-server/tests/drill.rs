//! Black-box tests of `baton drill`: the real binary drives load at a real
//! `baton serve` while swapping its model, and the tests read the JSON
//! report and the chart it writes. No assertion is about speed.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use baton_onnx::mlp::Mlp;
use baton_testkit::repo::{Damage, TestRepo, mlp_toml};
use baton_testkit::server::{PATIENCE, Server};
use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_baton"))
}

fn mlp(version: u64) -> Mlp {
    Mlp::new(&[8, 16, 2], 500 + version)
}

/// A repository with model `m` and the given versions published.
fn repo(versions: &[u64]) -> TestRepo {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), ""));
    for &v in versions {
        repo.publish_mlp("m", v, &mlp(v));
    }
    repo
}

/// Serves `repo`, once `m` serves `version` and its load has ended: a load
/// is busy until its drain ends, after the new version already answers,
/// and a swap the drill starts before then is refused with 409.
fn serving(repo: &TestRepo, version: u64) -> Server {
    let server = Server::start(bin(), repo.root(), &[]);
    server.wait_settled("m", version);
    server
}

/// What a drill left behind.
struct Outcome {
    status: ExitStatus,
    report: Value,
    svg: String,
    stdout: String,
    stderr: String,
}

/// Closed loop, two workers.
const TWO: [&str; 2] = ["--concurrency", "2"];

/// Runs `baton drill m` with short timings plus `args`; the run is bounded
/// (a safety net, not a speed requirement).
fn drill(url: &str, args: &[&str]) -> Outcome {
    let out = tempfile::tempdir().expect("a temp dir");
    let (json, svg) = (out.path().join("drill.json"), out.path().join("drill.svg"));
    let mut child = Command::new(bin())
        .args([
            "drill",
            "m",
            "--url",
            url,
            "--warmup",
            "500ms",
            "--swap-interval",
            "600ms",
            "--tail",
            "500ms",
            "--json",
        ])
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting baton drill");
    let started = Instant::now();
    while child.try_wait().expect("waiting for the drill").is_none() {
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("baton drill did not stop by itself");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("the drill's output");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path).unwrap_or_else(|e| {
            panic!("{} was not written ({e})\nstdout:\n{stdout}\nstderr:\n{stderr}", path.display())
        })
    };
    let report: Value = serde_json::from_str(&read(&json)).expect("the report is JSON");
    let svg = read(&svg);
    Outcome { status: output.status, report, svg, stdout, stderr }
}

impl Outcome {
    fn context(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
    }

    /// The versions that answered, as strings.
    fn versions(&self) -> Vec<String> {
        let mut v: Vec<String> = self.report["versions"]
            .as_array()
            .expect("a versions list")
            .iter()
            .map(|v| v["version"].as_str().expect("a version").to_owned())
            .collect();
        v.sort();
        v
    }

    /// Asserts the verdict is clean: no failure, `swaps` swaps each served
    /// with a time to serve, the versions they name, nothing unexpected.
    fn assert_clean(&self, swaps: usize, expected: &[&str]) {
        let r = &self.report;
        let ctx = self.context();
        assert!(self.status.success(), "exit {:?}\n{ctx}", self.status);
        assert_eq!(r["failed"], 0, "{ctx}");
        assert!(r["requests"].as_u64().unwrap() > 0, "{ctx}");
        let made = r["swaps"].as_array().expect("a swaps list");
        assert_eq!(made.len(), swaps, "{ctx}");
        for (i, s) in made.iter().enumerate() {
            assert_eq!(s["action_ok"], true, "swap {i}: {s}");
            assert_eq!(s["served"], true, "swap {i}: {s}");
            assert!(s["time_to_serve_ms"].as_f64().is_some_and(|t| t >= 0.0), "swap {i}: {s}");
            assert!(s["window_end_s"].as_f64() > s["trigger_s"].as_f64(), "swap {i}: {s}");
        }
        // The window splits at each commit, and the two parts add up.
        let parts = ["in_swaps_loading", "in_swaps_after_commit"].map(|k| r[k]["requests"].as_u64().unwrap());
        assert_eq!(parts[0] + parts[1], r["in_swaps"]["requests"].as_u64().unwrap(), "{ctx}");
        assert!(parts[1] > 0, "no request after a commit: {ctx}");
        assert!(self.stdout.contains("trigger to commit") && self.stdout.contains("after commit"), "{ctx}");
        assert_eq!(r["unexpected"]["total"], 0, "{ctx}");
        assert_eq!(r["verdict"]["clean"], true, "{ctx}");
        assert_eq!(self.versions(), expected, "{ctx}");
        assert!(r["series"]["points"].as_array().is_some_and(|p| !p.is_empty()), "{ctx}");
        let windows = r["windows"].as_array().expect("windows");
        assert_eq!(windows.iter().filter(|w| w["kind"] == "swap").count(), swaps, "{ctx}");
        self.assert_chart(swaps);
    }

    /// The chart is one SVG element with a band per swap.
    fn assert_chart(&self, swaps: usize) {
        let svg = self.svg.trim();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"), "not an SVG document");
        assert_eq!(svg.matches("<svg").count(), 1);
        for i in 1..=swaps {
            assert!(svg.contains(&format!("class=\"swap-window\" data-swap=\"{i}\"")), "no band for swap {i}");
        }
        assert_eq!(svg.matches("class=\"swap-window\"").count(), swaps);
        assert!(svg.contains("latency (ms, log scale)") && svg.contains("time since the load started (s)"));
    }
}

#[test]
fn swaps_through_the_load_api_alternating_versions_fail_nothing() {
    let repo = repo(&[1, 2]);
    let server = serving(&repo, 2);
    let pid = server.pid().to_string();
    let outcome = drill(
        server.base(),
        &[&TWO[..], &["--swaps", "3", "--swap", "load-api", "--versions", "1,2,1", "--pid", &pid]].concat(),
    );
    outcome.assert_clean(3, &["1", "2"]);
    let swaps = outcome.report["swaps"].as_array().unwrap();
    let went: Vec<(&str, &str)> =
        swaps.iter().map(|s| (s["previous"].as_str().unwrap(), s["version"].as_str().unwrap())).collect();
    assert_eq!(went, [("2", "1"), ("1", "2"), ("2", "1")]);
    let rss = &outcome.report["rss"];
    assert!(rss["samples"].as_array().is_some_and(|s| s.len() > 2), "{rss}");
    assert_eq!(rss["before_swaps"].as_array().map(Vec::len), Some(3), "{rss}");
    assert!(rss["growth_per_swap_bytes"].is_number(), "{rss}");
    assert!(outcome.svg.contains("server RSS (MiB)"));
    assert!(outcome.stdout.contains("verdict: clean"), "{}", outcome.stdout);
    assert!(outcome.stderr.contains("baton drill: m @"), "{}", outcome.stderr);
}

/// Against a server whose management needs a token, the load API's swaps
/// carry the one the drill is given, and fail (401) without it.
#[test]
fn load_api_swaps_carry_the_admin_token() {
    let repo = repo(&[1, 2]);
    let dir = tempfile::tempdir().expect("a temp dir");
    let token = dir.path().join("token");
    std::fs::write(&token, "drill-secret\n").expect("writing the token file");
    let token = token.to_str().expect("a UTF-8 path");
    let server = Server::start(bin(), repo.root(), &["--admin-token-file", token]);
    server.wait_settled("m", 2);
    let swap = ["--swaps", "1", "--swap", "load-api", "--versions", "1"];
    let refused = drill(server.base(), &[&TWO[..], &swap].concat());
    assert_eq!(refused.report["swaps"][0]["action_ok"], false, "{}", refused.context());
    let detail = refused.report["swaps"][0]["action_detail"].to_string();
    assert!(detail.contains("HTTP 401"), "{detail}");
    let outcome = drill(server.base(), &[&TWO[..], &swap, &["--token-file", token]].concat());
    outcome.assert_clean(1, &["1", "2"]);
}

#[test]
fn a_swap_gap_keeps_steady_time_between_a_window_and_the_next_trigger() {
    let repo = repo(&[1, 2]);
    let server = serving(&repo, 2);
    // The drill's interval is 600 ms and a window ends 250 ms after a
    // commit, so without the gap a trigger would come well under a second
    // after the previous window's end.
    let outcome =
        drill(server.base(), &[&TWO[..], &["--swaps", "3", "--versions", "1,2", "--swap-gap", "1s"]].concat());
    outcome.assert_clean(3, &["1", "2"]);
    assert_eq!(outcome.report["config"]["swap_gap_s"], 1.0, "{}", outcome.report["config"]);
    let swaps = outcome.report["swaps"].as_array().unwrap();
    for pair in swaps.windows(2) {
        let (end, next) = (pair[0]["window_end_s"].as_f64().unwrap(), pair[1]["trigger_s"].as_f64().unwrap());
        assert!(next >= end + 1.0, "swap {} triggered {:.3} s after the previous window", pair[1]["index"], next - end);
    }
    // Steady requests come from the gaps too, not only before the first
    // swap and after the last.
    let (first, last) = (swaps[0]["trigger_s"].as_f64().unwrap(), swaps[2]["window_end_s"].as_f64().unwrap());
    let bucket = outcome.report["series"]["bucket_ms"].as_f64().unwrap() / 1000.0;
    let points = outcome.report["series"]["points"].as_array().unwrap();
    let steady_between = points.iter().any(|p| {
        let t = p["t_s"].as_f64().unwrap();
        t > first
            && t < last
            && p["requests"].as_u64().unwrap() > 0
            && swaps.iter().all(|s| {
                let (a, b) = (s["trigger_s"].as_f64().unwrap(), s["window_end_s"].as_f64().unwrap());
                t + bucket <= a || t >= b
            })
    });
    assert!(steady_between, "no steady stretch between the swaps: {}", outcome.context());
}

#[test]
fn the_stall_probe_splits_its_late_wakes_between_steady_time_and_swap_windows() {
    let repo = repo(&[1, 2]);
    let server = serving(&repo, 2);
    // A lateness of 0 counts every wake, so every sleep of the load's time
    // must be in one of the two kinds of time.
    let outcome =
        drill(server.base(), &[&TWO[..], &["--swaps", "2", "--versions", "1,2", "--stall-probe", "0ms"]].concat());
    outcome.assert_clean(2, &["1", "2"]);
    let st = &outcome.report["stalls"];
    let (steady, swaps) = (&st["steady"], &st["in_swaps"]);
    let counted = steady["count"].as_u64().unwrap() + swaps["count"].as_u64().unwrap();
    let sleeps = st["sleeps"].as_u64().unwrap();
    assert!(counted > 0 && counted <= sleeps, "{counted} late wakes of {sleeps} sleeps: {st}");
    assert!(swaps["count"].as_u64().unwrap() > 0 && swaps["seconds"].as_f64().unwrap() > 0.0, "{st}");
    let seconds = steady["seconds"].as_f64().unwrap() + swaps["seconds"].as_f64().unwrap();
    let duration = outcome.report["duration_s"].as_f64().unwrap();
    assert!((seconds - duration).abs() < 1e-6, "{seconds} s split of a {duration} s load");
    // One probe per CPU, each sleeping at least a millisecond at a time: no
    // more than a thousand sleeps a second each.
    let cpus = st["cpus"].as_u64().unwrap();
    assert!(cpus >= 1, "{st}");
    assert!(
        sleeps as f64 <= cpus as f64 * (duration * 1000.0 + 1000.0),
        "{sleeps} sleeps of {cpus} probes in {duration} s"
    );
    assert!(st["realtime"].is_boolean() && st["worst"].as_array().is_some_and(|w| !w.is_empty()), "{st}");
    assert!(outcome.stdout.contains("machine stalls ("), "{}", outcome.stdout);
    // The slowest requests of each kind, slowest first, the first of them
    // the kind's maximum, each with no more stalled time than its latency.
    for (kind, stats) in [("slowest_steady", "steady"), ("slowest_in_swaps", "in_swaps")] {
        let slowest = st[kind].as_array().unwrap();
        assert!(!slowest.is_empty() && slowest.len() <= 5, "{kind}: {st}");
        let latency: Vec<f64> = slowest.iter().map(|r| r["latency_ms"].as_f64().unwrap()).collect();
        assert!(latency.windows(2).all(|w| w[0] >= w[1]), "{kind} not slowest first: {latency:?}");
        assert_eq!(latency[0], outcome.report[stats]["max_ms"].as_f64().unwrap(), "{kind}");
        assert!(slowest.iter().all(|r| r["stalled_ms"].as_f64().unwrap() <= r["latency_ms"].as_f64().unwrap()), "{st}");
    }
    assert!(outcome.stdout.contains("slowest in swap windows, ms"), "{}", outcome.stdout);
}

#[test]
fn publishing_version_directories_fails_nothing() {
    let repo = repo(&[1]);
    let server = serving(&repo, 1);
    let root = repo.root().to_str().expect("a UTF-8 path");
    let outcome = drill(server.base(), &[&TWO[..], &["--swaps", "3", "--swap", "publish", "--repo", root]].concat());
    outcome.assert_clean(3, &["1", "2", "3", "4"]);
    let brought: Vec<&str> =
        outcome.report["swaps"].as_array().unwrap().iter().map(|s| s["version"].as_str().unwrap()).collect();
    assert_eq!(brought, ["2", "3", "4"]);
    for v in 2..=4 {
        assert!(baton_core::files::manifest::verify(&repo.version_dir("m", v)).is_ok(), "version {v} is not sealed");
    }
    // No --pid: the memory sampled is the server's own, the pid its status reports.
    assert_eq!(outcome.report["rss"]["pid"], server.pid(), "{}", outcome.report["rss"]);
    assert_eq!(outcome.report["config"]["pid_from"], "status");
    assert!(outcome.report["rss"]["samples"].as_array().is_some_and(|s| s.len() > 2));
    assert!(outcome.report["stalls"].is_null(), "no --stall-probe, no probe");
}

#[test]
fn a_shell_command_per_swap_over_grpc_json_fails_nothing() {
    let repo = repo(&[1, 2]);
    let server = serving(&repo, 2);
    let command =
        format!("'{}' load {{model}} --version {{version}} --url {{url}} && echo swap {{n}}", bin().display());
    let grpc_url = server.grpc_url();
    let args = ["--swaps", "2", "--swap", "command", "--command", &command, "--versions", "1,2"];
    let outcome = drill(server.base(), &[&args[..], &TWO, &["--protocol", "grpc", "--grpc-url", &grpc_url]].concat());
    outcome.assert_clean(2, &["1", "2"]);
    let said = outcome.report["swaps"][1]["action_detail"].as_str().unwrap_or_default();
    assert!(said.contains("version 2 serving") && said.ends_with("swap 2"), "{said}");
    let json = drill(server.base(), &[&args[..], &["--protocol", "http-json", "--rate", "200"]].concat());
    json.assert_clean(2, &["1", "2"]);
    assert_eq!(json.report["config"]["mode"]["loop"], "open");
}

#[test]
fn upgrades_under_the_drill_fail_nothing_and_report_the_handover_and_both_processes_memory() {
    let repo = repo(&[1]);
    let mut server = serving(&repo, 1);
    let args = ["--swaps", "2", "--swap", "upgrade", "--rss-interval", "5ms"];
    let outcome = drill(server.base(), &[&args[..], &TWO].concat());
    let (r, ctx) = (&outcome.report, outcome.context());
    let made = r["swaps"].as_array().expect("a swaps list");
    // Stop the last process whatever else the report says.
    let last = made.last().and_then(|s| s["handover"]["new_pid"].as_u64());
    let _last = last.map(|pid| common::upgrade::Adopted(pid as u32));
    assert!(outcome.status.success(), "exit {:?}\n{ctx}", outcome.status);
    assert_eq!((r["failed"].as_u64(), r["verdict"]["clean"].as_bool()), (Some(0), Some(true)), "{ctx}");
    assert_eq!(made.len(), 2, "{ctx}");
    let mut pids = vec![u64::from(server.pid())];
    for s in made {
        let handover = &s["handover"];
        assert_eq!(s["action_ok"], true, "{s}");
        assert_eq!(handover["old_pid"].as_u64(), pids.last().copied(), "{s}");
        let (ready, exit) = (handover["ready_ms"].as_f64().unwrap(), handover["old_exit_ms"].as_f64().unwrap());
        assert!(ready > 0.0 && exit >= ready, "{s}");
        pids.push(handover["new_pid"].as_u64().unwrap());
    }
    assert!(outcome.stdout.contains("the old one exited after"), "{ctx}");
    // The memory followed the server through both upgrades, and while both
    // processes lived it counted both.
    let rss = &r["rss"];
    assert_eq!(rss["pids"], serde_json::json!(pids), "{ctx}");
    assert!(rss["stopped"].is_null(), "{rss}");
    let (before, peaks) = (rss["before_swaps"].as_array().unwrap(), rss["peak_during_swaps"].as_array().unwrap());
    for (before, peak) in before.iter().zip(peaks) {
        assert!(peak.as_u64() > before.as_u64(), "a handover's peak is above the memory before it: {rss}");
    }
    server.wait_exit();
}

#[test]
fn a_drill_against_nothing_reports_the_failures_and_exits_1() {
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let url = format!("http://127.0.0.1:{port}");
    let outcome = drill(&url, &[&TWO[..], &["--input", "input:FP32:1,8", "--swaps", "1", "--duration", "2s"]].concat());
    let r = &outcome.report;
    assert_eq!(outcome.status.code(), Some(1), "{}", outcome.context());
    assert!(r["requests"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["failed"], r["requests"]);
    assert_eq!(r["errors"][0]["kind"], "connect", "{}", r["errors"]);
    assert_eq!(r["swaps"][0]["action_ok"], false);
    assert_eq!(r["verdict"]["clean"], false);
    assert!(outcome.stdout.contains("verdict: NOT clean"), "{}", outcome.stdout);
    // Nothing there reports a pid: the drill runs without RSS and says so.
    assert!(r["rss"].is_null(), "{}", r["rss"]);
    assert!(outcome.stdout.contains("RSS not reported: the server does not report its pid"), "{}", outcome.stdout);
    assert!(r["config"]["rss_not_reported"].as_str().is_some_and(|w| w.contains("give --pid")), "{}", r["config"]);
    outcome.assert_chart(1);
}

/// Python's own `http.server` serving `dir` on a free loopback port: a
/// server that is not baton. `before` gets its pid before it answers.
fn static_server(dir: &std::path::Path, before: impl FnOnce(u32)) -> (common::Reaper, String) {
    let mut python = Command::new("python3")
        .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting python3 -m http.server");
    before(python.id());
    let mut first = String::new();
    let stdout = python.stdout.take().expect("piped stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut first).expect("its first line");
    let reaper = common::Reaper(Some(python));
    let port = first.split(" port ").nth(1).and_then(|r| r.split_whitespace().next()).expect("a port");
    (reaper, format!("http://127.0.0.1:{port}"))
}

/// A server that is not baton (Python's own HTTP server, which answers 404
/// to baton's status and 501 to every POST): the drill runs, without RSS,
/// and says why.
#[test]
fn a_drill_against_a_server_that_is_not_baton_runs_without_rss_and_says_why() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (_python, url) = static_server(dir.path(), |_| ());
    let outcome = drill(&url, &[&TWO[..], &["--input", "input:FP32:1,8", "--swaps", "0", "--duration", "1s"]].concat());
    assert_eq!(outcome.status.code(), Some(1), "{}", outcome.context());
    assert!(outcome.report["rss"].is_null(), "{}", outcome.report["rss"]);
    let said =
        format!("RSS not reported: the server does not report its pid (GET {url}/baton/v1/status answered HTTP 404");
    assert!(outcome.stdout.contains(&said) && outcome.stdout.contains("give --pid."), "{}", outcome.context());
    assert!(outcome.stderr.contains(&said), "{}", outcome.context());
}

#[test]
fn a_pid_that_names_another_process_here_is_not_sampled() {
    // A server in a container reports its pid there; here that number is
    // another process. The status's start time tells them apart.
    let dir = tempfile::tempdir().expect("a temp dir");
    let (python, url) = static_server(dir.path(), |pid| {
        std::fs::create_dir_all(dir.path().join("baton/v1")).expect("a status directory");
        let status = serde_json::json!({ "pid": pid, "process_started": 1 });
        std::fs::write(dir.path().join("baton/v1/status"), status.to_string()).expect("a status");
    });
    let pid = python.0.as_ref().map(std::process::Child::id).expect("the server's process");
    let outcome = drill(&url, &[&TWO[..], &["--input", "input:FP32:1,8", "--swaps", "0", "--duration", "1s"]].concat());
    assert!(outcome.report["rss"].is_null(), "{}", outcome.report["rss"]);
    let said = format!("RSS not reported: the server reports pid {pid}, but this host's process {pid} is another one");
    assert!(outcome.stdout.contains(&said), "{}", outcome.context());
}

#[test]
fn a_drill_that_cannot_start_says_why_and_exits_2() {
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let run = |args: &[&str]| {
        let output = Command::new(bin()).arg("drill").args(args).output().expect("running baton drill");
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let (code, err) = run(&["m", "--url", &format!("http://127.0.0.1:{port}"), "--quiet"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("metadata") && err.contains("--input"), "{err}");
    let (code, err) = run(&["m", "--url", "http://192.0.2.1:8000", "--input", "x:FP32:1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--allow-remote"), "{err}");
    let (code, err) = run(&["m", "--swap", "publish", "--input", "x:FP32:1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--repo"), "{err}");
}

#[test]
fn a_refused_version_is_a_failed_swap_while_the_old_one_keeps_serving() {
    let repo = repo(&[1, 2]);
    repo.publish_damaged("m", 3, &mlp(3), Damage::FlipByte);
    let server = serving(&repo, 2);
    let outcome = drill(server.base(), &[&TWO[..], &["--swaps", "1", "--versions", "3"]].concat());
    let r = &outcome.report;
    assert_eq!(outcome.status.code(), Some(1), "{}", outcome.context());
    assert_eq!(r["failed"], 0, "{}", outcome.context());
    assert_eq!(outcome.versions(), ["2"]);
    let swap = &r["swaps"][0];
    assert_eq!(swap["action_ok"], false, "{swap}");
    assert!(swap["action_detail"].as_str().is_some_and(|d| d.contains("HTTP 422")), "{swap}");
    let problems = r["verdict"]["problems"].to_string();
    assert!(problems.contains("swap 1: the action failed"), "{problems}");
}

/// The drill's options for a canary of `version` through the rollout API,
/// steps 50 % and 100 % of 300 ms each, guarded by `guards`.
fn canary<'a>(version: &'a str, guards: &'a str) -> [&'a str; 14] {
    [
        "--swap",
        "rollout",
        "--rollout-version",
        version,
        "--rollout-mode",
        "canary",
        "--rollout-steps",
        "50,100",
        "--rollout-interval",
        "300ms",
        "--rollout-guards",
        guards,
        "--duration",
        "60s",
    ]
}

/// A rollout under fire whose candidate drifts (other weights than the
/// stable version's): the drill starts it through the rollout API, follows
/// it until the guards roll it back, and reports the phases, the decisions
/// with the drift they measured, and how long the candidate lasted after
/// the failing window. No request fails.
#[test]
fn a_rollout_drill_reports_the_rollback_of_a_drifting_candidate() {
    let (stable, drifting) = (Mlp::new(&[8, 16, 1], 1), Mlp::new(&[8, 16, 1], 2));
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&stable, ""));
    repo.publish_mlp("m", 1, &stable);
    let server = Server::start(bin(), repo.root(), &["--no-watch"]);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &drifting);
    let guards = r#"{"min_samples": 20, "max_rel_l2": 0.05}"#;
    let outcome = drill(server.base(), &[&TWO[..], &canary("2", guards)].concat());
    let (r, ctx) = (&outcome.report, outcome.context());
    assert!(outcome.status.success(), "exit {:?}\n{ctx}", outcome.status);
    assert_eq!(r["failed"], 0, "{ctx}");
    let rollout = &r["rollout"];
    assert_eq!(rollout["started"], true, "{rollout}");
    assert_eq!((rollout["stable"].clone(), rollout["candidate"].clone()), (1.into(), 2.into()), "{rollout}");
    assert_eq!(rollout["outcome"], "rolled_back", "{rollout}");
    // The decisions: the start, then the rollback on a window whose drift
    // went over its threshold with enough samples.
    let decisions = rollout["decisions"].as_array().expect("decisions");
    assert_eq!(decisions.first().map(|d| &d["action"]), Some(&"started".into()), "{rollout}");
    let back = decisions.last().expect("a decision");
    assert_eq!(back["action"], "rolled_back", "{back}");
    let drift = back["verdict"]["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["guard"].as_str().is_some_and(|g| g.starts_with("rel_l2"))))
        .expect("a drift check");
    assert!(drift["value"].as_f64() > drift["threshold"].as_f64(), "{drift}");
    assert!(drift["samples"].as_u64().is_some_and(|s| s >= 20), "{drift}");
    // The phases: stable alone before, both at the step.
    let phases = rollout["phases"].as_array().expect("phases");
    let names: Vec<&str> = phases.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["before", "step 1 (50%)", "after rolled_back"], "{rollout}");
    let roles = |p: &Value| -> Vec<String> {
        p["roles"].as_array().unwrap().iter().map(|s| s["role"].as_str().unwrap().to_owned()).collect()
    };
    // Before the start, stable answers. A request the drill stamped just
    // before the start's decision but that reached the server after the
    // candidate's store is answered by the candidate: a handful at most.
    assert_eq!(roles(&phases[0]).first().map(String::as_str), Some("stable"), "{}", phases[0]);
    let early = phases[0]["roles"].as_array().unwrap().iter().find(|s| s["role"] == "candidate");
    assert!(early.is_none_or(|s| s["share"].as_f64() < Some(0.01)), "{}", phases[0]);
    assert_eq!(roles(&phases[1]), ["stable", "candidate"], "{}", phases[1]);
    assert!(phases.iter().all(|p| p["stats"]["failed"] == 0 && p["stats"]["requests"].as_u64() > Some(0)), "{rollout}");
    // The rollback's timing, measured: the decision, the candidate's last
    // answer and the server's store of its weight 0, each from the end of
    // the failing window; nothing the candidate answered started after that store.
    let timing = &rollout["rollback"];
    assert!(timing["decided_ms"].as_f64().is_some_and(|t| t >= 0.0), "{timing}");
    assert!(timing["last_candidate_answer_ms"].is_number(), "{timing}");
    assert!(timing["weight_zero_ms"].as_f64().is_some_and(|t| t >= 0.0), "{timing}");
    assert_eq!(timing["candidate_answers_started_after_weight_zero"], 0, "{timing}");
    assert!(outcome.stdout.contains("rollback: window ended"), "{}", outcome.stdout);
    assert!(outcome.stdout.contains("answers by role"), "{}", outcome.stdout);
}

/// `baton drill` follows a canary that moves a model from the server's
/// process into a worker process and one that moves it back: both
/// candidates equal the stable version, so both are promoted, no request
/// fails, and the status names each version's kind of update and why.
#[test]
fn a_canary_into_a_worker_process_and_back_passes_the_drill_with_no_failed_request() {
    let repo = repo(&[1]);
    let server = Server::start(bin(), repo.root(), &["--no-watch"]);
    server.wait_settled("m", 1);
    let guards = r#"{"min_samples": 20, "max_rel_l2": 0.05, "max_p99_ratio": 100}"#;
    // No watch after a promotion: the next rollout starts at once.
    let watch = "[rollout]\nwatch_ms = 0\n";
    for (version, engine, update, reason) in [
        (2, "[engine]\nisolation = \"process\"\nsessions = 1\n", "runtime", "operator_choice"),
        (3, "", "graph", "new_graph"),
    ] {
        repo.add_model("m", &mlp_toml(&mlp(1), &format!("{engine}{watch}")));
        repo.publish_mlp("m", version, &mlp(1));
        let outcome = drill(server.base(), &[&TWO[..], &canary(&version.to_string(), guards)].concat());
        let (r, ctx) = (&outcome.report, outcome.context());
        assert!(outcome.status.success(), "exit {:?}\n{ctx}", outcome.status);
        assert_eq!(r["failed"], 0, "{ctx}");
        assert_eq!(r["rollout"]["outcome"], "promoted", "{}", r["rollout"]);
        let status = server.status("m");
        let live = status["live"].as_array().expect("live versions");
        let serving = live.iter().find(|l| l["version"] == version).expect("the promoted version is live");
        assert_eq!((serving["update"].as_str(), serving["update_reason"].as_str()), (Some(update), Some(reason)));
        assert_eq!(serving["worker"].is_object(), update == "runtime", "{serving}");
    }
}
