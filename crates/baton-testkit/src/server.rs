//! Starts the real `baton` binary on a free loopback port and talks HTTP to
//! it, for black-box tests. The server's log goes to a file that failing
//! tests print.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a test waits for a condition before failing. A safety net
/// against a hung test, not a speed requirement.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A running `baton serve`.
pub struct Server {
    child: Option<Child>,
    base: String,
    grpc: Option<String>,
    // Kept open so the server never writes to a closed pipe.
    stdout: BufReader<ChildStdout>,
    log: PathBuf,
    _logdir: tempfile::TempDir,
    agent: ureq::Agent,
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// Headers, lower-case names.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as JSON (panics with the body if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The `error` message of an error body.
    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or_default().to_owned()
    }
}

/// A loopback port that was free a moment ago, for a program that must be
/// told its port rather than pick one and print it (as baton does with
/// `127.0.0.1:0`). Another process may take it before the program binds it.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free loopback port").port()
}

/// Polls `check` until it returns `Some`, or panics after [`PATIENCE`].
pub fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Server {
    /// Starts `bin serve --repo repo --http 127.0.0.1:0 --grpc 127.0.0.1:0
    /// --poll 50ms` plus `args` (which may repeat any of these options to
    /// override them), and waits until it listens. The first line baton
    /// prints gives the REST address ([`Server::base`]), the second the gRPC
    /// one ([`Server::grpc_address`]).
    pub fn start(bin: &Path, repo: &Path, args: &[&str]) -> Server {
        Server::start_with_env(bin, repo, args, &[])
    }

    /// [`Server::start`] with `env` added to baton's environment (say, a
    /// store's endpoint and credentials); `repo` may be a store's URL.
    pub fn start_with_env(bin: &Path, repo: &Path, args: &[&str], env: &[(String, String)]) -> Server {
        let mut command = Command::new(bin);
        command.envs(env.iter().map(|(k, v)| (k, v)));
        Server::spawn(command, repo, args)
    }

    /// [`Server::start`] with `sockets` passed to baton already listening,
    /// as systemd's socket activation passes them: descriptors 3 onward,
    /// `LISTEN_FDS`, `LISTEN_FDNAMES` with each one's name, and
    /// `LISTEN_PID` set to baton's pid (by a shell that then becomes baton).
    pub fn start_passing(bin: &Path, repo: &Path, args: &[&str], sockets: &[(&str, &std::net::TcpListener)]) -> Server {
        use std::os::fd::{AsFd, AsRawFd};
        use std::os::unix::process::CommandExt;
        // Copies above any descriptor the child is given, closed on exec:
        // only what the child puts at 3 onward reaches baton.
        let copies: Vec<std::os::fd::OwnedFd> =
            sockets.iter().map(|(_, s)| s.as_fd().try_clone_to_owned().expect("copying a socket")).collect();
        let high: Vec<i32> = copies
            .iter()
            .map(|fd| {
                // SAFETY: fcntl on a descriptor this process owns.
                #[allow(unsafe_code)]
                let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 64) };
                assert!(high >= 64, "duplicating a socket");
                high
            })
            .collect();
        let names: Vec<&str> = sockets.iter().map(|(n, _)| *n).collect();
        let mut command = Command::new("sh");
        command.args(["-c", "export LISTEN_PID=$$; exec \"$0\" \"$@\""]).arg(bin);
        command.env("LISTEN_FDS", sockets.len().to_string()).env("LISTEN_FDNAMES", names.join(":"));
        let targets = high.clone();
        // SAFETY: between fork and exec only dup2, which is async-signal-safe.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                for (i, fd) in targets.iter().enumerate() {
                    if libc::dup2(*fd, 3 + i as i32) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let server = Server::spawn(command, repo, args);
        for fd in high {
            // SAFETY: closing the copies made above, which nothing else owns.
            #[allow(unsafe_code)]
            unsafe {
                libc::close(fd);
            }
        }
        drop(copies);
        server
    }

    /// [`Server::start`] with a `command` the test prepared: baton's path
    /// with, say, resource limits set in `pre_exec`. `serve` and the
    /// arguments [`Server::start`] describes are added to it.
    pub fn start_command(command: Command, repo: &Path, args: &[&str]) -> Server {
        Server::spawn(command, repo, args)
    }

    /// Starts `command` (baton, or what becomes it) with `serve` and the
    /// arguments [`Server::start`] describes.
    fn spawn(mut command: Command, repo: &Path, args: &[&str]) -> Server {
        let logdir = tempfile::tempdir().expect("a log dir");
        let log = logdir.path().join("baton.log");
        let mut child = command
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--poll", "50ms", "--repo"])
            .arg(repo)
            .args(args)
            .env("BATON_LOG", "info,baton=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("a log file"))
            .spawn()
            .expect("starting baton");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("reading baton's first line");
        let Some(address) = line.split("http://").nth(1).and_then(|s| s.split_whitespace().next()) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("baton did not start: {line:?}\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        };
        // baton prints the gRPC line together with the REST one.
        let mut second = String::new();
        stdout.read_line(&mut second).expect("reading baton's second line");
        let grpc = second.split("grpc://").nth(1).and_then(|s| s.split_whitespace().next()).map(str::to_owned);
        let agent =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(PATIENCE)).build().into();
        Server { child: Some(child), base: format!("http://{address}"), grpc, stdout, log, _logdir: logdir, agent }
    }

    /// The next line baton printed on its stdout: after the REST and gRPC
    /// lines [`Server::start`] reads, the admin listeners' lines (REST,
    /// then gRPC) when it was started with `--admin-http` or `--admin-grpc`.
    pub fn next_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("reading a line baton printed");
        line
    }

    /// The gRPC address, e.g. `127.0.0.1:41235` (panics if baton printed
    /// none).
    pub fn grpc_address(&self) -> &str {
        self.grpc.as_deref().expect("baton printed no gRPC address on its second line")
    }

    /// The gRPC endpoint URL, e.g. `http://127.0.0.1:41235`.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc_address())
    }

    /// The base URL, e.g. `http://127.0.0.1:41234`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or_default()
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn answer(&self, response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
        let mut response = response.unwrap_or_else(|e| panic!("request failed: {e}\n{}", self.log()));
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()))
            .collect();
        let body = response.body_mut().with_config().limit(1 << 30).read_to_vec().expect("reading a body");
        Answer { status, headers, body }
    }

    /// GET a path.
    pub fn get(&self, path: &str) -> Answer {
        self.answer(self.agent.get(&format!("{}{path}", self.base)).call())
    }

    /// POST a JSON body.
    pub fn post_json(&self, path: &str, body: &Value) -> Answer {
        let request = self.agent.post(&format!("{}{path}", self.base)).header("content-type", "application/json");
        self.answer(request.send(body.to_string()))
    }

    /// POST raw bytes with extra headers.
    pub fn post_raw(&self, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Answer {
        let mut request = self.agent.post(&format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.answer(request.send(body))
    }

    /// Waits until `/v2/health/ready` says 200.
    pub fn wait_ready(&self) {
        eventually("the server to become ready", || (self.get("/v2/health/ready").status == 200).then_some(()));
    }

    /// Waits until the model serves `version`.
    pub fn wait_serving(&self, model: &str, version: u64) {
        eventually(&format!("{model} to serve version {version}"), || {
            let status = self.get(&format!("/baton/v1/models/{model}/status"));
            (status.status == 200 && status.json()["serving"] == version).then_some(())
        });
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.pid().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("running kill");
        assert!(sent.success(), "kill -TERM {pid} failed");
        let child = self.child.as_mut().expect("a running server");
        let status = eventually("baton to exit after SIGTERM", || child.try_wait().expect("waiting for baton"));
        self.child = None;
        status
    }
}

/// A cheap, cloneable handle that sends requests to a server from any
/// thread, independent of the [`Server`] that owns the process (so one
/// thread can keep a request open while another stops the server).
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
}

impl Client {
    /// A client of the server at `base`, e.g. `http://127.0.0.1:41234`.
    pub fn new(base: &str) -> Client {
        let agent =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(PATIENCE)).build().into();
        Client { base: base.trim_end_matches('/').to_owned(), agent }
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn answer(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<Answer, String> {
        let mut response = response.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()))
            .collect();
        let body = response.body_mut().with_config().limit(1 << 30).read_to_vec().map_err(|e| e.to_string())?;
        Ok(Answer { status, headers, body })
    }

    /// GET a path; `Err` when no answer came (connection refused, reset).
    pub fn try_get(&self, path: &str) -> Result<Answer, String> {
        Client::answer(self.agent.get(&format!("{}{path}", self.base)).call())
    }

    /// POST raw bytes with extra headers; `Err` when no answer came.
    pub fn try_post_raw(&self, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Result<Answer, String> {
        let mut request = self.agent.post(&format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Client::answer(request.send(body))
    }

    /// GET a path with extra headers (panics when no answer came).
    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut request = self.agent.get(&format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Client::answer(request.call()).unwrap_or_else(|e| panic!("GET {path} failed: {e}"))
    }

    /// GET a path (panics when no answer came).
    pub fn get(&self, path: &str) -> Answer {
        self.try_get(path).unwrap_or_else(|e| panic!("GET {path} failed: {e}"))
    }

    /// POST a JSON body (panics when no answer came).
    pub fn post_json(&self, path: &str, body: &Value) -> Answer {
        let headers = [("content-type", "application/json")];
        self.try_post_raw(path, body.to_string().as_bytes(), &headers)
            .unwrap_or_else(|e| panic!("POST {path} failed: {e}"))
    }

    /// POST raw bytes with extra headers (panics when no answer came).
    pub fn post_raw(&self, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Answer {
        self.try_post_raw(path, body, headers).unwrap_or_else(|e| panic!("POST {path} failed: {e}"))
    }
}

/// The value of one series in a Prometheus text exposition, e.g.
/// `metric(text, "baton_ready")` or
/// `metric(text, r#"baton_load_failures_total{model="m",stage="verify"}"#)`:
/// the line must start with exactly `series` followed by a space.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

impl Server {
    /// A handle that sends requests from other threads.
    pub fn client(&self) -> Client {
        Client { base: self.base.clone(), agent: self.agent.clone() }
    }

    /// The text of `/metrics`.
    pub fn metrics(&self) -> String {
        let answer = self.get("/metrics");
        assert_eq!(answer.status, 200, "GET /metrics");
        String::from_utf8(answer.body).expect("UTF-8 metrics")
    }

    /// `/baton/v1/models/{model}/status` as JSON (panics unless 200).
    pub fn status(&self, model: &str) -> Value {
        let answer = self.get(&format!("/baton/v1/models/{model}/status"));
        assert_eq!(answer.status, 200, "status of {model}: {}", String::from_utf8_lossy(&answer.body));
        answer.json()
    }

    /// Waits until the model serves `version` and nothing runs on it any
    /// more: a load is busy until its drain ends, after the new version
    /// already serves, and another load, rollback or unload started before
    /// then is refused with 409.
    pub fn wait_settled(&self, model: &str, version: u64) {
        eventually(&format!("{model} to serve version {version} with nothing running"), || {
            let status = self.get(&format!("/baton/v1/models/{model}/status"));
            let status = (status.status == 200).then(|| status.json())?;
            (status["serving"] == version && status["busy"] == false).then_some(())
        });
    }

    /// Sends SIGTERM without waiting; see [`Server::wait_exit`].
    pub fn signal_terminate(&self) {
        self.signal("TERM");
    }

    /// Sends a signal by name (`TERM`, `INT`, …) without waiting.
    pub fn signal(&self, name: &str) {
        let pid = self.pid().to_string();
        let sent = Command::new("kill").args([&format!("-{name}"), &pid]).status().expect("running kill");
        assert!(sent.success(), "kill -{name} {pid} failed");
    }

    /// Waits for the process to exit (after [`Server::signal_terminate`]).
    pub fn wait_exit(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("a running server");
        let status = eventually("baton to exit", || child.try_wait().expect("waiting for baton"));
        self.child = None;
        status
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            if std::thread::panicking() {
                eprintln!("--- baton log ---\n{}", self.log());
            }
        }
    }
}
