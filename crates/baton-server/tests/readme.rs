//! The README's five-minute walkthrough, run as written on a host with two
//! baton servers: the demo server (`baton serve` with no repository,
//! started in a scratch directory, as `scripts/demo.sh` runs it) and
//! another one. Only the binary's path and the port change: the commands
//! are read from README.md, so the README cannot drift from what baton
//! does.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_testkit::server::{PATIENCE, eventually};
use common::{Reaper, bin, repo_with, start};
use serde_json::Value;

/// The shell block under "A five-minute walkthrough".
fn walkthrough() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
        .expect("reading README.md");
    let section = readme.split("## A five-minute walkthrough").nth(1).expect("the walkthrough section");
    let block = section.split("```sh\n").nth(1).expect("its shell block");
    block.split("\n```").next().expect("the end of the block").to_owned()
}

/// Starts the demo server as `scripts/demo.sh` does (no --repo: it
/// generates `.baton/demo` in `dir`) on a free port; returns it and its
/// REST address.
fn demo_server(dir: &Path) -> (Reaper, String) {
    let mut child = Command::new(bin())
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .current_dir(dir)
        .env_remove("BATON_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("demo.log")).expect("a log file"))
        .spawn()
        .expect("starting the demo server");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let server = Reaper(Some(child));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("reading the demo server's first line");
    let address = common::listening_address(&line);
    // The rest of its stdout is drained, so that it never blocks on a full pipe.
    std::thread::spawn(move || for _ in stdout.lines() {});
    (server, address)
}

#[test]
fn the_readme_walkthrough_runs_as_written_beside_a_second_server() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let (demo, address) = demo_server(dir.path());
    let demo_pid = demo.0.as_ref().expect("the demo server").id();
    // The walkthrough begins once the demo serves, as a reader's would.
    let client = baton_testkit::server::Client::new(&format!("http://{address}"));
    eventually("the demo to serve ranker", || (client.get("/v2/models/ranker/ready").status == 200).then_some(()));
    // A second baton server on the same host: `pgrep -f 'baton serve'`
    // finds two, and every command must still reach the right one.
    let other_repo = repo_with("other", &[1], "");
    let other = start(&other_repo, &[]);
    other.wait_ready();

    let port = address.rsplit(':').next().expect("a port");
    let script = walkthrough().replace("target/release/baton", &bin().display().to_string()).replace("8000", port);
    // The harness's part: stop `baton events &` when the script ends.
    let script = format!("set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}\n");
    let mut child = Command::new("bash")
        .args(["-c", &script])
        .current_dir(dir.path())
        .env("BATON_URL", format!("http://{address}"))
        .env_remove("BATON_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running the walkthrough");
    // Read as it runs, so that neither pipe fills.
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let stdout = std::thread::spawn(move || std::io::read_to_string(out).unwrap_or_default());
    let stderr = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let mut script_run = Reaper(Some(child));
    // A bound, not a speed requirement: the drill alone runs 10 s.
    let deadline = Instant::now() + PATIENCE * 4;
    let status = loop {
        if let Some(status) = script_run.0.as_mut().and_then(|c| c.try_wait().expect("waiting")) {
            break status;
        }
        assert!(Instant::now() < deadline, "the walkthrough did not finish");
        std::thread::sleep(Duration::from_millis(50));
    };
    script_run.0 = None;
    let (stdout, stderr) = (stdout.join().expect("stdout"), stderr.join().expect("stderr"));
    let log = std::fs::read_to_string(dir.path().join("demo.log")).unwrap_or_default();
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}\ndemo server's log:\n{log}");
    assert!(status.success(), "the walkthrough failed ({status:?})\n{context}");

    // Each step said what it did.
    for said in [
        "\"model_version\":\"1\"",
        "Wrote .baton/demo/models/ranker/2/MANIFEST",
        "ranker  READY  2",
        "rollback ranker: version 1 serving (was 2)",
        "held at version 1 (recorded by the rollback) until a version newer than 2 is published",
        "WARNING: ranker went back to its newest version, 2, in place of 1",
        "load ranker: version 1 serving (was 2)",
        "held at version 1 (recorded by the load) until a version newer than 2 is published",
        "verdict: clean",
    ] {
        assert!(stdout.contains(said), "the walkthrough did not print {said:?}\n{context}");
    }
    assert!(!stdout.contains("RSS not reported"), "{context}");
    // The drill sampled the demo server's memory, not the other server's.
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("drill.json")).expect("drill.json"))
            .expect("the drill's report");
    assert_eq!(report["rss"]["pid"], demo_pid, "{}", report["rss"]);
    assert_eq!(report["failed"], 0, "{context}");
    assert_eq!(other.get("/v2/health/ready").status, 200, "the other server serves on");
    drop(demo);
}
