//! A thousand slow clients do not take the server off the air.
//!
//! First, baton starts under the common soft limit of 1,024 open files,
//! which it raises to a hard limit of 4,096. 1,100 connections each send a
//! request line, then one more header byte every second — faster than the
//! header read timeout (2 s here), so only a timeout counted from the
//! connection's start closes them, not one that each byte renews.
//! Meanwhile a normal client sends requests on a connection it keeps and
//! on new ones, and a new version is published. The normal client fails
//! nothing, every slow connection is closed by the server (at its header
//! read timeout, or earlier to make room at the listener's bound), and the
//! new version loads.
//!
//! Then under a hard limit of 1,024, which the server cannot raise, 1,100
//! silent connections flood each listener (REST and gRPC) with a header
//! read timeout of a minute, so that both stay at their bound. Meanwhile a
//! version of 300 files is published, and a model served by a worker
//! process: both load, the normal client (REST and gRPC) is served, and
//! the server keeps descriptors free for its own files throughout.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_protocol::grpc::pb;
use baton_testkit::server::{Client, PATIENCE};
use common::conn::{file_limits, metric_now, open_files, raise_own_file_limit, start_limited};
use common::{mlp, repo_with};

const SLOW: usize = 1100;

/// Descriptors that must stay free for the server's own files however
/// many clients connect to both listeners.
const KEPT_FREE: usize = 128;

/// What the normal client saw.
#[derive(Default)]
struct Seen {
    kept: usize,
    fresh: usize,
    grpc: usize,
    failures: Vec<String>,
}

/// A request on a connection of its own: `Connection: close`, read to the end.
fn fresh_request(address: &str) -> Result<(), String> {
    let mut stream = TcpStream::connect(address).map_err(|e| format!("connecting: {e}"))?;
    stream.set_read_timeout(Some(PATIENCE)).map_err(|e| e.to_string())?;
    let head = "GET /v2/models/m/ready HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).map_err(|e| format!("writing: {e}"))?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(|e| format!("reading: {e}"))?;
    let answer = String::from_utf8_lossy(&answer);
    if answer.starts_with("HTTP/1.1 200") { Ok(()) } else { Err(format!("answered {answer:?}")) }
}

/// The normal client: inference on a connection it keeps, the model's readiness on a
/// new connection each time, and, given a gRPC address, a liveness call on
/// a gRPC connection it keeps, until `stop`.
fn normal_client(base: String, grpc: Option<String>, stop: Arc<AtomicBool>) -> Seen {
    let kept = Client::new(&base);
    let address = base.trim_start_matches("http://").to_owned();
    let request = common::request(&[0.5; 8], 1);
    let runtime = common::grpc::runtime();
    let mut grpc = grpc.map(|address| runtime.block_on(common::grpc::clients_at(&address)).0);
    let mut seen = Seen::default();
    while !stop.load(Ordering::SeqCst) {
        match kept.try_post_raw(
            "/v2/models/m/infer",
            request.to_string().as_bytes(),
            &[("content-type", "application/json")],
        ) {
            Ok(answer) if answer.status == 200 => seen.kept += 1,
            Ok(answer) => seen.failures.push(format!("kept connection: {}", answer.status)),
            Err(e) => seen.failures.push(format!("kept connection: {e}")),
        }
        match fresh_request(&address) {
            Ok(()) => seen.fresh += 1,
            Err(e) => seen.failures.push(format!("new connection: {e}")),
        }
        if let Some(client) = grpc.as_mut() {
            let live =
                runtime.block_on(common::grpc::within("a gRPC call", client.server_live(pb::ServerLiveRequest {})));
            match live {
                Ok(_) => seen.grpc += 1,
                Err(e) => seen.failures.push(format!("kept gRPC connection: {e}")),
            }
        }
        // A client's pace, not a wait for a condition.
        std::thread::sleep(Duration::from_millis(20));
    }
    seen
}

/// A connection that sends its head one byte at a time.
struct Slow {
    stream: TcpStream,
    closed: bool,
}

impl Slow {
    fn open(address: &str) -> Slow {
        let mut stream = TcpStream::connect(address).expect("a slow connection");
        stream.write_all(b"GET /v2/models/m/ready HTTP/1.1\r\n").expect("a request line");
        stream.set_nonblocking(true).expect("a non-blocking socket");
        Slow { stream, closed: false }
    }

    /// Sends one more byte of a header that never ends, and notes whether
    /// the server has closed the connection.
    fn trickle(&mut self) {
        if self.closed {
            return;
        }
        let mut buffer = [0u8; 1024];
        loop {
            match self.stream.read(&mut buffer) {
                Ok(0) => {
                    self.closed = true;
                    return;
                }
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.closed = true;
                    return;
                }
            }
        }
        match self.stream.write(b"x") {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => self.closed = true,
        }
    }
}

#[test]
fn a_thousand_slow_clients_are_closed_while_others_are_served() {
    // Both tests of this file may run at once in this process.
    raise_own_file_limit(5 * SLOW as u64 + 512);
    let limits = (1024, 4096);
    let repo = repo_with("m", &[1], "");
    let server = start_limited(&repo, limits, &["--header-read-timeout", "2s"]);
    server.wait_ready();
    server.wait_serving("m", 1);
    let pid = server.pid();
    let (soft, hard) = file_limits(pid);
    assert_eq!((soft, hard), (limits.1, limits.1), "the soft limit on open files is raised to the hard one");
    let address = server.base().trim_start_matches("http://").to_owned();

    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let (base, stop) = (server.base().to_owned(), Arc::clone(&stop));
        std::thread::spawn(move || normal_client(base, None, stop))
    };

    let mut slow: Vec<Slow> = (0..SLOW).map(|_| Slow::open(&address)).collect();
    repo.publish_mlp("m", 2, &mlp(2));
    let deadline = Instant::now() + PATIENCE;
    let kept = Client::new(server.base());
    loop {
        for connection in &mut slow {
            connection.trickle();
        }
        let closed = slow.iter().filter(|s| s.closed).count();
        let serves_two = serves(&kept, "m", 2);
        if closed == SLOW && serves_two {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {PATIENCE:?}: {closed} of {SLOW} slow connections closed, version 2 served: {serves_two}\n{}",
            server.log()
        );
        // The slow clients' pace: one byte a second each.
        std::thread::sleep(Duration::from_secs(1));
    }
    stop.store(true, Ordering::SeqCst);
    let seen = client.join().expect("the normal client");
    eprintln!(
        "the normal client was answered {} times on its kept connection and {} times on new ones",
        seen.kept, seen.fresh
    );
    assert!(seen.failures.is_empty(), "the normal client failed: {:?}", seen.failures);
    assert!(seen.kept > 0 && seen.fresh > 0, "the normal client was answered {} + {} times", seen.kept, seen.fresh);
    // Each closed for its header read timeout, or earlier to make room.
    let (timed_out, made_room) =
        (closed(server.base(), "http", "header_timeout"), closed(server.base(), "http", "evicted"));
    assert!(
        timed_out + made_room >= SLOW as f64,
        "{timed_out} connections closed for their header read timeout, {made_room} to make room"
    );
    let log = common::plain_log(&server);
    assert!(!log.contains("cannot be read"), "the watcher could not read the repository:\n{log}");
    common::assert_no_panic(&server);
    let (version, _) = common::infer(&server, "m", &[0.5; 8], 1);
    assert_eq!(version, 2);
}

#[test]
fn both_listeners_flooded_under_a_hard_limit_of_1024_leave_the_server_its_files() {
    raise_own_file_limit(5 * SLOW as u64 + 512);
    let limits = (1024, 1024);
    let repo = repo_with("m", &[1], "");
    let server = start_limited(&repo, limits, &["--header-read-timeout", "60s"]);
    server.wait_ready();
    server.wait_serving("m", 1);
    let pid = server.pid();
    assert_eq!(file_limits(pid), limits);
    let address = server.base().trim_start_matches("http://").to_owned();

    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let (base, grpc, stop) = (server.base().to_owned(), server.grpc_address().to_owned(), Arc::clone(&stop));
        std::thread::spawn(move || normal_client(base, Some(grpc), stop))
    };
    // Silent connections on both listeners: far more than their bounds,
    // the rest waiting in the kernel's queues.
    let flood: Vec<TcpStream> = [address.as_str(), server.grpc_address()]
        .iter()
        .flat_map(|to| (0..SLOW).map(move |_| TcpStream::connect(to).expect("a silent connection")))
        .collect();
    let kept = Client::new(server.base());
    let mut most_files = 0;
    let mut watch = |what: &str, done: &mut dyn FnMut() -> bool| {
        let deadline = Instant::now() + PATIENCE;
        while !done() {
            most_files = most_files.max(open_files(pid));
            assert!(Instant::now() < deadline, "{what} within {PATIENCE:?}\n{}", server.log());
            // Often enough that the kept connection is never idle for the
            // second after which it could be closed to make room.
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    watch("both listeners to reach their bound", &mut || {
        ["http", "grpc"].iter().all(|listener| {
            let series = format!(r#"baton_connections_at_bound_total{{listener="{listener}"}}"#);
            kept.try_get("/metrics").ok().is_some_and(|a| {
                baton_testkit::server::metric(&String::from_utf8_lossy(&a.body), &series).unwrap_or(0.0) >= 1.0
            })
        })
    });
    // A version of 300 files, each held open from its verify stage to its
    // load, and a model served by a worker process.
    let extra: Vec<(String, Vec<u8>)> =
        (0..299).map(|n| (format!("extra/{n:03}.txt"), format!("{n}\n").into_bytes())).collect();
    let extra: Vec<(&str, &[u8])> = extra.iter().map(|(path, bytes)| (path.as_str(), bytes.as_slice())).collect();
    repo.publish_mlp_with("m", 2, &mlp(2), &Default::default(), &extra);
    repo.add_model("w", &baton_testkit::repo::mlp_toml(&mlp(1), "[engine]\nisolation = \"process\"\nsessions = 1\n"));
    repo.publish_mlp("w", 1, &mlp(1));
    watch("version 2 of 300 files and the worker's model to serve", &mut || {
        serves(&kept, "m", 2) && serves(&kept, "w", 1)
    });
    stop.store(true, Ordering::SeqCst);
    let seen = client.join().expect("the normal client");
    eprintln!(
        "both listeners flooded under a limit of 1024: the server held at most {most_files} descriptors; the normal \
         client was answered {} times on its kept connection, {} times on new ones and {} times over gRPC",
        seen.kept, seen.fresh, seen.grpc
    );
    assert!(seen.failures.is_empty(), "the normal client failed: {:?}", seen.failures);
    assert!(seen.kept > 0 && seen.fresh > 0 && seen.grpc > 0, "the normal client was not answered on every path");
    assert!(
        most_files + KEPT_FREE <= limits.0 as usize,
        "the server held {most_files} descriptors of its {}: fewer than {KEPT_FREE} left for its own files",
        limits.0
    );
    let log = common::plain_log(&server);
    assert!(!log.to_ascii_lowercase().contains("too many open files"), "descriptors ran out:\n{log}");
    common::assert_no_panic(&server);
    drop(flood);
    let (version, _) = common::infer(&server, "m", &[0.5; 8], 1);
    assert_eq!(version, 2);
}

/// Whether `model` serves `version`, as its status says.
fn serves(client: &Client, model: &str, version: u64) -> bool {
    let status = client.try_get(&format!("/baton/v1/models/{model}/status")).ok().filter(|a| a.status == 200);
    status.is_some_and(|s| s.json()["serving"] == version)
}

/// Connections the server closed on `listener` for `reason`.
fn closed(base: &str, listener: &str, reason: &str) -> f64 {
    metric_now(base, &format!(r#"baton_connections_closed_total{{listener="{listener}",reason="{reason}"}}"#))
}
