//! Management requests a browser was made to send, black box. A loopback
//! listener without a token lets any local client manage models; a web
//! page open in the operator's browser is not such a client. Its requests
//! say so (`Origin`, `Sec-Fetch-Site`) or, for a page that rebinds its own
//! name to 127.0.0.1, carry that name in `Host`: each is refused with 403
//! and changes nothing, while curl-like clients and the console on its own
//! origin go through.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;

use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Server, eventually};
use common::{repo_with, start};
use serde_json::Value;

/// Sends `POST path` with [`LOAD_1`] and the `headers` given (`host`
/// among them, or the server's address), and returns the status and the
/// body's JSON.
fn post(server: &Server, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let address = server.base().trim_start_matches("http://").to_owned();
    let mut head = format!("POST {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("host: {address}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!(
        "content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{LOAD_1}",
        LOAD_1.len()
    ));
    let mut stream = TcpStream::connect(&address).expect("connecting to baton");
    stream.write_all(head.as_bytes()).expect("sending");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("reading the answer");
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A load of version 1 while version 2 serves: what a page would make a
/// browser send to change what serves.
const LOAD_1: &str = r#"{"version": 1}"#;
const LOAD: &str = "/baton/v1/models/m/load";

fn serving(server: &Server) -> Option<u64> {
    server.status("m")["serving"].as_u64()
}

/// Starts a server on a repository where `m` has versions 1 and 2, and
/// waits until version 2 serves.
fn two_versions(args: &[&str]) -> (TestRepo, Server) {
    let repo = repo_with("m", &[1, 2], "");
    let mut all = vec!["--model-control", "explicit", "--load-model", "m"];
    all.extend_from_slice(args);
    let server = start(&repo, &all);
    eventually("version 2 to serve", || (serving(&server) == Some(2)).then_some(()));
    (repo, server)
}

#[test]
fn a_browsers_cross_site_or_rebound_request_manages_nothing() {
    let (_repo, server) = two_versions(&[]);
    let own = server.base().to_owned();
    for (headers, kind) in [
        (vec![("origin", "https://evil.example"), ("sec-fetch-site", "cross-site")], "cross_site"),
        (vec![("sec-fetch-site", "same-site")], "cross_site"),
        (vec![("origin", "null")], "cross_site"),
        (vec![("host", "evil.example:8000"), ("origin", "http://evil.example:8000")], "untrusted_host"),
        (vec![("host", "evil.example")], "untrusted_host"),
    ] {
        let (status, body) = post(&server, LOAD, &headers);
        assert_eq!(status, 403, "{headers:?}: {body}");
        assert_eq!(body["kind"], kind, "{headers:?}: {body}");
        assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{body}");
        assert_eq!(serving(&server), Some(2), "{headers:?} loaded version 1");
    }
    // The console on its own origin, as a browser sends it, goes through.
    let (status, body) = post(&server, LOAD, &[("origin", &own), ("sec-fetch-site", "same-origin")]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(serving(&server), Some(1));
}

#[test]
fn with_a_token_the_host_is_not_checked_but_another_sites_page_still_is() {
    let (_dir, token) = common::token_file("t0ken-For-Browsers");
    let (_repo, server) = two_versions(&["--admin-token-file", &token]);
    let authorization = "Bearer t0ken-For-Browsers";
    let (status, body) = post(&server, LOAD, &[("authorization", authorization), ("origin", "https://evil.example")]);
    assert_eq!((status, body["kind"].as_str()), (403, Some("cross_site")), "{body}");
    assert_eq!(serving(&server), Some(2));
    // The console behind a proxy that rewrites Host: the browser says the
    // request is its page's own.
    let proxied =
        [("authorization", authorization), ("origin", "https://baton.example"), ("sec-fetch-site", "same-origin")];
    let (status, body) = post(&server, LOAD, &proxied);
    assert_eq!(status, 200, "{body}");
    assert_eq!(serving(&server), Some(1));
    // A proxy that keeps its own name in Host: the token protects it.
    let (status, body) = post(&server, LOAD, &[("authorization", authorization), ("host", "baton.example")]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(serving(&server), Some(1));
}
