//! Listening sockets passed to baton, as systemd's socket activation
//! passes them (`LISTEN_PID`, `LISTEN_FDS`, `LISTEN_FDNAMES`), through the
//! real binary: baton serves KServe V2 over HTTP and gRPC and its admin
//! API on the sockets it was given, not on its flags' addresses; a passed
//! admin socket opens the admin listener without its flag; and a worker
//! process does not hold the server's listening sockets. And systemd's
//! notifications (`NOTIFY_SOCKET`): `READY=1` once baton serves; after an
//! upgrade, `MAINPID=` from the old process before it exits and from the
//! new one once it serves, with no `STOPPING=1` from the old one;
//! `STOPPING=1` at the end; and nothing at all from a new process the old
//! one gave up on, since the old one serves on.

mod common;

use std::net::TcpListener;

use baton_testkit::onnx::sample_input;
use baton_testkit::server::Server;
use common::grpc::{client, runtime, within};
use common::{SIZES, assert_close, bin, infer, listening_address, mlp, repo_with};

use baton_protocol::grpc::pb::ServerReadyRequest;

/// The socket inode a descriptor of `pid` points at, when it is a socket.
fn socket_of(pid: u32, fd: u32) -> Option<String> {
    let target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    let target = target.to_string_lossy().into_owned();
    target.starts_with("socket:").then_some(target)
}

/// Every socket `pid` holds.
fn sockets_of(pid: u32) -> Vec<String> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
    fds.iter().filter_map(|e| socket_of(pid, e.file_name().to_string_lossy().parse().ok()?)).collect()
}

#[test]
fn passed_sockets_are_served_in_place_of_the_flags_and_no_worker_holds_them() {
    let repo = repo_with("m", &[1], "[engine]\nisolation = \"process\"\nsessions = 1\n");
    let sockets: Vec<TcpListener> = (0..3).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addresses: Vec<String> = sockets.iter().map(|s| s.local_addr().unwrap().to_string()).collect();
    let passed = [("grpc", &sockets[1]), ("http", &sockets[0]), ("admin-http", &sockets[2])];
    // The flags' addresses (127.0.0.1:0) are not the ones served.
    let mut server = Server::start_passing(bin(), repo.root(), &[], &passed);
    // The test's own copies go: the server's are the listening ones now.
    drop(sockets);
    assert_eq!(server.base(), format!("http://{}", addresses[0]));
    assert_eq!(server.grpc_address(), addresses[1]);
    let admin = listening_address(&server.next_line());
    assert_eq!(admin, addresses[2], "the admin listener opened on its passed socket, without --admin-http");
    server.wait_serving("m", 1);
    let input = sample_input(SIZES[0], 1, 4);
    let (version, output) = infer(&server, "m", &input, 1);
    assert_eq!(version, 1);
    assert_close(&output, &mlp(1).forward(&input, 1), "over the passed HTTP socket");
    runtime().block_on(async {
        let mut c = client(&server).await;
        assert!(within("ready", c.server_ready(ServerReadyRequest {})).await.unwrap().into_inner().ready);
    });
    let status = baton_testkit::server::Client::new(&format!("http://{admin}")).get("/baton/v1/status");
    assert_eq!(status.status, 200, "the admin API on its passed socket");
    // The listening sockets are descriptors 3 to 5 of the server; its
    // worker holds none of them.
    let listening: Vec<String> = (3..6).filter_map(|fd| socket_of(server.pid(), fd)).collect();
    assert_eq!(listening.len(), 3, "{:?}", sockets_of(server.pid()));
    let worker = server.status("m")["live"][0]["worker"]["pid"].as_u64().expect("a worker") as u32;
    let held = sockets_of(worker);
    assert!(listening.iter().all(|s| !held.contains(s)), "the worker holds {held:?} of {listening:?}");
}

/// The next notification on `socket`, within the test's patience.
fn next_notification(socket: &std::os::unix::net::UnixDatagram) -> String {
    let mut buffer = [0u8; 512];
    socket.set_read_timeout(Some(baton_testkit::server::PATIENCE)).expect("a read timeout");
    let n = socket.recv(&mut buffer).expect("a notification from baton");
    String::from_utf8_lossy(&buffer[..n]).into_owned()
}

#[test]
fn systemd_hears_ready_the_new_main_pid_after_an_upgrade_and_stopping_at_the_end() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("notify");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("binding the notification socket");
    let repo = repo_with("m", &[1], "");
    let env = [("NOTIFY_SOCKET".to_owned(), path.display().to_string())];
    let mut server = Server::start_with_env(bin(), repo.root(), &[], &env);
    assert_eq!(next_notification(&socket), "READY=1");
    server.wait_serving("m", 1);
    let answer = common::upgrade::upgrade(server.base(), b"{}");
    assert_eq!(answer.status, 200, "{}", common::text(&answer.body));
    let new = answer.json()["new_pid"].as_u64().expect("the new pid") as u32;
    let _adopted = common::upgrade::Adopted(new);
    server.wait_exit();
    // The old process named the new one (a bare MAINPID=, which only the
    // old process sends) before it exited: it is queued by now. The new
    // process says it again, with READY=1, once it serves.
    socket.set_nonblocking(true).expect("a non-blocking socket");
    let mut heard = Vec::new();
    let mut buffer = [0u8; 512];
    while let Ok(n) = socket.recv(&mut buffer) {
        heard.push(String::from_utf8_lossy(&buffer[..n]).into_owned());
    }
    socket.set_nonblocking(false).expect("a blocking socket");
    assert!(heard.contains(&format!("MAINPID={new}")), "the old process exited before naming {new}: {heard:?}");
    let said_by_new = format!("MAINPID={new}\nREADY=1");
    if !heard.contains(&said_by_new) {
        assert_eq!(next_notification(&socket), said_by_new);
    }
    // The old process's shutdown said nothing; the new one's says STOPPING.
    std::process::Command::new("kill").args(["-TERM", &new.to_string()]).status().expect("kill");
    assert_eq!(next_notification(&socket), "STOPPING=1");
}

#[test]
fn a_new_process_the_old_one_gave_up_on_tells_systemd_nothing() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("notify");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("binding the notification socket");
    // Version 1 loads with the default warmup, quick; then the warmup grows
    // to batches that take the new process far longer than the upgrade's
    // second (the old one, not watching, keeps what it loaded).
    let repo = baton_testkit::repo::TestRepo::new();
    let slow = baton_testkit::onnx::Mlp::new(&[64, 4096, 4096, 2], 2001);
    repo.add_model("s", &baton_testkit::repo::mlp_toml(&slow, ""));
    repo.publish_mlp("s", 1, &slow);
    let env = [("NOTIFY_SOCKET".to_owned(), path.display().to_string())];
    let server = Server::start_with_env(bin(), repo.root(), &["--no-watch"], &env);
    assert_eq!(next_notification(&socket), "READY=1");
    server.wait_settled("s", 1);
    let long = "[warmup]\nbatch_sizes = [1024, 1024, 1024, 1024]\nmax_latency_ms = 600000\n";
    repo.add_model("s", &baton_testkit::repo::mlp_toml(&slow, long));

    let refused = common::upgrade::upgrade(server.base(), br#"{"timeout_s": 1}"#);
    assert_eq!(refused.status, 422, "{}", common::text(&refused.body));
    assert!(refused.error().contains("exited on SIGTERM"), "{}", refused.error());
    // The new process has exited: anything it said is in the socket now.
    socket.set_nonblocking(true).expect("a non-blocking socket");
    let mut buffer = [0u8; 512];
    let heard = socket.recv(&mut buffer).map(|n| String::from_utf8_lossy(&buffer[..n]).into_owned());
    assert!(heard.is_err(), "systemd was told {heard:?} by a process that never served");
    assert_eq!(server.get("/v2/health/ready").status, 200, "the old process serves on, ready");
}
