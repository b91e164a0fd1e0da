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
    accept_queue, answered_connection, is_closed, metric_now, open_files, port_of, read_status, send_get, slow_body,
    wait_closed,
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

/// An event stream on a connection of its own: a quiet request, which
/// makes room for a new client at the listener's bound.
fn event_stream(address: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).expect("connecting");
    send_get(&mut stream, "/baton/v1/events");
    assert!(read_head(&mut stream).starts_with("HTTP/1.1 200"));
    stream
}

#[test]
fn connections_past_a_listeners_bound_wait_unaccepted_and_cost_the_server_nothing() {
    let repo = repo_with("m", &[1], "");
    let args = ["--max-connections", "3", "--header-read-timeout", "60s", "--body-read-timeout", "60s", "--no-watch"];
    let server = start(&repo, &args);
    let address = server.base().trim_start_matches("http://").to_owned();
    let pid = server.pid();
    wait_ready_closing(&address);

    // REST: three connections busy with a request each (a body under
    // way); a fourth waits in the kernel's accept queue until one of them
    // closes.
    let mut held: Vec<TcpStream> = (0..3).map(|_| slow_body(&address, "/v2/repository/index", 1000)).collect();
    eventually("three connections accepted", || (accept_queue(pid, port_of(&address)) == Some(0)).then_some(()));
    let before = open_files(pid);
    let mut waiting = TcpStream::connect(&address).expect("connecting");
    send_get(&mut waiting, "/v2/health/live");
    eventually("the fourth connection to wait unaccepted", || {
        (accept_queue(pid, port_of(&address)) == Some(1)).then_some(())
    });
    assert!(open_files(pid) <= before, "a connection past the bound took a descriptor");
    assert_eq!(accept_queue(pid, port_of(&address)), Some(1), "a request in flight was closed to make room");
    drop(held.remove(0));
    assert_eq!(read_status(&mut waiting), 200, "the waiting connection is served once there is room");

    // gRPC: the same bound, three connections each with a call whose
    // message is under way.
    let grpc_port = port_of(server.grpc_address());
    let runtime = common::grpc::runtime();
    let infer = "/inference.GRPCInferenceService/ModelInfer";
    let mut calls: Vec<_> =
        (0..3).map(|_| runtime.block_on(common::conn::partial_call(server.grpc_address(), infer, 1000, 10))).collect();
    eventually("three gRPC connections accepted", || (accept_queue(pid, grpc_port) == Some(0)).then_some(()));
    let mut extra = TcpStream::connect(server.grpc_address()).expect("connecting to gRPC");
    eventually("a fourth gRPC connection to wait unaccepted", || {
        (accept_queue(pid, grpc_port) == Some(1)).then_some(())
    });
    drop(runtime.block_on(async { calls.remove(0) }));
    eventually("the waiting gRPC connection to be accepted", || {
        (accept_queue(pid, grpc_port) == Some(0)).then_some(())
    });
    extra.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").expect("the preface");
    runtime.block_on(async { drop(calls) });
    drop((held, extra));
    common::assert_no_panic(&server);
}

#[test]
fn at_the_bound_a_connection_that_waits_for_a_request_makes_room_for_a_new_one() {
    let repo = repo_with("m", &[1], "");
    let args = ["--max-connections", "3", "--header-read-timeout", "120s", "--body-read-timeout", "120s", "--no-watch"];
    let server = start(&repo, &args);
    let address = server.base().trim_start_matches("http://").to_owned();
    wait_ready_closing(&address);

    // One connection busy with a request, two that never send one.
    let mut busy = slow_body(&address, "/v2/repository/index", 1000);
    let mut silent: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&address).expect("connecting")).collect();
    // A new connection is served long before the silent ones' header
    // read timeout: the older silent one is closed to make room.
    let mut new = TcpStream::connect(&address).expect("connecting");
    send_get(&mut new, "/v2/health/live");
    assert_eq!(read_status(&mut new), 200);
    wait_closed(&mut silent[0], "the oldest connection without a request");
    assert!(!is_closed(&mut busy), "a connection with a request in flight was closed to make room");
    assert!(closed_total(server.base(), "http", "evicted") >= 1.0);
    common::assert_no_panic(&server);
}

/// Reads one answer's status within `within`, failing the test past it.
fn status_within(stream: &mut TcpStream, within: Duration, what: &str) -> u16 {
    let started = Instant::now();
    stream.set_read_timeout(Some(within)).expect("a read timeout");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            Ok(_) => panic!("{what}: the server closed the connection before answering"),
            Err(e) => panic!("{what}: no answer within {within:?} ({e}); head so far: {head:?}"),
        }
        assert!(started.elapsed() < within, "{what}: no answer within {within:?}");
    }
    let head = String::from_utf8_lossy(&head);
    head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("a status code")
}

#[test]
fn event_streams_at_a_listeners_bound_make_room_for_new_clients() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &["--max-connections", "3", "--header-read-timeout", "1s", "--no-watch"]);
    let address = server.base().trim_start_matches("http://").to_owned();
    wait_ready_closing(&address);

    // REST: every slot holds an event stream, which never ends by itself.
    let mut streams: Vec<TcpStream> = (0..3).map(|_| event_stream(&address)).collect();
    let mut fresh = TcpStream::connect(&address).expect("connecting");
    send_get(&mut fresh, "/v2/health/live");
    assert_eq!(status_within(&mut fresh, Duration::from_secs(5), "a new client beside three event streams"), 200);
    // The stream that made room ended, as an SSE client sees it end (and
    // connects again).
    eventually("an event stream to end", || streams.iter_mut().any(is_closed).then_some(()));
    assert!(closed_total(server.base(), "http", "evicted") >= 1.0);
    drop((streams, fresh));

    // gRPC: the same with three connections each holding an event stream.
    let runtime = common::grpc::runtime();
    let mut held: Vec<_> = (0..3)
        .map(|_| {
            runtime.block_on(async {
                let (_, mut management) = common::grpc::clients_at(server.grpc_address()).await;
                let events = management.events(pb_baton::EventsRequest::default());
                common::grpc::within("an event stream", events).await.expect("an event stream").into_inner()
            })
        })
        .collect();
    let live = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), async {
            let (mut inference, _) = common::grpc::clients_at(server.grpc_address()).await;
            inference.server_live(pb::ServerLiveRequest {}).await
        })
        .await
    });
    let live = live.expect("a new gRPC client beside three event streams: no answer within 5 s");
    assert!(live.expect("ServerLive").into_inner().live);
    // The stream that made room ends with UNAVAILABLE, which clients retry.
    let ended = runtime.block_on(async {
        let mut endings = Vec::new();
        for stream in &mut held {
            let next = tokio::time::timeout(Duration::from_millis(200), stream.message()).await;
            if let Ok(next) = next {
                endings.push(next);
            }
        }
        endings
    });
    let unavailable = ended.iter().filter(|e| e.as_ref().is_err_and(|s| s.code() == tonic::Code::Unavailable));
    assert!(unavailable.count() >= 1, "no event stream ended with UNAVAILABLE: {ended:?}");
    common::assert_no_panic(&server);
}

#[test]
fn the_bodies_of_unknown_paths_are_not_buffered() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &["--no-watch"]);
    let address = server.base().trim_start_matches("http://").to_owned();
    wait_ready_closing(&address);
    let rss = || common::conn::resident_bytes(server.pid());
    let before = rss();

    // Six clients each send 60 MiB of a declared 64 MiB body to a path
    // that does not exist, then stall.
    const SENT: usize = 60 << 20;
    let senders: Vec<_> = (0..6)
        .map(|_| {
            let address = address.clone();
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(&address).expect("connecting");
                let head = format!("POST /nope HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n", (64 << 20) - 1);
                stream.write_all(head.as_bytes()).expect("a head");
                stream.set_write_timeout(Some(Duration::from_secs(5))).expect("a write timeout");
                let chunk = vec![b'x'; 1 << 20];
                let mut sent = 0;
                while sent < SENT && stream.write_all(&chunk).is_ok() {
                    sent += chunk.len();
                }
                (stream, sent)
            })
        })
        .collect();
    let mut most = before;
    let mut senders: Vec<_> = senders.into_iter().map(|s| s.join().expect("a sender")).collect();
    for _ in 0..10 {
        most = most.max(rss());
        std::thread::sleep(Duration::from_millis(50));
    }
    let grown = most.saturating_sub(before);
    assert!(grown < 128 << 20, "the server grew by {} MiB for six bodies sent to /nope", grown >> 20);
    // Each was answered 404 and its connection closed, not held.
    for (stream, sent) in &mut senders {
        let _ = sent;
        wait_closed(stream, "a connection whose body went to /nope");
    }
    common::assert_no_panic(&server);
}

#[test]
fn grpc_bounds_the_streams_of_a_connection() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &["--no-watch"]);
    let mut stream = TcpStream::connect(server.grpc_address()).expect("connecting to gRPC");
    stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").expect("the preface");
    stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).expect("an empty SETTINGS frame");
    stream.set_read_timeout(Some(PATIENCE)).expect("a read timeout");
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).expect("the server's first frame");
    assert_eq!(head[3], 4, "the server's first frame is SETTINGS: {head:?}");
    let length = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut settings = vec![0u8; length];
    stream.read_exact(&mut settings).expect("the server's settings");
    let entries: Vec<(u16, u32)> = settings
        .chunks_exact(6)
        .map(|e| (u16::from_be_bytes([e[0], e[1]]), u32::from_be_bytes([e[2], e[3], e[4], e[5]])))
        .collect();
    let streams = entries.iter().find(|(id, _)| *id == 3).map(|(_, n)| *n);
    assert!(streams.is_some_and(|n| (1..=1000).contains(&n)), "SETTINGS_MAX_CONCURRENT_STREAMS: {entries:?}");
}

#[test]
fn the_rest_port_speaks_http1_only() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &["--no-watch"]);
    let address = server.base().trim_start_matches("http://").to_owned();
    wait_ready_closing(&address);
    let mut stream = TcpStream::connect(&address).expect("connecting");
    stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").expect("the preface");
    stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).expect("an empty SETTINGS frame");
    stream.set_read_timeout(Some(PATIENCE)).expect("a read timeout");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    // An HTTP/2 server answers with a SETTINGS frame: 9 bytes whose fourth is 4.
    let http2 = answer.len() >= 9 && answer[3] == 4 && !answer.starts_with(b"HTTP/");
    assert!(!http2, "the REST port answered HTTP/2: {answer:?}");
    assert!(answer.is_empty() || answer.starts_with(b"HTTP/1.1 "), "{:?}", String::from_utf8_lossy(&answer));
}

#[test]
fn slow_bodies_are_refused_at_the_body_read_timeout_and_do_not_lock_a_listener_out() {
    let repo = repo_with("m", &[1], "");
    let args = ["--max-connections", "3", "--header-read-timeout", "1s", "--body-read-timeout", "1s", "--no-watch"];
    let server = start(&repo, &args);
    let address = server.base().trim_start_matches("http://").to_owned();
    wait_ready_closing(&address);

    // Every slot holds a request whose body stops after its first byte:
    // an inference and two of the routes that buffer a small JSON body.
    let mut slow: Vec<TcpStream> = ["/v2/models/m/infer", "/v2/repository/index", "/v2/repository/index"]
        .iter()
        .map(|path| slow_body(&address, path, 1000))
        .collect();
    let mut fresh = TcpStream::connect(&address).expect("connecting");
    send_get(&mut fresh, "/v2/health/live");
    let within = Duration::from_secs(1 + 5);
    assert_eq!(status_within(&mut fresh, within, "a new client beside three slow bodies"), 200);
    for (n, stream) in slow.iter_mut().enumerate() {
        let answer = whole_answer(stream, within);
        assert!(answer.starts_with("HTTP/1.1 408"), "slow body {n}: {answer}");
        assert!(answer.contains(r#""kind":"body_timeout""#), "slow body {n}: {answer}");
        assert!(answer.to_ascii_lowercase().contains("connection: close"), "slow body {n}: {answer}");
    }
    let timed_out = metric_now(server.base(), r#"baton_body_timeouts_total{protocol="rest"}"#);
    assert!(timed_out >= 3.0, "{timed_out} body timeouts counted");
    common::assert_no_panic(&server);
}

/// Slow bodies hold every slot of a listener whose body read timeout is
/// long (30 s by default): at the bound, with a client waiting, the body
/// that has been too slow the longest is refused (408 `body_stalled`) and
/// its connection closed, so the new client is answered within seconds.
/// Bodies that trickle a byte now and then are as slow as ones that
/// stopped.
#[test]
fn at_the_bound_a_stalled_body_makes_room_when_no_idle_connection_can() {
    for trickle in [false, true] {
        stalled_bodies_make_room(trickle);
    }
}

fn stalled_bodies_make_room(trickle: bool) {
    let repo = repo_with("m", &[1], "");
    // Metrics are read on the admin listener, which has slots of its own.
    let mut server = start(&repo, &["--max-connections", "3", "--admin-http", "127.0.0.1:0", "--no-watch"]);
    let admin = format!("http://{}", common::listening_address(&server.next_line()));
    let address = server.base().trim_start_matches("http://").to_owned();
    wait_ready_closing(&address);
    let mut slow: Vec<TcpStream> = (0..3).map(|_| slow_body(&address, "/v2/models/m/infer", 1000)).collect();
    eventually("the three slow bodies to hold every slot", || {
        (metric_now(&admin, r#"baton_connections{listener="http"}"#) >= 3.0).then_some(())
    });
    // A byte every 300 ms from each, on a thread of its own, while the new
    // client waits.
    let trickling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(trickle));
    let writers: Vec<TcpStream> = slow.iter().map(|s| s.try_clone().expect("a clone of a socket")).collect();
    let trickler = {
        let trickling = std::sync::Arc::clone(&trickling);
        std::thread::spawn(move || {
            let mut writers = writers;
            while trickling.load(std::sync::atomic::Ordering::Acquire) {
                for writer in &mut writers {
                    let _ = writer.write_all(b" ");
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let mut fresh = TcpStream::connect(&address).expect("connecting");
    send_get(&mut fresh, "/v2/health/live");
    let status = status_within(&mut fresh, Duration::from_secs(5), "a new client beside three slow bodies");
    trickling.store(false, std::sync::atomic::Ordering::Release);
    trickler.join().expect("the trickling thread");
    assert_eq!(status, 200);
    let refused = eventually("a slow body to be refused", || {
        slow.iter_mut().position(|stream| {
            let _ = stream.set_nonblocking(true);
            let mut peek = [0u8; 1];
            let ready = stream.peek(&mut peek).is_ok_and(|n| n == 1);
            let _ = stream.set_nonblocking(false);
            ready
        })
    });
    let answer = whole_answer(&mut slow[refused], PATIENCE);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""kind":"body_stalled""#), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    assert!(metric_now(&admin, r#"baton_body_stalled_total{protocol="rest"}"#) >= 1.0);
    common::assert_no_panic(&server);
}

/// Everything the server sends on `stream` until it closes it, within
/// `within`.
fn whole_answer(stream: &mut TcpStream, within: Duration) -> String {
    stream.set_read_timeout(Some(within)).expect("a read timeout");
    let mut answer = Vec::new();
    let started = Instant::now();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("no whole answer within {within:?} ({e}): {:?}", String::from_utf8_lossy(&answer)),
        }
        assert!(started.elapsed() < within, "the connection stayed open: {:?}", String::from_utf8_lossy(&answer));
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn unfinished_grpc_messages_give_their_memory_back_at_the_body_read_timeout() {
    let repo = repo_with("m", &[1], "");
    let args = ["--request-memory-budget", "4MiB", "--body-read-timeout", "3s", "--no-watch"];
    let server = start(&repo, &args);
    server.wait_serving("m", 1);
    let runtime = common::grpc::runtime();
    // Four calls each announce a 2 MiB message, send just under 1 MiB of
    // it (prefix included) and stop: the whole budget is theirs but for a
    // few bytes, fewer than an inference's body.
    let infer = "/inference.GRPCInferenceService/ModelInfer";
    let sent = (1 << 20) - 5 - 10;
    let calls: Vec<_> = (0..4)
        .map(|_| runtime.block_on(common::conn::partial_call(server.grpc_address(), infer, 2 << 20, sent)))
        .collect();
    let started = Instant::now();
    let request = common::request(&[0.5; 8], 1).to_string();
    let client = server.client();
    let status = || {
        let answer =
            client.try_post_raw("/v2/models/m/infer", request.as_bytes(), &[("content-type", "application/json")]);
        answer.map(|a| a.status).unwrap_or(0)
    };
    eventually("the budget to be held by the unfinished calls", || (status() == 503).then_some(()));
    // Given back once their body read timeout passes.
    let deadline = started + Duration::from_secs(3 + 5);
    while status() != 200 {
        assert!(Instant::now() < deadline, "inference still refused {:?} after the calls began", started.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    for call in calls {
        let (status, kind) = runtime.block_on(common::grpc::within("an unfinished call's end", async {
            common::conn::grpc_status(call.answer).await
        }));
        assert_eq!((status.as_str(), kind.as_str()), ("4", "body_timeout"), "DEADLINE_EXCEEDED, body_timeout");
    }
    let timed_out = metric_now(server.base(), r#"baton_body_timeouts_total{protocol="grpc"}"#);
    assert!(timed_out >= 4.0, "{timed_out} body timeouts counted");
    common::assert_no_panic(&server);
}

/// A connection to `address` whose receive buffer is `bytes`, set before
/// it connects (so the window it offers stays that small).
fn small_window_connection(address: &str, bytes: usize) -> TcpStream {
    use rustix::net::{AddressFamily, SocketType, connect, socket, sockopt};
    let address: std::net::SocketAddr = address.parse().expect("an address");
    let socket = socket(AddressFamily::INET, SocketType::STREAM, None).expect("a socket");
    sockopt::set_socket_recv_buffer_size(&socket, bytes).expect("SO_RCVBUF");
    connect(&socket, &address).expect("connecting");
    TcpStream::from(socket)
}

#[test]
fn a_client_that_never_reads_its_answer_loses_its_connection_at_the_send_timeout() {
    // A model whose answer is several MiB: 4,096 outputs a row.
    let wide = baton_testkit::onnx::Mlp::new(&[8, 4096], 7);
    let repo = baton_testkit::repo::TestRepo::new();
    repo.add_model("wide", &baton_testkit::repo::mlp_toml(&wide, ""));
    repo.publish_mlp("wide", 1, &wide);
    let args = ["--max-connections", "2", "--idle-timeout", "1s", "--send-timeout", "1s", "--no-watch"];
    let server = start(&repo, &args);
    server.wait_serving("wide", 1);
    let address = server.base().trim_start_matches("http://").to_owned();

    // Two clients ask for 64 rows (about 3 MiB of JSON) and read nothing.
    let body = common::request(&[0.5; 8 * 64], 64).to_string();
    let head = format!(
        "POST /v2/models/wide/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let _stuck: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut stream = small_window_connection(&address, 4096);
            stream.write_all(head.as_bytes()).expect("a head");
            stream.write_all(body.as_bytes()).expect("a body");
            stream
        })
        .collect();
    let mut fresh = TcpStream::connect(&address).expect("connecting");
    send_get(&mut fresh, "/v2/health/live");
    assert_eq!(status_within(&mut fresh, Duration::from_secs(1 + 5), "a new client beside two stuck readers"), 200);
    assert!(closed_total(server.base(), "http", "send_timeout") >= 1.0);
    common::assert_no_panic(&server);
}
