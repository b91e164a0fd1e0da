//! Helpers shared by the black-box tests of the `baton` binary: starting it
//! on a test repository, sending KServe V2 inference requests, and checking
//! outputs against the reference forward pass.

#![allow(dead_code)]

pub mod conn;
pub mod grpc;
pub mod upgrade;

use std::path::Path;

use baton_core::tensors::tensor::Tensor;
use baton_testkit::onnx::Mlp;
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::{Answer, Server};
use serde_json::{Value, json};

/// The small MLP most tests serve: 8 features in, 2 scores out.
pub const SIZES: [usize; 3] = [8, 16, 2];

/// Largest difference allowed between a served output and `Mlp::forward`.
pub const TOLERANCE: f32 = 1e-5;

/// The binary under test.
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_baton"))
}

/// Starts `baton serve` on the repository (a free loopback port, polling every 50 ms).
pub fn start(repo: &TestRepo, args: &[&str]) -> Server {
    Server::start(bin(), repo.root(), args)
}

/// The MLP of a version: the same seed always gives the same weights, and
/// different versions give different outputs.
pub fn mlp(version: u64) -> Mlp {
    Mlp::new(&SIZES, 1000 + version)
}

/// A repository with model `name` whose `model.toml` fits [`SIZES`], plus
/// `extra` lines, and the given versions published.
pub fn repo_with(name: &str, versions: &[u64], extra: &str) -> TestRepo {
    let repo = TestRepo::new();
    repo.add_model(name, &mlp_toml(&mlp(1), extra));
    for &v in versions {
        repo.publish_mlp(name, v, &mlp(v));
    }
    repo
}

/// A JSON inference request with one flat FP32 input named `input`.
pub fn request(input: &[f32], batch: usize) -> Value {
    let width = input.len() / batch;
    json!({ "inputs": [{ "name": "input", "datatype": "FP32", "shape": [batch, width], "data": input }] })
}

/// The FP32 data of an output in a JSON response.
pub fn output_f32(body: &Value, name: &str) -> Vec<f32> {
    let outputs = body["outputs"].as_array().unwrap_or_else(|| panic!("no outputs in {body}"));
    let output = outputs.iter().find(|o| o["name"] == name).unwrap_or_else(|| panic!("no output {name} in {body}"));
    output["data"]
        .as_array()
        .unwrap_or_else(|| panic!("output {name} has no JSON data: {body}"))
        .iter()
        .map(|v| v.as_f64().expect("a number") as f32)
        .collect()
}

/// The version that answered a JSON response (`model_version`, a string).
pub fn version_of(body: &Value) -> u64 {
    body["model_version"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("model_version is not a version string: {body}"))
}

/// Posts a JSON inference request to `path`, asserts 200, and returns the
/// version that answered and the `output` data.
pub fn infer_at(server: &Server, path: &str, input: &[f32], batch: usize) -> (u64, Vec<f32>) {
    let answer = server.post_json(path, &request(input, batch));
    assert_eq!(answer.status, 200, "POST {path}: {}", String::from_utf8_lossy(&answer.body));
    let body = answer.json();
    (version_of(&body), output_f32(&body, "output"))
}

/// [`infer_at`] on the stable version of `model`.
pub fn infer(server: &Server, model: &str, input: &[f32], batch: usize) -> (u64, Vec<f32>) {
    infer_at(server, &format!("/v2/models/{model}/infer"), input, batch)
}

/// Asserts two output vectors agree within [`TOLERANCE`].
pub fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {} values, expected {}", got.len(), want.len());
    let diff = baton_testkit::max_diff(got, want);
    assert!(diff < TOLERANCE, "{what}: outputs differ from Mlp::forward by {diff}\n got {got:?}\nwant {want:?}");
}

/// Asserts an error answer: the status, and that the `error` message
/// contains every one of `needles`.
pub fn assert_error(answer: &Answer, status: u16, needles: &[&str], what: &str) {
    let body = String::from_utf8_lossy(&answer.body);
    assert_eq!(answer.status, status, "{what}: {body}");
    let message = answer.error();
    for needle in needles {
        assert!(message.contains(needle), "{what}: the error should mention {needle:?}: {message:?}");
    }
    assert!(answer.json()["kind"].as_str().is_some_and(|k| !k.is_empty()), "{what}: no kind in {body}");
}

/// A binary-tensor request (`Inference-Header-Content-Length` set) built
/// with the protocol crate; returns the body and the header value.
pub fn binary_request(inputs: &[Tensor], outputs: &[baton_protocol::RequestedOutput]) -> (Vec<u8>, String) {
    let encoded = baton_protocol::encode_request(inputs, true, outputs, None);
    let length = encoded.header_length.expect("a binary request has a header length");
    (encoded.body, length.to_string())
}

/// The JSON status of every model, `/baton/v1/status`.
pub fn server_status(server: &Server) -> Value {
    let answer = server.get("/baton/v1/status");
    assert_eq!(answer.status, 200);
    answer.json()
}

/// The rows of `POST /v2/repository/index` as (name, version, state, reason).
pub fn index(server: &Server, body: &Value) -> Vec<(String, String, String, String)> {
    let answer = server.post_json("/v2/repository/index", body);
    assert_eq!(answer.status, 200, "index: {}", String::from_utf8_lossy(&answer.body));
    answer
        .json()
        .as_array()
        .expect("the index is an array")
        .iter()
        .map(|row| {
            let text = |k: &str| row[k].as_str().unwrap_or_else(|| panic!("index row without {k}: {row}")).to_owned();
            (text("name"), text("version"), text("state"), text("reason"))
        })
        .collect()
}

/// The server's log without terminal colour codes.
pub fn plain_log(server: &Server) -> String {
    let log = server.log();
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Asserts the server never panicked.
pub fn assert_no_panic(server: &Server) {
    let log = server.log();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
}

/// The address in a line baton printed, e.g. `127.0.0.1:41236` from
/// `Listening on http://127.0.0.1:41236 (baton admin REST).`
pub fn listening_address(line: &str) -> String {
    line.split("://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned()
}

/// Runs `baton serve` on the repository (loopback ports) with `args`, which
/// must make it refuse to start; returns its exit status and stderr. Panics
/// if it is still running after [`PATIENCE`](baton_testkit::server::PATIENCE)
/// (after killing it).
pub fn refused_start(repo: &TestRepo, args: &[&str]) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(bin())
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--repo"])
        .arg(repo.root())
        .args(args)
        .env_remove("BATON_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting baton");
    let deadline = std::time::Instant::now() + baton_testkit::server::PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for baton") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("baton {args:?} kept running instead of refusing to start");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let mut stderr = String::new();
    child.stderr.take().expect("piped stderr").read_to_string(&mut stderr).expect("reading stderr");
    (status, stderr)
}

/// A file holding `token` (with a newline, as `echo` writes it), in a
/// directory removed on drop.
pub fn token_file(token: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("token");
    std::fs::write(&path, format!("{token}\n")).expect("writing the token file");
    (dir, path.to_str().expect("a UTF-8 path").to_owned())
}

/// POSTs `body` to `url` + `path` with the headers given (a fresh
/// connection), panicking when no answer came.
pub fn post_with(url: &str, path: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    baton_testkit::server::Client::new(url).post_raw(path, body.to_string().as_bytes(), &all)
}

/// Bytes a command wrote, as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Kills a child process the test started if the test ends early.
pub struct Reaper(pub Option<std::process::Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The pids of the running (not zombie) children of `parent` with `arg`
/// among their arguments: a server's workers (`worker`), or a server
/// started by another (`serve`).
pub fn children_of(parent: u32, arg: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("reading /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // After the command's closing parenthesis: the state, then the parent.
        let Some((_, rest)) = stat.rsplit_once(") ") else { continue };
        let mut fields = rest.split(' ');
        let (state, ppid) = (fields.next(), fields.next().and_then(|p| p.parse::<u32>().ok()));
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(parent) && state != Some("Z") && cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes()) {
            found.push(pid);
        }
    }
    found
}

/// The Python of the virtual environment `scripts/setup-clients.sh`
/// installs tritonclient into.
pub fn client_python() -> std::path::PathBuf {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.baton/venv/bin/python");
    assert!(python.exists(), "{} is missing; run scripts/setup-clients.sh", python.display());
    python
}
