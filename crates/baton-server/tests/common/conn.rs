//! Helpers for tests about connections: starting baton under a given
//! limit on open files, counting its descriptors, reading a listening
//! socket's accept queue, and raw HTTP/1.1 exchanges on sockets the test
//! holds.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::Command;

use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Client, PATIENCE, Server, metric};
use rustix::process::{Resource, Rlimit};

/// Starts `baton serve` on the repository under an open-files limit of
/// `soft` (and `hard`), as `ulimit -Sn soft -Hn hard` in a shell would.
pub fn start_limited(repo: &TestRepo, (soft, hard): (u64, u64), args: &[&str]) -> Server {
    let mut command = Command::new(super::bin());
    // SAFETY: between fork and exec only setrlimit, one system call that
    // takes a value and allocates nothing.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            let limit = Rlimit { current: Some(soft), maximum: Some(hard) };
            rustix::process::setrlimit(Resource::Nofile, limit).map_err(std::io::Error::from)
        });
    }
    Server::start_command(command, repo.root(), args)
}

/// Raises this test process's own soft limit on open files to its hard
/// one, and returns it: the test holds more sockets than 1,024.
pub fn raise_own_file_limit(needed: u64) -> u64 {
    let limit = rustix::process::getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    rustix::process::setrlimit(Resource::Nofile, Rlimit { current: Some(hard), maximum: limit.maximum })
        .expect("raising the test's own limit on open files");
    assert!(hard >= needed, "the test needs {needed} open files; the hard limit is {hard}");
    hard
}

/// How many descriptors process `pid` holds.
pub fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).expect("reading /proc/PID/fd").count()
}

/// Process `pid`'s limit on open files, soft and hard, as
/// `/proc/PID/limits` says.
pub fn file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("reading /proc/PID/limits");
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("a 'Max open files' line");
    let mut numbers = line["Max open files".len()..].split_whitespace().map(|n| n.parse::<u64>().expect("a number"));
    (numbers.next().expect("a soft limit"), numbers.next().expect("a hard limit"))
}

/// The connections waiting in the accept queue of the IPv4 socket that
/// process `pid` listens on at `port`: what the kernel completed and the
/// server has not accepted. `None` if no such socket listens.
pub fn accept_queue(pid: u32, port: u16) -> Option<u64> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).expect("reading /proc/PID/net/tcp");
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local_port = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
        // State 0A is LISTEN; for a listening socket the receive queue is
        // the accept queue.
        if local_port != port || *fields.get(3)? != "0A" {
            return None;
        }
        u64::from_str_radix(fields.get(4)?.split(':').nth(1)?, 16).ok()
    })
}

/// The port of an address such as `127.0.0.1:41234` or `http://127.0.0.1:41234`.
pub fn port_of(address: &str) -> u16 {
    address.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no port in {address}"))
}

/// The value of `series` in `/metrics`, asked on a connection of its own
/// (0 when the series is absent).
pub fn metric_now(base: &str, series: &str) -> f64 {
    let answer = Client::new(base).get("/metrics");
    assert_eq!(answer.status, 200, "GET /metrics");
    metric(&String::from_utf8_lossy(&answer.body), series).unwrap_or(0.0)
}

/// Sends a keep-alive `GET path` on `stream`.
pub fn send_get(stream: &mut TcpStream, path: &str) {
    let head = format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
    stream.write_all(head.as_bytes()).expect("writing a request");
}

/// Reads one answer with a `content-length` from `stream` and returns its
/// status code.
pub fn read_status(stream: &mut TcpStream) -> u16 {
    stream.set_read_timeout(Some(PATIENCE)).expect("a read timeout");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).expect("reading an answer head");
        assert_eq!(n, 1, "the server closed the connection before answering; head so far: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no content-length in {head}"));
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("reading an answer body");
    head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("a status code")
}

/// A keep-alive connection to `address` that has been answered once, so
/// the server has certainly accepted it.
pub fn answered_connection(address: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).expect("connecting to baton");
    send_get(&mut stream, "/v2/health/live");
    assert_eq!(read_status(&mut stream), 200);
    stream
}

/// Waits, up to [`PATIENCE`], for the server to close `stream` (end of
/// stream or a reset), reading and discarding whatever it sends first.
/// Panics if it stays open.
pub fn wait_closed(stream: &mut TcpStream, what: &str) {
    stream.set_nonblocking(false).expect("a blocking socket");
    stream.set_read_timeout(Some(PATIENCE)).expect("a read timeout");
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => return,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("{what}: the server kept the connection open for {PATIENCE:?}")
            }
            Err(e) => panic!("{what}: reading: {e}"),
        }
    }
}

/// Whether the server has closed `stream`, looked at without waiting.
pub fn is_closed(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).expect("a non-blocking socket");
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// Process `pid`'s resident memory, in bytes (`VmRSS` in /proc/PID/status).
pub fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading /proc/PID/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("a VmRSS line");
    let kib: u64 = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a number of kB");
    kib << 10
}

/// Sends on `stream` the head of a `POST path` whose body of `declared`
/// bytes stops after its first byte: a request in flight that is not a
/// quiet stream, until the body read timeout.
pub fn slow_body(address: &str, path: &str, declared: usize) -> TcpStream {
    let mut stream = TcpStream::connect(address).expect("connecting");
    let head = format!("POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {declared}\r\n\r\n{{");
    stream.write_all(head.as_bytes()).expect("writing a head");
    stream
}

/// A gRPC call left open with its message unfinished.
pub struct PartialCall {
    /// What the server answers, once it does.
    pub answer: h2::client::ResponseFuture,
    _send: h2::SendStream<axum::body::Bytes>,
    _connection: tokio::task::JoinHandle<()>,
}

/// Opens, on a connection of its own to `address`, a gRPC call to `path`
/// whose message announces `announced` bytes of which only `sent` follow.
pub async fn partial_call(address: &str, path: &str, announced: u32, sent: usize) -> PartialCall {
    let tcp = tokio::net::TcpStream::connect(address).await.expect("connecting to gRPC");
    let (client, connection) = h2::client::handshake(tcp).await.expect("an HTTP/2 handshake");
    let connection = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.expect("a stream");
    let request = axum::http::Request::post(format!("http://{address}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a request");
    let (answer, mut send) = client.send_request(request, false).expect("sending the head");
    let mut message = vec![0u8];
    message.extend_from_slice(&announced.to_be_bytes());
    message.resize(5 + sent, 0);
    send.send_data(axum::body::Bytes::from(message), false).expect("sending part of the message");
    PartialCall { answer, _send: send, _connection: connection }
}

/// The gRPC status and `baton-error-kind` a call ended with.
pub async fn grpc_status(answer: h2::client::ResponseFuture) -> (String, String) {
    let response = answer.await.expect("an answer");
    let header = |h: &axum::http::HeaderMap, name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (status, kind) = (header(response.headers(), "grpc-status"), header(response.headers(), "baton-error-kind"));
    if let Some(status) = status {
        return (status, kind.unwrap_or_default());
    }
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        data.expect("the answer's data");
    }
    let trailers = body.trailers().await.expect("trailers").unwrap_or_default();
    (header(&trailers, "grpc-status").unwrap_or_default(), header(&trailers, "baton-error-kind").unwrap_or_default())
}
