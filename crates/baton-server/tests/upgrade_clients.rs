//! Upgrades seen by real clients: NVIDIA's tritonclient over HTTP
//! keep-alive, gRPC unary calls and a gRPC stream, and `perf_analyzer` over
//! HTTP and gRPC, all sending throughout two upgrades in a row, the first
//! to a second, different binary and the second back to the binary under
//! test. No request fails and no connection is refused; the server's
//! reported version follows the binaries.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use baton_testkit::server::{Client, eventually};
use common::repo_with;
use common::upgrade::{Adopted, Installed, gone, stamped, upgrade};
use serde_json::{Value, json};

/// `perf_analyzer` sending to model `m` at concurrency 1 over `protocol`,
/// for three windows of 5 s (longer than two upgrades of this model take),
/// its output in `dir`.
struct PerfAnalyzer {
    child: Child,
    output: PathBuf,
}

impl PerfAnalyzer {
    fn start(dir: &Path, protocol: &str, address: &str) -> PerfAnalyzer {
        let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.baton/bin/perf_analyzer");
        assert!(bin.exists(), "{} is missing; run scripts/setup-clients.sh", bin.display());
        let output = dir.join(format!("perf-{protocol}.txt"));
        let file = std::fs::File::create(&output).expect("perf_analyzer's output file");
        let child = Command::new(bin)
            .args(["-m", "m", "-u", address, "-i", protocol, "-b", "1", "--concurrency-range", "1"])
            .args(["--measurement-mode", "time_windows", "-p", "5000", "-s", "100", "-r", "10"])
            .stdout(file.try_clone().expect("a second handle"))
            .stderr(file)
            .spawn()
            .expect("starting perf_analyzer");
        PerfAnalyzer { child, output }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }

    /// Whether it still runs.
    fn running(&mut self) -> bool {
        self.child.try_wait().expect("perf_analyzer's status").is_none()
    }

    /// Waits for it to finish, and returns whether it succeeded and what it printed.
    fn finish(mut self) -> (bool, String) {
        let status = self.child.wait().expect("waiting for perf_analyzer");
        (status.success(), self.text())
    }
}

impl Drop for PerfAnalyzer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The tritonclient script (tests/clients/through.py): sends until its
/// input closes, then prints what it saw.
struct Tritonclient {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Tritonclient {
    fn start(http: &str, grpc: &str) -> Tritonclient {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/through.py");
        let mut child = Command::new(common::client_python())
            .arg(script)
            .args([http, grpc, "m"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the tritonclient script");
        let stdin = child.stdin.take();
        let mut first = String::new();
        let stdout = child.stdout.as_mut().expect("the script's output");
        BufReader::new(stdout).read_line(&mut first).expect("the script's first line");
        assert_eq!(first.trim(), "sending", "the script did not start sending");
        Tritonclient { child, stdin }
    }

    /// Closes its input, and returns what it printed.
    fn finish(mut self) -> Value {
        drop(self.stdin.take());
        let mut text = String::new();
        let stdout = self.child.stdout.as_mut().expect("the script's output");
        std::io::Read::read_to_string(stdout, &mut text).expect("the script's output");
        let status = self.child.wait().expect("waiting for the script");
        assert!(status.success(), "the tritonclient script failed ({status}): {text}");
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("the script printed {text:?}: {e}"))
    }
}

impl Drop for Tritonclient {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.flush();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Puts `binary` at the server's executable path, upgrades the server at
/// `base`, waits for the old process to exit, and returns the new process.
fn upgrade_to(base: &str, installed: &Installed, binary: &[u8], old: u32) -> Adopted {
    installed.replace(binary);
    let answer = upgrade(base, b"{}");
    assert_eq!(answer.status, 200, "{}", common::text(&answer.body));
    assert_eq!(answer.json()["old_pid"].as_u64(), Some(u64::from(old)));
    let new = Adopted(answer.json()["new_pid"].as_u64().expect("the new pid") as u32);
    eventually("the old process to exit", || gone(old).then_some(()));
    new
}

#[test]
fn tritonclient_and_perf_analyzer_see_no_failure_through_upgrades_between_two_binaries() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let installed = Installed::new();
    let (first, second) = (std::fs::read(&installed.path).expect("the binary"), stamped("second"));
    let repo = repo_with("m", &[1], "");
    let server = installed.start(&repo, &[]);
    server.wait_serving("m", 1);
    let (http, grpc) = (server.base().trim_start_matches("http://").to_owned(), server.grpc_address().to_owned());
    let version_of_server =
        || Client::new(server.base()).get("/v2").json()["version"].as_str().unwrap_or("").to_owned();
    let first_version = version_of_server();

    let mut perf: Vec<PerfAnalyzer> =
        [("http", &http), ("grpc", &grpc)].into_iter().map(|(p, a)| PerfAnalyzer::start(dir.path(), p, a)).collect();
    for p in &perf {
        eventually("perf_analyzer to start sending", || p.text().contains("Request concurrency").then_some(()));
    }
    let clients = Tritonclient::start(&http, &grpc);

    let middle = upgrade_to(server.base(), &installed, &second, server.pid());
    assert_eq!(version_of_server(), format!("{first_version}+second"), "the second binary answers");
    let last = upgrade_to(server.base(), &installed, &first, middle.0);
    assert_eq!(version_of_server(), first_version, "the first binary answers again");
    for p in &mut perf {
        assert!(p.running(), "perf_analyzer finished before the upgrades did:\n{}", p.text());
    }

    let seen = clients.finish();
    for way in ["http", "grpc", "grpc_stream"] {
        let failed = seen[way]["failed"].as_array().unwrap_or_else(|| panic!("no {way} in {seen}"));
        assert!(failed.is_empty(), "{way}: {} failed: {:?}", failed.len(), &failed[..failed.len().min(5)]);
        assert!(seen[way]["answered"].as_u64() > Some(10), "{way}: {seen}");
        assert_eq!(seen[way]["versions"], json!(["1"]), "{way}: {seen}");
    }
    for p in perf {
        let (succeeded, text) = p.finish();
        assert!(succeeded && text.contains("Throughput:"), "perf_analyzer failed:\n{text}");
    }
    assert!(!gone(last.0), "the last process serves");
    eprintln!("tritonclient through two upgrades: {seen}");
}
