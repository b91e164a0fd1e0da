//! The real Prometheus (Debian's package), started on a free loopback port
//! with a fresh data directory, scraping a small exporter the test owns
//! every 200 ms: for tests of rollout guards that query it. The exporter
//! serves whatever text the test sets, as an application's `/metrics`
//! would.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::server::free_port;

/// How long Prometheus may take to be ready and to have scraped once.
const START_LIMIT: Duration = Duration::from_secs(30);

/// A `/metrics` page on a free loopback port, served from a thread until
/// dropped.
pub struct Exporter {
    port: u16,
    text: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Exporter {
    /// Serves `text` (Prometheus's text format) to every request.
    pub fn start(text: &str) -> Exporter {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port for the exporter");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let port = listener.local_addr().expect("the exporter's address").port();
        let text = Arc::new(Mutex::new(text.to_owned()));
        let stop = Arc::new(AtomicBool::new(false));
        let (page, stopped) = (Arc::clone(&text), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                        let mut request = [0u8; 4096];
                        let _ = stream.read(&mut request);
                        let body = page.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\
                             connection: close\r\n\r\n",
                            body.len()
                        );
                        let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes()));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Exporter { port, text, stop, thread: Some(thread) }
    }

    /// Serves `text` from now on.
    pub fn set(&self, text: &str) {
        *self.text.lock().unwrap_or_else(|e| e.into_inner()) = text.to_owned();
    }

    /// The `host:port` Prometheus scrapes.
    pub fn target(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A running Prometheus. Dropping it stops the process.
pub struct Prometheus {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    agent: ureq::Agent,
}

impl Prometheus {
    /// Starts Prometheus scraping `target` every 200 ms, and waits until it
    /// is ready and holds a first scrape. Panics when the binary is missing
    /// (saying how to install it) or when it does not come up in time.
    pub fn start(target: &str) -> Prometheus {
        Prometheus::start_scraping(&[target])
    }

    /// Starts Prometheus scraping every one of `targets` (`host:port`,
    /// each labelled `instance` by it) every 200 ms, and waits as
    /// [`Prometheus::start`] does for a first scrape.
    pub fn start_scraping(targets: &[&str]) -> Prometheus {
        let binary = crate::installed("prometheus");
        let dir = tempfile::tempdir().expect("a temporary dir for Prometheus");
        let targets = targets.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
        let config = format!(
            "global:\n  scrape_interval: 200ms\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: app\n    \
             static_configs:\n      - targets: [{targets}]\n"
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("writing prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("log")).expect("Prometheus's log file");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log again"))
            .stderr(log)
            .spawn()
            .expect("starting prometheus");
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(5)))
            .build();
        let prometheus = Prometheus { child: Some(child), port, dir, agent: agent.into() };
        let deadline = Instant::now() + START_LIMIT;
        while Instant::now() < deadline {
            if prometheus.query("up").is_some_and(|v| v["data"]["result"].as_array().is_some_and(|r| !r.is_empty())) {
                return prometheus;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("Prometheus did not scrape its target within {START_LIMIT:?}\n--- log ---\n{}", prometheus.log());
    }

    /// The base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The answer to an instant query, when Prometheus gave one.
    pub fn query(&self, query: &str) -> Option<Value> {
        let mut response = self.agent.get(format!("{}/api/v1/query", self.url())).query("query", query).call().ok()?;
        serde_json::from_str(&response.body_mut().read_to_string().ok()?).ok()
    }

    /// Waits until `query` gives one sample equal to `value`: the scrapes
    /// have caught up with what the exporter serves.
    pub fn wait_for(&self, query: &str, value: f64) {
        let deadline = Instant::now() + START_LIMIT;
        while Instant::now() < deadline {
            let got = self.query(query).and_then(|v| v["data"]["result"][0]["value"][1].as_str()?.parse::<f64>().ok());
            if got == Some(value) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("Prometheus never read {value} for {query}");
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Stops it (SIGKILL: its data is thrown away anyway) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Prometheus that has stalled: a loopback listener that accepts every
/// connection and never answers (as a Prometheus under SIGSTOP, or behind
/// a black hole, would), until dropped. It counts the connections it
/// holds, so that a test knows when a query is in flight.
pub struct Stalled {
    port: u16,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Stalled {
    /// Listens on a free loopback port.
    pub fn start() -> Stalled {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port for the stalled Prometheus");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let port = listener.local_addr().expect("its address").port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, stopped) = (Arc::clone(&accepted), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        held.push(stream);
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Stalled { port, accepted, stop, thread: Some(thread) }
    }

    /// The base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The connections accepted so far (each held open, unanswered).
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
