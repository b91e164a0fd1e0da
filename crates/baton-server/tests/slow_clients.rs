//! A thousand slow clients do not take the server off the air.
//!
//! baton starts under the common soft limit of 1,024 open files. 1,100
//! connections each send a request line, then one more header byte every
//! second — faster than the header read timeout (2 s here), so only a
//! timeout counted from the connection's start closes them, not one that
//! each byte renews. Meanwhile a normal client sends requests on a
//! connection it keeps and on new ones, and a new version is published.
//!
//! The normal client fails nothing, every slow connection is closed by the
//! server (at its header read timeout, or earlier to make room at the
//! listener's bound), the watcher reads the repository and the new version loads, and
//! the server keeps descriptors free for its own files throughout. Twice:
//! with a hard limit of 4,096, which the server raises its soft limit to,
//! and with a hard limit of 1,024, where it cannot, and its bound on
//! connections must leave room for its own files.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_testkit::server::{Client, PATIENCE};
use common::conn::{file_limits, metric_now, open_files, raise_own_file_limit, start_limited};
use common::{mlp, repo_with};

const SLOW: usize = 1100;

/// Descriptors that must stay free for the server's own files however
/// many clients connect.
const KEPT_FREE: usize = 128;

/// What the normal client saw.
#[derive(Default)]
struct Seen {
    kept: usize,
    fresh: usize,
    failures: Vec<String>,
}

/// A request on a connection of its own: `Connection: close`, read to the end.
fn fresh_request(address: &str) -> Result<(), String> {
    let mut stream = TcpStream::connect(address).map_err(|e| format!("connecting: {e}"))?;
    stream.set_read_timeout(Some(PATIENCE)).map_err(|e| e.to_string())?;
    let head = "GET /v2/health/ready HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).map_err(|e| format!("writing: {e}"))?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(|e| format!("reading: {e}"))?;
    let answer = String::from_utf8_lossy(&answer);
    if answer.starts_with("HTTP/1.1 200") { Ok(()) } else { Err(format!("answered {answer:?}")) }
}

/// The normal client: inference on a connection it keeps, readiness on a
/// new connection each time, until `stop`.
fn normal_client(base: String, stop: Arc<AtomicBool>) -> Seen {
    let kept = Client::new(&base);
    let address = base.trim_start_matches("http://").to_owned();
    let request = common::request(&[0.5; 8], 1);
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
        stream.write_all(b"GET /v2/health/ready HTTP/1.1\r\n").expect("a request line");
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

/// The scenario under an open-files limit of `limits` (soft, hard).
fn slow_clients_under(limits: (u64, u64)) {
    // Both tests of this file may run at once in this process.
    raise_own_file_limit(2 * SLOW as u64 + 512);
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
        std::thread::spawn(move || normal_client(base, stop))
    };

    let mut slow: Vec<Slow> = (0..SLOW).map(|_| Slow::open(&address)).collect();
    repo.publish_mlp("m", 2, &mlp(2));
    let deadline = Instant::now() + PATIENCE;
    let mut most_files = 0;
    let kept = Client::new(server.base());
    loop {
        for connection in &mut slow {
            connection.trickle();
        }
        most_files = most_files.max(open_files(pid));
        let closed = slow.iter().filter(|s| s.closed).count();
        let serving = kept.try_get("/baton/v1/models/m/status").ok().filter(|a| a.status == 200).map(|a| a.json());
        let serves_two = serving.is_some_and(|s| s["serving"] == 2);
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
        "limit {soft}: the server held at most {most_files} descriptors; the normal client was answered {} times on \
         its kept connection and {} times on new ones",
        seen.kept, seen.fresh
    );
    assert!(seen.failures.is_empty(), "the normal client failed: {:?}", seen.failures);
    assert!(seen.kept > 0 && seen.fresh > 0, "the normal client was answered {} + {} times", seen.kept, seen.fresh);
    // Each closed for its header read timeout, or earlier to make room.
    let closed = |reason: &str| {
        metric_now(server.base(), &format!(r#"baton_connections_closed_total{{listener="http",reason="{reason}"}}"#))
    };
    let (timed_out, made_room) = (closed("header_timeout"), closed("evicted"));
    assert!(
        timed_out + made_room >= SLOW as f64,
        "{timed_out} connections closed for their header read timeout, {made_room} to make room"
    );
    let log = common::plain_log(&server);
    assert!(!log.contains("cannot be read"), "the watcher could not read the repository:\n{log}");
    assert!(
        most_files + KEPT_FREE <= soft as usize,
        "the server held {most_files} descriptors of its {soft}: fewer than {KEPT_FREE} left for its own files"
    );
    common::assert_no_panic(&server);
    // The new version answers.
    let (version, _) = common::infer(&server, "m", &[0.5; 8], 1);
    assert_eq!(version, 2);
}

#[test]
fn a_thousand_slow_clients_are_closed_while_others_are_served_when_the_limit_can_be_raised() {
    slow_clients_under((1024, 4096));
}

#[test]
fn a_thousand_slow_clients_are_closed_while_others_are_served_when_the_limit_cannot_be_raised() {
    slow_clients_under((1024, 1024));
}
