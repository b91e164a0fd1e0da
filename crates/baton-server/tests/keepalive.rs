//! A keep-alive connection survives every kind of POST, including the ones
//! whose handlers need nothing from the body (unload, rollback, retire, an
//! unknown path) and the ones that fail: the server reads each request's
//! body before it answers, or else tells the client it closes the
//! connection. Triton's clients send bodies with unload and keep their
//! connections open, so an answer given before the body was read, on a
//! connection the server then silently closes, fails their next request.
//!
//! Each request goes out as two writes, head then body, with a short look
//! in between for an early answer: the look only makes the test more likely
//! to catch a server that answers early; a correct server passes however
//! long it takes.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use baton_testkit::server::PATIENCE;
use common::{repo_with, start};

/// One HTTP/1.1 answer: status, whether it announced `connection: close`, body.
struct Reply {
    status: u16,
    closes: bool,
    body: String,
}

fn read_reply(stream: &mut TcpStream) -> Reply {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).expect("reading an answer head");
        assert_eq!(n, 1, "the server closed the connection before answering; head so far: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).expect("an ASCII head").to_ascii_lowercase();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("a status code");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("a content-length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("reading an answer body");
    Reply { status, closes: head.contains("connection: close"), body: String::from_utf8_lossy(&body).into_owned() }
}

/// Sends `method path` with `body` on the connection (head, a short look
/// for an early answer, then body) and reads the answer.
fn exchange(stream: &mut TcpStream, method: &str, path: &str, body: &[u8]) -> Reply {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("writing a request head");
    if body.is_empty() {
        return read_reply(stream);
    }
    stream.set_read_timeout(Some(Duration::from_millis(100))).expect("a read timeout");
    let early = matches!(stream.peek(&mut [0u8; 1]), Ok(n) if n > 0);
    stream.set_read_timeout(Some(PATIENCE)).expect("a read timeout");
    if early {
        // Answering before the body arrived is only fine when the server
        // then closes the connection and says so.
        let reply = read_reply(stream);
        assert!(
            reply.closes,
            "{method} {path} was answered ({}) before its body was sent, on a connection kept open",
            reply.status
        );
        return reply;
    }
    stream.write_all(body).expect("writing a request body");
    read_reply(stream)
}

#[test]
fn posts_that_ignore_or_refuse_their_body_keep_the_connection_usable() {
    let repo = repo_with("m", &[1, 2], "[policy]\nkeep_previous = 1");
    let server = start(&repo, &["--no-watch"]);
    server.wait_ready();
    server.wait_settled("m", 2);
    let address = server.base().trim_start_matches("http://").to_owned();
    let mut stream = TcpStream::connect(&address).expect("connecting to baton");

    let calls: [(&str, &str, &[u8], u16); 10] = [
        ("POST", "/v2/repository/models/nope/unload", b"{\"parameters\": {}}", 404),
        ("POST", "/baton/v1/models/m/rollback", b"{}", 409),
        ("POST", "/baton/v1/models/m/versions/7/retire", b"{}", 409),
        ("POST", "/v2/repository/models/m/load", b"{\"parameters\": {\"version\": 1}}", 200),
        ("POST", "/baton/v1/models/m/rollback", b"{}", 200),
        ("POST", "/v2/repository/models/m/unload", b"{\"parameters\": {\"unload_dependents\": false}}", 200),
        ("POST", "/v2/repository/models/m/load", b"{\"parameters\": {\"version\": \"x\"}}", 400),
        ("POST", "/v2/no/such/endpoint", b"{\"inputs\": []}", 404),
        ("POST", "/v2/models/m/versions/x/infer", b"{\"inputs\": []}", 400),
        ("POST", "/v2/repository/models/m/load", b"", 200),
    ];
    for (method, path, body, status) in calls {
        let reply = exchange(&mut stream, method, path, body);
        assert_eq!(reply.status, status, "{method} {path}: {}", reply.body);
        if reply.closes {
            stream = TcpStream::connect(&address).expect("connecting to baton again");
        }
    }
    // The connection still answers.
    let reply = exchange(&mut stream, "GET", "/v2/health/ready", b"");
    assert_eq!(reply.status, 200, "{}", reply.body);
    common::assert_no_panic(&server);
}
