//! Starts the real etcd (Debian's 3.4 server) as a single-member cluster on
//! free loopback ports with a fresh data directory, for tests of baton's
//! cluster mode. It can be killed and restarted on the same port and data
//! directory, to play an outage, or stopped with SIGSTOP and continued, to
//! play a member that hangs (its sockets still accept connections, nothing
//! answers). It can serve clients over TLS (with certificates a test
//! generates, [`crate::certs`]) and with authentication on. Its log goes to
//! a file that failing tests print. [`EtcdCluster`] starts several members
//! that form one cluster.

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::server::free_port;

mod cluster;

pub use cluster::EtcdCluster;

/// How long etcd may take to answer its health check after a start.
const START_LIMIT: Duration = Duration::from_secs(20);
/// How long a SIGTERM may take before etcd is killed.
const STOP_LIMIT: Duration = Duration::from_secs(10);
/// How many fresh pairs of ports a start tries when another process took
/// one between picking it and etcd binding it.
const PORT_TRIES: usize = 3;

/// etcd's data directory and log, in memory where the machine has
/// `/dev/shm`: etcd syncs every write to disk, and on a busy machine a
/// sync queued behind other tests' writeback can outlast a client's
/// two-second deadline. The tests measure baton, not the disk.
fn data_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    let in_memory = shm.is_dir().then(|| tempfile::Builder::new().prefix("baton-etcd-").tempdir_in(shm).ok());
    in_memory.flatten().unwrap_or_else(|| tempfile::tempdir().expect("a temporary dir for etcd"))
}

/// The password of etcd's root user, once a test turned authentication on.
const ROOT_PASSWORD: &str = "root-of-the-test";

/// Tells members started by one test process apart.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// TLS for etcd's clients.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// The server's certificate and key.
    pub server: crate::certs::Pair,
    /// When given, every client must present a certificate signed by
    /// this authority (etcd asks for one whenever it has a CA to check).
    pub client_ca: Option<PathBuf>,
}

/// How a test's etcd is secured.
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// Serve clients over TLS.
    pub tls: Option<ServerTls>,
    /// Users (name, password) who may read and write every key under
    /// `/baton/`; when any is given, authentication is turned on.
    pub users: Vec<(String, String)>,
    /// Hand out signed JSON web tokens (ES256, with a key the test
    /// generates) rather than etcd's simple tokens: they carry the
    /// revision of etcd's users and roles, and are refused as old once
    /// those change ([`Etcd::change_auth`]), as in a production etcd.
    pub jwt: bool,
}

/// A running single-member etcd. Dropping it stops the process.
pub struct Etcd {
    child: Option<Child>,
    binary: PathBuf,
    name: String,
    client: u16,
    peer: u16,
    /// Plain HTTP, for health probes whatever the client URL's security.
    metrics: u16,
    tls: Option<ServerTls>,
    dir: tempfile::TempDir,
    agent: ureq::Agent,
    /// The members of its cluster (`name=peer-url,…`) and the cluster's
    /// token; `None` for a cluster of this member alone.
    cluster: Option<(String, String)>,
    /// Stopped with SIGSTOP and not continued yet.
    paused: bool,
    /// `--auth-token`'s value, when it hands out signed tokens.
    auth_token: Option<String>,
}

impl Etcd {
    /// Starts etcd and waits until it reports itself healthy. Panics when
    /// the binary is missing (saying how to install it) or when etcd does
    /// not come up within a bounded time (with its log's tail).
    pub fn start() -> Etcd {
        let mut etcd = Etcd::unstarted();
        for _ in 0..PORT_TRIES {
            etcd.client = free_port();
            etcd.peer = free_port();
            etcd.metrics = free_port();
            etcd.spawn();
            if etcd.wait_healthy() {
                return etcd;
            }
            // Only a port taken meanwhile is worth another try.
            if !etcd.log_tail().contains("address already in use") {
                break;
            }
        }
        panic!("etcd did not become healthy within {START_LIMIT:?}\n--- etcd log ---\n{}", etcd.log_tail());
    }

    /// A member with a fresh name and data directory, no ports and no
    /// process yet.
    fn unstarted() -> Etcd {
        let binary = crate::installed("etcd");
        let dir = data_dir();
        let name = format!("baton-test-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let agent =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(STOP_LIMIT)).build().into();
        Etcd {
            child: None,
            binary,
            name,
            client: 0,
            peer: 0,
            metrics: 0,
            tls: None,
            dir,
            agent,
            cluster: None,
            paused: false,
            auth_token: None,
        }
    }

    /// Starts etcd secured as `security` says: users are created and
    /// authentication turned on through the gateway while it still serves
    /// plaintext, then it restarts on the same ports and data with TLS.
    /// [`Etcd::put`], [`Etcd::get`], [`Etcd::compact`] and [`Etcd::defrag`]
    /// speak plaintext without credentials: they work only before.
    pub fn start_secured(security: &Security) -> Etcd {
        let mut etcd = Etcd::start();
        if !security.users.is_empty() {
            let b64 = |text: &str| STANDARD.encode(text);
            // etcd turns authentication on only once root exists.
            etcd.gateway("/v3/auth/user/add", &json!({ "name": "root", "password": ROOT_PASSWORD }));
            etcd.gateway_any("/v3/auth/role/add", &json!({ "name": "root" }));
            etcd.gateway("/v3/auth/user/grant", &json!({ "user": "root", "role": "root" }));
            etcd.gateway("/v3/auth/role/add", &json!({ "name": "fleet" }));
            let perm = json!({ "permType": "READWRITE", "key": b64("/baton/"), "range_end": b64("/baton0") });
            etcd.gateway("/v3/auth/role/grant", &json!({ "name": "fleet", "perm": perm }));
            for (user, password) in &security.users {
                etcd.gateway("/v3/auth/user/add", &json!({ "name": user, "password": password }));
                etcd.gateway("/v3/auth/user/grant", &json!({ "user": user, "role": "fleet" }));
            }
            etcd.gateway("/v3/auth/enable", &json!({}));
        }
        if let Some(tls) = &security.tls {
            etcd.tls = Some(tls.clone());
        }
        if security.jwt {
            let key = rcgen::KeyPair::generate().expect("a token-signing key");
            let (private, public) = (etcd.dir.path().join("jwt.key"), etcd.dir.path().join("jwt.pub"));
            std::fs::write(&private, key.serialize_pem()).expect("writing the token key");
            std::fs::write(&public, key.public_key_pem()).expect("writing the token key");
            etcd.auth_token = Some(format!(
                "jwt,pub-key={},priv-key={},sign-method=ES256,ttl=10m",
                public.display(),
                private.display()
            ));
        }
        if security.tls.is_some() || !security.users.is_empty() {
            etcd.restart();
        }
        etcd
    }

    /// The client URL, e.g. `http://127.0.0.1:41234` (`https` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.client
    }

    /// The process id, or 0 when etcd is not running.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or_default()
    }

    /// Stops the process with SIGSTOP: its sockets still accept
    /// connections, and nothing is answered, until [`Etcd::resume`].
    pub fn pause(&mut self) {
        if self.child.is_some() && !self.paused {
            crate::signals::stop(self.pid());
            self.paused = true;
        }
    }

    /// Continues a process stopped by [`Etcd::pause`].
    pub fn resume(&mut self) {
        if self.paused {
            self.signal("CONT");
            self.paused = false;
        }
    }

    fn signal(&self, name: &str) {
        let pid = self.pid().to_string();
        let sent = Command::new("kill").args([&format!("-{name}"), &pid]).stderr(Stdio::null()).status();
        assert!(sent.is_ok_and(|s| s.success()), "sending SIG{name} to etcd {pid} failed");
    }

    /// Sends SIGTERM and waits for etcd to exit; kills it when it has not
    /// exited after a bounded wait. Does nothing when it is not running.
    pub fn stop(&mut self) {
        self.resume();
        let Some(mut child) = self.child.take() else { return };
        let pid = child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).stderr(Stdio::null()).status();
        let deadline = Instant::now() + STOP_LIMIT;
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills etcd with SIGKILL, as a crash would, and reaps it.
    pub fn kill(&mut self) {
        self.paused = false;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data directory (after
    /// [`Etcd::kill`] or [`Etcd::stop`]; stops it first if it still runs)
    /// and waits until it is healthy. Panics with the log's tail otherwise.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
        assert!(
            self.wait_healthy(),
            "etcd did not come back within {START_LIMIT:?}\n--- etcd log ---\n{}",
            self.log_tail()
        );
    }

    /// The last lines etcd logged, over all its starts.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Writes `key` = `value` through etcd's v3 JSON gateway.
    pub fn put(&self, key: &str, value: &[u8]) {
        self.gateway("/v3/kv/put", &json!({ "key": STANDARD.encode(key), "value": STANDARD.encode(value) }));
    }

    /// Reads `key` through etcd's v3 JSON gateway; `None` when it is absent.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let answer = self.gateway("/v3/kv/range", &json!({ "key": STANDARD.encode(key) }));
        let value = answer["kvs"].get(0)?["value"].as_str().unwrap_or_default();
        Some(STANDARD.decode(value).unwrap_or_else(|e| panic!("etcd sent a value that is not base64 ({e}): {value}")))
    }

    /// The key-value record of `key` as etcd's gateway gives it (base64
    /// key and value, `create_revision`, `mod_revision`, `lease`, as
    /// strings), if the key exists.
    pub fn get_kv(&self, key: &str) -> Option<Value> {
        let answer = self.gateway("/v3/kv/range", &json!({ "key": STANDARD.encode(key) }));
        answer["kvs"].get(0).cloned()
    }

    /// Compacts the store's history up to its current revision, as
    /// `etcdctl compact` does: watches that start before it are cancelled.
    /// Returns the revision.
    pub fn compact(&self) -> i64 {
        let answer = self.gateway("/v3/kv/range", &json!({ "key": STANDARD.encode("/"), "count_only": true }));
        let revision: i64 = answer["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("etcd's answer has no revision: {answer}"));
        self.gateway("/v3/kv/compaction", &json!({ "revision": revision.to_string(), "physical": true }));
        revision
    }

    /// Changes etcd's users and roles (adds a role, as root, with
    /// `etcdctl`), which moves the revision of its authentication store:
    /// every token handed out before is then refused as old, as after an
    /// operator's change to who may do what. Needs authentication on, and
    /// no client certificate required.
    pub fn change_auth(&self) {
        let role = format!("baton-test-role-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let mut command = Command::new(crate::installed("etcdctl"));
        command.env("ETCDCTL_API", "3").arg(format!("--endpoints={}", self.endpoint()));
        if let Some(tls) = &self.tls {
            assert!(tls.client_ca.is_none(), "change_auth cannot present a client certificate");
            // Its own etcd, on loopback: the test trusts it without its CA.
            command.args(["--insecure-transport=false", "--insecure-skip-tls-verify"]);
        }
        let output = command
            .args(["--user", &format!("root:{ROOT_PASSWORD}"), "role", "add", &role])
            .output()
            .expect("running etcdctl");
        assert!(output.status.success(), "etcdctl role add: {}", String::from_utf8_lossy(&output.stderr));
    }

    /// Defragments the store, as `etcdctl defrag` does.
    pub fn defrag(&self) {
        self.gateway("/v3/maintenance/defragment", &json!({}));
    }

    /// This member's ID and the leader's it knows, as etcd's status gives
    /// them; `None` when it does not answer.
    fn status(&self) -> Option<(String, String)> {
        let request = self.agent.post(&format!("{}/v3/maintenance/status", self.endpoint()));
        let request = request.config().timeout_global(Some(Duration::from_secs(1))).build();
        let mut response = request.header("content-type", "application/json").send("{}").ok()?;
        let answer: Value = serde_json::from_str(&response.body_mut().read_to_string().ok()?).ok()?;
        let id = answer["header"]["member_id"].as_str()?.to_owned();
        let leader = answer["leader"].as_str()?.to_owned();
        Some((id, leader))
    }

    /// POSTs a JSON body to the gateway, whatever it answers.
    fn gateway_any(&self, path: &str, body: &Value) {
        let request = self.agent.post(&format!("{}{path}", self.endpoint())).header("content-type", "application/json");
        let _ = request.send(body.to_string());
    }

    /// POSTs a JSON body to the gateway and returns the answer (panics
    /// unless 200).
    fn gateway(&self, path: &str, body: &Value) -> Value {
        let request = self.agent.post(&format!("{}{path}", self.endpoint())).header("content-type", "application/json");
        let mut response = request.send(body.to_string()).unwrap_or_else(|e| panic!("POST {path} to etcd failed: {e}"));
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().expect("reading etcd's answer");
        assert_eq!(status, 200, "POST {path} to etcd: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("etcd's answer is not JSON ({e}): {text}"))
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// Starts the process; its output is appended to the log file, so the
    /// log spans restarts.
    fn spawn(&mut self) {
        let log = OpenOptions::new().create(true).append(true).open(self.log_path()).expect("etcd's log file");
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let metrics = format!("http://127.0.0.1:{}", self.metrics);
        let (members, token) = match &self.cluster {
            Some((members, token)) => (members.clone(), token.clone()),
            None => (format!("{}={peer}", self.name), self.name.clone()),
        };
        // A lone member elects itself quickly with short ticks; members of
        // a cluster keep etcd's own (100 ms, 1 s), so that a busy machine
        // does not make them elect all the time.
        let (heartbeat, election) = if self.cluster.is_some() { ("100", "1000") } else { ("50", "250") };
        let mut command = Command::new(&self.binary);
        if let Some(auth_token) = &self.auth_token {
            command.args(["--auth-token", auth_token]);
        }
        if let Some(tls) = &self.tls {
            command.arg("--cert-file").arg(&tls.server.cert).arg("--key-file").arg(&tls.server.key);
            if let Some(ca) = &tls.client_ca {
                command.arg("--trusted-ca-file").arg(ca).arg("--client-cert-auth");
            }
        }
        let child = command
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-metrics-urls", &metrics])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &members, "--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &token])
            // With authentication on, a token idle for a second expires, so
            // tests see clients authenticate again.
            .args(["--auth-token-ttl", "1"])
            .args(["--heartbeat-interval", heartbeat, "--election-timeout", election, "--snapshot-count", "10000"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd's log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.binary.display()));
        self.child = Some(child);
    }

    /// Polls `/health` until it says `"health":"true"` (true) or etcd exits
    /// or the start limit passes (false; the process is then stopped).
    /// A member of a cluster is healthy once the cluster has a leader.
    fn wait_healthy(&mut self) -> bool {
        let url = format!("http://127.0.0.1:{}/health", self.metrics);
        let deadline = Instant::now() + START_LIMIT;
        while Instant::now() < deadline {
            let exited = self.child.as_mut().is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
            if exited {
                self.child = None;
                return false;
            }
            let probe = self.agent.get(&url).config().timeout_global(Some(Duration::from_secs(1))).build().call();
            if let Ok(mut response) = probe {
                let text = response.body_mut().read_to_string().unwrap_or_default();
                if text.replace(' ', "").contains(r#""health":"true""#) {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            // Only what etcd warned about: its info lines drown the test's.
            let tail = self.log_tail();
            let worth: Vec<&str> = tail.lines().filter(|l| !l.contains("\"level\":\"info\"")).collect();
            eprintln!("--- etcd warnings ({}) ---\n{}", self.name, worth.join("\n"));
        }
    }
}
