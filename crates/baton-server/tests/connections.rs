//! Connections the server bounds: a head that does not arrive within the
//! header read timeout, a keep-alive connection idle past the idle
//! timeout, a gRPC client that never finishes its handshake, and
//! connections past a listener's bound, which wait unaccepted in the
//! kernel's queue and cost the server no descriptor.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use baton_protocol::grpc::{pb, pb_baton};
use baton_testkit::server::{PATIENCE, eventually};
use common::conn::{
    accept_queue, answered_connection, is_closed, metric_now, open_files, port_of, read_status, send_get, wait_closed,
};
use common::{repo_with, start};

fn closed_total(base: &str, listener: &str, reason: &str) -> f64 {
    metric_now(base, &format!(r#"baton_connections_closed_total{{listener="{listener}",reason="{reason}"}}"#))
}

/// Waits until `/v2/health/ready` answers 200 on connections that close
/// after their answer, so that no client keeps a connection open.
fn wait_ready_closing(address: &str) {
    eventually("the server to be ready", || {
        let mut stream = TcpStream::connect(address).ok()?;
        stream.write_all(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").ok()?;
        stream.set_read_timeout(Some(PATIENCE)).ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).ok()?;
        answer.starts_with(b"HTTP/1.1 200").then_some(())
    });
}

/// Reads an answer's head (for an answer that streams).
fn read_head(stream: &mut TcpStream) -> String {
    stream.set_read_timeout(Some(PATIENCE)).expect("a read timeout");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).expect("reading a head"), 1, "closed before the head");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

#[test]
fn idle_keep_alive_connections_are_closed_after_the_idle_timeout_but_an_open_stream_is_not() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &["--idle-timeout", "1s", "--no-watch"]);
    let address = server.base().trim_start_matches("http://").to_owned();
    wait_ready_closing(&address);

    // An event stream: an answer still being written, however quiet.
    let mut events = TcpStream::connect(&address).expect("connecting");
    send_get(&mut events, "/baton/v1/events");
    assert!(read_head(&mut events).starts_with("HTTP/1.1 200"));
    // Two keep-alive connections, one after the other, each closed once
    // idle: the stream, opened before both, would have been closed before
    // either had it counted as idle.
    for n in 1..=2 {
        let mut idle = answered_connection(&address);
        wait_closed(&mut idle, &format!("idle keep-alive connection {n}"));
    }
    assert!(!is_closed(&mut events), "the event stream was closed as idle");
    assert!(closed_total(server.base(), "http", "idle_timeout") >= 2.0);

    // gRPC: an idle connection is closed too, and the client's next call
    // connects again.
    let runtime = common::grpc::runtime();
    let mut client = runtime.block_on(common::grpc::client(&server));
    runtime.block_on(client.server_live(pb::ServerLiveRequest {})).expect("a first call");
    eventually("the idle gRPC connection to be closed", || {
        (closed_total(server.base(), "grpc", "idle_timeout") >= 1.0).then_some(())
    });
    let live = runtime.block_on(client.server_live(pb::ServerLiveRequest {})).expect("a call after the close");
    assert!(live.into_inner().live);
    common::assert_no_panic(&server);
}

#[test]
fn heads_and_handshakes_that_do_not_arrive_within_the_header_read_timeout_are_closed() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &["--header-read-timeout", "1s", "--no-watch"]);
    let address = server.base().trim_start_matches("http://").to_owned();
    wait_ready_closing(&address);

    // Sends nothing at all.
    let mut silent = TcpStream::connect(&address).expect("connecting");
    // A second request whose head trickles after an answered first one.
    let mut second = answered_connection(&address);
    second.write_all(b"GET /v2/health/live HTTP/1.1\r\n").expect("a request line");
    // gRPC: the client preface and a SETTINGS frame that says 600 bytes
    // follow, then those bytes one at a time.
    let mut grpc = TcpStream::connect(server.grpc_address()).expect("connecting to gRPC");
    grpc.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").expect("the preface");
    grpc.write_all(&[0, 2, 0x58, 4, 0, 0, 0, 0, 0]).expect("a SETTINGS frame header");

    let deadline = Instant::now() + PATIENCE;
    while !(is_closed(&mut second) && is_closed(&mut grpc)) {
        assert!(Instant::now() < deadline, "a trickling head or handshake was kept open for {PATIENCE:?}");
        let _ = second.write_all(b"x");
        let _ = grpc.write_all(&[0]);
        // The slow client's pace.
        std::thread::sleep(Duration::from_millis(300));
    }
    wait_closed(&mut silent, "a connection that sent nothing");
    assert!(closed_total(server.base(), "http", "header_timeout") >= 2.0);
    assert!(closed_total(server.base(), "grpc", "header_timeout") >= 1.0);
    common::assert_no_panic(&server);
}

/// An event stream on a connection of its own: a request that stays in
/// flight, so its connection is never closed to make room.
fn event_stream(address: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).expect("connecting");
    send_get(&mut stream, "/baton/v1/events");
    assert!(read_head(&mut stream).starts_with("HTTP/1.1 200"));
    stream
}

#[test]
fn connections_past_a_listeners_bound_wait_unaccepted_and_cost_the_server_nothing() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &["--max-connections", "3", "--header-read-timeout", "60s", "--no-watch"]);
    let address = server.base().trim_start_matches("http://").to_owned();
    let pid = server.pid();
    wait_ready_closing(&address);

    // REST: three connections busy with a request each; a fourth waits in
    // the kernel's accept queue until one of them closes.
    let mut held: Vec<TcpStream> = (0..3).map(|_| event_stream(&address)).collect();
    let before = open_files(pid);
    let mut waiting = TcpStream::connect(&address).expect("connecting");
    send_get(&mut waiting, "/v2/health/live");
    eventually("the fourth connection to wait unaccepted", || {
        (accept_queue(pid, port_of(&address)) == Some(1)).then_some(())
    });
    assert!(open_files(pid) <= before, "a connection past the bound took a descriptor");
    drop(held.remove(0));
    assert_eq!(read_status(&mut waiting), 200, "the waiting connection is served once there is room");

    // gRPC: the same bound, three connections each with an event stream.
    let grpc_port = port_of(server.grpc_address());
    let runtime = common::grpc::runtime();
    let mut streams: Vec<_> = (0..3)
        .map(|_| {
            runtime.block_on(async {
                let (_, management) = common::grpc::clients_at(server.grpc_address()).await;
                let mut client = management.clone();
                let events = client.events(pb_baton::EventsRequest::default());
                let events = common::grpc::within("an event stream", events).await.expect("an event stream");
                (management, events)
            })
        })
        .collect();
    let mut extra = TcpStream::connect(server.grpc_address()).expect("connecting to gRPC");
    eventually("a fourth gRPC connection to wait unaccepted", || {
        (accept_queue(pid, grpc_port) == Some(1)).then_some(())
    });
    drop(streams.remove(0));
    eventually("the waiting gRPC connection to be accepted", || {
        (accept_queue(pid, grpc_port) == Some(0)).then_some(())
    });
    extra.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").expect("the preface");
    drop((streams, held, extra));
    common::assert_no_panic(&server);
}

#[test]
fn at_the_bound_a_connection_that_waits_for_a_request_makes_room_for_a_new_one() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &["--max-connections", "3", "--header-read-timeout", "120s", "--no-watch"]);
    let address = server.base().trim_start_matches("http://").to_owned();
    wait_ready_closing(&address);

    // One connection busy with a request, two that never send one.
    let mut events = event_stream(&address);
    let mut silent: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&address).expect("connecting")).collect();
    // A new connection is served long before the silent ones' header
    // read timeout: the older silent one is closed to make room.
    let mut new = TcpStream::connect(&address).expect("connecting");
    send_get(&mut new, "/v2/health/live");
    assert_eq!(read_status(&mut new), 200);
    wait_closed(&mut silent[0], "the oldest connection without a request");
    assert!(!is_closed(&mut events), "a connection with a request in flight was closed to make room");
    assert!(closed_total(server.base(), "http", "evicted") >= 1.0);
    common::assert_no_panic(&server);
}
