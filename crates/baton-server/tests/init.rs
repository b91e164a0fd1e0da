//! `baton init` through the real binary, as a container runs it, though
//! here as a child subreaper rather than PID 1: it serves `baton serve`
//! as its main process; SIGTERM to init drains the server, and init exits
//! 0 with nothing left behind; SIGUSR2 to init reaches the server, whose
//! upgrade fails no request under traffic, and init follows the new main
//! process (it adopts it and reaps the old one) until a SIGTERM ends it;
//! a main process that fails at start makes init exit with its status.
//! init believes notifications from its own tree alone, and passes on to
//! a manager above it what the main process says, but `MAINPID=`.
//! And the installed layout: a binary at `PREFIX/bin/baton` finds ONNX
//! Runtime at `PREFIX/lib/baton/`, with no `ORT_DYLIB_PATH`, before the
//! broken one of a `.baton` directory above its working directory.

mod common;

use std::os::linux::net::SocketAddrExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use baton_testkit::onnx::sample_input;
use baton_testkit::server::{Client, Server, eventually};
use common::upgrade::{Adopted, gone};
use common::{SIZES, assert_close, bin, infer, mlp, repo_with, request};

/// A process's state letter and parent, from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    Some((rest.next()?.chars().next()?, rest.next()?.parse().ok()?))
}

/// Every process whose parent is `parent`, zombies included, with its
/// state letter.
fn children(parent: u32) -> Vec<(u32, char)> {
    let entries = std::fs::read_dir("/proc").expect("reading /proc");
    let pids = entries.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
    pids.filter_map(|pid| stat(pid).filter(|&(_, p)| p == parent).map(|(state, _)| (pid, state))).collect()
}

/// `baton init serve ...` on the repository, as [`Server::start`] starts
/// `baton serve`.
fn start_under_init(repo: &Path, args: &[&str]) -> Server {
    let mut command = Command::new(bin());
    command.arg("init");
    Server::start_command(command, repo, args)
}

/// The main process under `init`, once there is exactly one child
/// running `serve`: guarded, so that a test failing midway stops it.
fn main_process(init: u32) -> Adopted {
    Adopted(eventually("init's main process", || match common::children_of(init, "serve")[..] {
        [pid] => Some(pid),
        _ => None,
    }))
}

/// The pid the server reports in its status.
fn status_pid(server: &Server) -> u32 {
    common::server_status(server)["pid"].as_u64().expect("the status's pid") as u32
}

#[test]
fn init_serves_and_a_sigterm_to_it_drains_the_server_and_leaves_no_process_behind() {
    let repo = repo_with("m", &[1], "[engine]\nisolation = \"process\"\nsessions = 1\n");
    let mut server = start_under_init(repo.root(), &[]);
    let main = main_process(server.pid());
    assert_eq!(status_pid(&server), main.0, "the server is init's child");
    server.wait_serving("m", 1);
    let input = sample_input(SIZES[0], 1, 4);
    let (version, output) = infer(&server, "m", &input, 1);
    assert_eq!(version, 1);
    assert_close(&output, &mlp(1).forward(&input, 1), "served under init");
    let worker = server.status("m")["live"][0]["worker"]["pid"].as_u64().expect("a worker") as u32;
    // The worker is not given init's socket: it does not speak for the service.
    let environment = std::fs::read(format!("/proc/{worker}/environ")).expect("the worker's environment");
    assert!(!environment.split(|&b| b == 0).any(|v| v.starts_with(b"NOTIFY_SOCKET=")), "the worker has NOTIFY_SOCKET");
    // A process outside init's tree (this test) names the worker, a live
    // descendant of init, as the main process: it is not believed.
    let address = init_socket(&server);
    let sender = std::os::unix::net::UnixDatagram::unbound().expect("a datagram socket");
    sender.send_to_addr(format!("MAINPID={worker}").as_bytes(), &address).expect("sending to init's socket");
    eventually("init to ignore the stranger", || {
        server.log().contains("neither the main process nor under").then_some(())
    });

    let status = server.terminate();
    let log = server.log();
    assert_eq!(status.code(), Some(0), "init's status\n{log}");
    let passed = format!("Passing a signal on to the main process. signal=\"SIGTERM\" pid={}", main.0);
    assert!(log.contains(&passed), "{log}");
    assert!(log.contains("Shutting down"), "the server drained on init's SIGTERM\n{log}");
    assert!(log.contains(&format!("The main process exited. code=0 pid={}", main.0)), "{log}");
    // Init exits only once its main process has, and reaped it; the
    // worker, whose parent was the server, goes with it.
    assert!(stat(main.0).is_none(), "the server outlived init: {:?}", stat(main.0));
    eventually("the worker to exit", || gone(worker).then_some(()));
}

/// The abstract name of init's notification socket, from its log.
fn init_socket(server: &Server) -> std::os::unix::net::SocketAddr {
    let log = server.log();
    let name = log.split("socket=\"@").nth(1).and_then(|s| s.split('"').next()).expect("init's socket in its log");
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("an abstract name")
}

#[test]
fn a_stranger_flooding_init_s_socket_neither_keeps_it_from_exiting_nor_floods_its_log() {
    let repo = repo_with("m", &[1], "");
    let mut server = start_under_init(repo.root(), &[]);
    let _main = main_process(server.pid());
    server.wait_serving("m", 1);
    let address = init_socket(&server);
    // Blocking sends: the flood goes as fast as init reads, and ends when
    // init's socket is gone.
    let flood = std::thread::spawn(move || {
        let sender = std::os::unix::net::UnixDatagram::unbound().expect("a datagram socket");
        let mut sent = 0u64;
        while sender.send_to_addr(b"MAINPID=1\nREADY=1", &address).is_ok() {
            sent += 1;
        }
        sent
    });
    eventually("the flood to reach init", || server.log().contains("neither the main process nor under").then_some(()));
    let started = std::time::Instant::now();
    let status = server.terminate();
    let sent = flood.join().expect("the flood");
    let log = server.log();
    assert_eq!(status.code(), Some(0), "init's status\n{log}");
    let warnings = log.matches("neither the main process nor under").count() as u64;
    // One warning a second at most, from the first one on.
    let bound = started.elapsed().as_secs() + 2;
    assert!(warnings <= bound, "{warnings} warnings for {sent} datagrams, more than {bound}");
    assert!(sent > warnings, "{sent} datagrams, {warnings} warnings");
}

/// Requests to model `m` in a loop until stopped, each on a new
/// connection, so that some reach each process of an upgrade.
struct Traffic {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(u64, Vec<String>)>,
}

impl Traffic {
    fn start(base: &str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, base) = (Arc::clone(&stop), base.to_owned());
        let thread = std::thread::spawn(move || {
            let body = request(&sample_input(SIZES[0], 1, 3), 1).to_string();
            let (mut answered, mut failed) = (0, Vec::new());
            while !flag.load(Ordering::SeqCst) {
                let headers = [("content-type", "application/json")];
                match Client::new(&base).try_post_raw("/v2/models/m/infer", body.as_bytes(), &headers) {
                    Ok(answer) if answer.status == 200 => answered += 1,
                    Ok(answer) => failed.push(format!("{}: {}", answer.status, common::text(&answer.body))),
                    Err(error) => failed.push(error),
                }
            }
            (answered, failed)
        });
        Traffic { stop, thread }
    }

    /// Stops: the requests answered, and the failures.
    fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("the traffic thread")
    }
}

#[test]
fn sigusr2_to_init_upgrades_the_server_and_init_follows_the_new_main_process_to_the_end() {
    let repo = repo_with("m", &[1], "");
    // A manager above init, as systemd would be: init passes on what the
    // main process says there, but never a MAINPID (init stays its main).
    let dir = tempfile::tempdir().expect("a temp dir");
    let manager = std::os::unix::net::UnixDatagram::bind(dir.path().join("notify")).expect("a notification socket");
    manager.set_read_timeout(Some(baton_testkit::server::PATIENCE)).expect("a read timeout");
    let heard = || {
        let mut buffer = [0u8; 512];
        let n = manager.recv(&mut buffer).expect("a notification passed on by init");
        String::from_utf8_lossy(&buffer[..n]).into_owned()
    };
    let mut command = Command::new(bin());
    command.arg("init").env("NOTIFY_SOCKET", dir.path().join("notify"));
    let mut server = Server::start_command(command, repo.root(), &[]);
    let init = server.pid();
    let old = main_process(init);
    assert_eq!(heard(), "READY=1", "the first process's, passed on");
    server.wait_serving("m", 1);
    let traffic = Traffic::start(server.base());

    let sent = Command::new("kill").args(["-USR2", &init.to_string()]).status().expect("kill");
    assert!(sent.success());
    let new = Adopted(eventually("a new process to serve", || Some(status_pid(&server)).filter(|&p| p != old.0)));
    // The old process drains, exits and is reaped by init: no zombie of it
    // is left, and the new process, whose parent it was, is init's now.
    eventually("the old process to be reaped", || stat(old.0).is_none().then_some(()));
    assert_eq!(stat(new.0).map(|(_, parent)| parent), Some(init), "init adopted the new process");
    eventually("init to have no zombie child", || children(init).iter().all(|&(_, s)| s != 'Z').then_some(()));
    let (answered, failed) = traffic.stop();
    assert!(failed.is_empty(), "{} failed of {}: {:?}", failed.len(), answered, &failed[..failed.len().min(5)]);
    assert!(answered > 0, "no request was answered");
    let log = server.log();
    assert!(log.contains("Passing a signal on to the main process. signal=\"SIGUSR2\""), "{log}");
    assert!(log.contains(&format!("The main process changed. old_pid={} new_pid={}", old.0, new.0)), "{log}");
    assert!(!log.contains("The main process exited."), "init took the old process's exit as the end\n{log}");
    assert_eq!(server.get("/v2/health/ready").status, 200, "the new process serves, under init");
    assert_eq!(heard(), "READY=1", "the new process's, passed on without its MAINPID");

    let status = server.terminate();
    let log = server.log();
    assert_eq!(status.code(), Some(0), "init's status\n{log}");
    assert!(log.contains(&format!("Passing a signal on to the main process. signal=\"SIGTERM\" pid={}", new.0)));
    assert!(log.contains(&format!("The main process exited. code=0 pid={}", new.0)), "{log}");
    assert!(stat(new.0).is_none(), "the new process outlived init: {:?}", stat(new.0));
    assert_eq!(heard(), "STOPPING=1", "the new process's, passed on");
}

/// A cold upgrade: the old process drains and exits before the new one
/// serves, so init can only keep the container alive if it heard of the
/// new process before the old one exited (the old process names it at the
/// commit; the new one says nothing until it serves).
#[test]
fn a_cold_upgrade_under_init_keeps_init_and_the_new_process_running() {
    let repo = repo_with("m", &[1], "");
    let mut server = start_under_init(repo.root(), &[]);
    let init = server.pid();
    let old = main_process(init);
    server.wait_serving("m", 1);
    let answer = common::upgrade::upgrade(server.base(), br#"{"cold": true}"#);
    assert_eq!(answer.status, 200, "{}", common::text(&answer.body));
    let new = Adopted(answer.json()["new_pid"].as_u64().expect("the new pid") as u32);
    eventually("the old process to be reaped", || stat(old.0).is_none().then_some(()));
    eventually("the new process to serve", || {
        let status = Client::new(server.base()).try_get("/baton/v1/status").ok()?.json();
        (status["pid"] == new.0 && status["ready"] == true).then_some(())
    });
    let log = server.log();
    assert!(log.contains(&format!("The main process changed. old_pid={} new_pid={}", old.0, new.0)), "{log}");
    assert!(!log.contains("The main process exited."), "init took the old process's exit as the end\n{log}");
    assert_eq!(stat(new.0).map(|(_, parent)| parent), Some(init), "init adopted the new process");
    let status = server.terminate();
    assert_eq!(status.code(), Some(0), "init's status\n{}", server.log());
    assert!(stat(new.0).is_none(), "the new process outlived init: {:?}", stat(new.0));
}

/// As a container runs it: PID 1 of a pid namespace of its own (made by
/// `unshare`, which needs root, as the container tests do), where no
/// subreaper is involved and a signal without a handler would be ignored.
/// SIGUSR2 upgrades the server under traffic, twice, each new process
/// adopted by init, each old one reaped; SIGTERM then ends it all with
/// status 0.
#[test]
fn as_pid_1_init_passes_signals_on_follows_two_upgrades_and_exits_with_the_server() {
    let repo = repo_with("m", &[1], "");
    let mut command = Command::new("unshare");
    // --kill-child: should the test fail midway, killing unshare kills
    // init, and with it, the namespace's every process.
    command.args(["--pid", "--fork", "--mount-proc", "--kill-child"]).arg(bin()).arg("init");
    let mut server = Server::start_command(command, repo.root(), &[]);
    // Pids as seen from here, outside the namespace.
    let init = eventually("init, unshare's child", || match children(server.pid())[..] {
        [(pid, _)] => Some(pid),
        _ => None,
    });
    let mut main = main_process(init);
    server.wait_serving("m", 1);
    let mut inside = status_pid(&server);
    assert_eq!(inside, 2, "the server is the namespace's second process, init its first");
    let traffic = Traffic::start(server.base());
    // Twice: the second upgrade's old process is the first one's new
    // process, which init adopted.
    for _ in 0..2 {
        let sent = Command::new("kill").args(["-USR2", &init.to_string()]).status().expect("kill");
        assert!(sent.success());
        let next = eventually("a new process to serve", || Some(status_pid(&server)).filter(|&p| p != inside));
        eventually("the old process to be reaped", || stat(main.0).is_none().then_some(()));
        let changed = format!("The main process changed. old_pid={inside} new_pid={next}");
        assert!(server.log().contains(&changed), "{}", server.log());
        (main, inside) = (main_process(init), next);
    }
    let (answered, failed) = traffic.stop();
    assert!(failed.is_empty(), "{} failed of {}: {:?}", failed.len(), answered, &failed[..failed.len().min(5)]);
    assert!(answered > 0, "no request was answered");

    let sent = Command::new("kill").args(["-TERM", &init.to_string()]).status().expect("kill");
    assert!(sent.success());
    let status = server.wait_exit();
    let log = server.log();
    assert_eq!(status.code(), Some(0), "init's status, through unshare\n{log}");
    assert!(log.contains("baton stopped."), "the new process drained\n{log}");
    assert!(stat(main.0).is_none(), "the newest process outlived init: {:?}", stat(main.0));
}

#[test]
fn a_main_process_that_fails_at_start_makes_init_exit_with_its_status() {
    let bad_flag = Command::new(bin()).args(["init", "serve", "--no-such-flag"]).output().expect("running baton init");
    let said = common::text(&bad_flag.stderr);
    // clap's status for a command line it refuses.
    assert_eq!(bad_flag.status.code(), Some(2), "{said}");
    assert!(said.contains("--no-such-flag"), "{said}");
    assert!(said.contains("The main process exited. code=2"), "{said}");

    let missing = Command::new(bin()).args(["init", "package", "/nonexistent/version"]).output().expect("baton init");
    assert_eq!(missing.status.code(), Some(1), "{}", common::text(&missing.stderr));
}

#[test]
fn an_installed_binary_finds_onnx_runtime_under_its_prefix() {
    // A prefix outside the repository, where no `.baton` lies above
    // either the working directory or the binary.
    let prefix = tempfile::tempdir().expect("a temp dir");
    let above = prefix.path().ancestors().skip(1).find(|dir| dir.join(".baton/lib/libonnxruntime.so").exists());
    assert!(above.is_none(), "{above:?} holds a .baton of its own");
    let (binaries, libraries) = (prefix.path().join("bin"), prefix.path().join("lib/baton"));
    std::fs::create_dir_all(&binaries).and_then(|()| std::fs::create_dir_all(&libraries)).expect("the prefix");
    let installed = binaries.join("baton");
    std::fs::hard_link(bin(), &installed).or_else(|_| std::fs::copy(bin(), &installed).map(drop)).expect("the binary");
    let library = baton_onnx::runtime_path().expect("the library under test");
    std::os::unix::fs::symlink(&library, libraries.join("libonnxruntime.so")).expect("the library's link");

    // A working directory under a `.baton` of its own, whose library is
    // broken: the installed one comes first, and is the one loaded.
    let work = prefix.path().join("work");
    std::fs::create_dir_all(work.join(".baton/lib")).expect("the working directory");
    std::fs::write(work.join(".baton/lib/libonnxruntime.so"), b"not a library").expect("a broken library");
    let repo = repo_with("m", &[1], "");
    let mut command = Command::new(&installed);
    command.env_remove("ORT_DYLIB_PATH").current_dir(&work);
    let server = Server::start_command(command, repo.root(), &[]);
    server.wait_serving("m", 1);
    let input = sample_input(SIZES[0], 1, 4);
    assert_close(&infer(&server, "m", &input, 1).1, &mlp(1).forward(&input, 1), "served by the installed binary");
    let loaded = prefix.path().join("lib/baton/libonnxruntime.so");
    assert!(server.log().contains(&format!("ONNX Runtime loaded path={}", loaded.display())), "{}", server.log());
}

/// A SIGTERM to init while a warm upgrade loads: the stop wins. The old
/// process refuses to commit once it is shutting down (the new process
/// is stopped), or, had it committed first, init passes the SIGTERM on to
/// the new main process too. Either way init exits 0 once the server has
/// drained, and no process exits at once as on a second signal.
#[test]
fn a_sigterm_to_init_during_a_warm_upgrade_stops_the_service_cleanly() {
    let repo = repo_with("m", &[1], "");
    let mut server = start_under_init(repo.root(), &["--shutdown-delay", "3s"]);
    let init = server.pid();
    let old = main_process(init);
    server.wait_serving("m", 1);
    server.signal("USR2");
    let new = Adopted(eventually("the new process to start", || match common::children_of(old.0, "serve")[..] {
        [pid] => Some(pid),
        _ => None,
    }));
    server.signal("TERM");
    let status = server.wait_exit();
    let log = server.log();
    assert_eq!(status.code(), Some(0), "init's status\n{log}");
    assert!(!log.contains("A second signal: exiting at once"), "{log}");
    eventually("the new process to be gone", || gone(new.0).then_some(()));
}

/// A cold upgrade's new process is named main at the commit, while it
/// waits for the old one to exit: a SIGUSR2 passed on to it then must
/// not kill it (it has no handler yet), nor end init. It waits until the
/// handler is installed, and then upgrades the server, as SIGUSR2 does.
#[test]
fn a_sigusr2_right_after_a_cold_commit_does_not_kill_the_new_process() {
    let repo = repo_with("m", &[1], "");
    let mut server = start_under_init(repo.root(), &["--shutdown-delay", "3s"]);
    let init = server.pid();
    let old = main_process(init);
    server.wait_serving("m", 1);
    let answer = common::upgrade::upgrade(server.base(), br#"{"cold": true}"#);
    assert_eq!(answer.status, 200, "{}", common::text(&answer.body));
    let new = Adopted(answer.json()["new_pid"].as_u64().expect("the new pid") as u32);
    let passed = format!("Passing a signal on to the main process. signal=\"SIGUSR2\" pid={}", new.0);
    eventually("init to name the new process main", || {
        server.log().contains("The main process changed.").then_some(())
    });
    server.signal("USR2");
    eventually("init to pass SIGUSR2 on to the new process", || server.log().contains(&passed).then_some(()));
    eventually("the old process to be reaped", || stat(old.0).is_none().then_some(()));
    let serving = Adopted(eventually("a process under init to serve", || {
        assert!(stat(init).is_some_and(|(s, _)| s != 'Z'), "init exited\n{}", server.log());
        let status = Client::new(server.base()).try_get("/baton/v1/status").ok()?.json();
        let pid = status["pid"].as_u64()? as u32;
        (status["ready"] == true && stat(pid).map(|(_, parent)| parent) == Some(init)).then_some(pid)
    }));
    let log = server.log();
    assert!(log.contains("SIGUSR2: replacing this server"), "the new process handled SIGUSR2\n{log}");
    assert!(!log.contains("The main process exited."), "{log}");
    let status = server.terminate();
    assert_eq!(status.code(), Some(0), "init's status\n{}", server.log());
    assert!(gone(serving.0) && gone(new.0), "a server outlived init");
}

/// A process left under init once the main process has exited, which
/// exits on SIGTERM: init stops it and exits as soon as it has, without
/// waiting out its stop timeout or warning that it did not exit. Here the
/// main process is a second `baton init`, killed, whose server the outer
/// init adopts.
#[test]
fn init_exits_as_soon_as_the_processes_left_have_exited() {
    let repo = repo_with("m", &[1], "");
    let mut command = Command::new(bin());
    command.args(["init", "--stop-timeout", "600s", "init"]);
    let mut server = Server::start_command(command, repo.root(), &[]);
    let inner = eventually("the inner init", || match common::children_of(server.pid(), "init")[..] {
        [pid] => Some(pid),
        _ => None,
    });
    let serving = main_process(inner);
    server.wait_serving("m", 1);
    let killed = Command::new("kill").args(["-KILL", &inner.to_string()]).status().expect("kill");
    assert!(killed.success());
    let status = server.wait_exit();
    let log = server.log();
    assert_eq!(status.code(), Some(137), "the inner init's status\n{log}");
    assert!(log.contains("Stopping the processes left under baton init."), "{log}");
    assert!(!log.contains("did not exit in time"), "{log}");
    assert!(gone(serving.0), "the server outlived init");
}

/// A datagram passing a descriptor (more ancillary data than init
/// reads) is read and ignored as any stranger's, with the rate-limited
/// warning, not taken for a failure to read the socket.
#[test]
fn a_datagram_passing_a_descriptor_is_ignored_as_a_stranger_s() {
    use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};
    use std::os::fd::AsRawFd;
    let repo = repo_with("m", &[1], "");
    let mut server = start_under_init(repo.root(), &[]);
    let _main = main_process(server.pid());
    server.wait_serving("m", 1);
    let address = init_socket(&server);
    let name = address.as_abstract_name().expect("an abstract name");
    let to = UnixAddr::new_abstract(name).expect("the address");
    let sender = std::os::unix::net::UnixDatagram::unbound().expect("a datagram socket");
    let passed = [std::io::stdin().as_raw_fd()];
    let said = [std::io::IoSlice::new(b"READY=1")];
    for _ in 0..3 {
        let rights = [ControlMessage::ScmRights(&passed)];
        sendmsg(sender.as_raw_fd(), &said, &rights, MsgFlags::empty(), Some(&to)).expect("sending a descriptor");
    }
    eventually("init to ignore the stranger", || {
        server.log().contains("neither the main process nor under").then_some(())
    });
    let status = server.terminate();
    let log = server.log();
    assert_eq!(status.code(), Some(0), "init's status\n{log}");
    assert!(!log.contains("Could not read the notification socket"), "{log}");
}

/// A manager above init that does not read its socket (its queue full)
/// costs init a warning and the notifications, never its one thread: a
/// SIGTERM still drains the server and init exits 0.
#[test]
fn a_manager_above_init_that_does_not_read_does_not_hold_init() {
    let repo = repo_with("m", &[1], "");
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("notify");
    let _manager = std::os::unix::net::UnixDatagram::bind(&path).expect("a notification socket");
    // Filled up front, and never read.
    let filler = std::os::unix::net::UnixDatagram::unbound().expect("a datagram socket");
    filler.set_nonblocking(true).expect("non-blocking");
    let mut queued = 0;
    while filler.send_to(b"X=1", &path).is_ok() {
        queued += 1;
        assert!(queued < 100_000, "the manager's queue never filled");
    }
    let mut command = Command::new(bin());
    command.arg("init").env("NOTIFY_SOCKET", &path);
    let mut server = Server::start_command(command, repo.root(), &[]);
    let _main = main_process(server.pid());
    server.wait_serving("m", 1);
    eventually("init to give up passing READY=1 on", || {
        server.log().contains("Could not tell the service manager how the service stands").then_some(())
    });
    let status = server.terminate();
    assert_eq!(status.code(), Some(0), "init's status\n{}", server.log());
    assert!(server.log().contains("baton stopped."), "{}", server.log());
}
