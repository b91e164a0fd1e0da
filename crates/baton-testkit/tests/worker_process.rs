//! Versions in real worker processes, through baton's `ProcessBackend`:
//! this test binary starts itself again as the worker (the `worker` test,
//! which does nothing unless the server's environment says it is one) and
//! runs the test kit's fake engine there, whose failures the tests choose. An
//! engine's panic in a worker is the engine's panic; a worker that hangs
//! while it streams its weights fails the pass within its timeout; no
//! other process started while workers start inherits their descriptors;
//! and a worker refuses descriptor numbers that are not its channels.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_core::files::spec::ModelSpec;
use baton_core::files::verified::Verified;
use baton_core::run::backend::{Backend, WeightsError};
use baton_core::tensors::tensor::Tensor;
use baton_testkit::fake::{FAKE_TOML, FakeBackend};
use baton_worker::process::ProcessBackend;

const LONG: Duration = Duration::from_secs(60);

#[test]
fn worker() {
    // Set only by the server side of these tests.
    if std::env::var("BATON_WORKER_FDS").is_err() {
        return;
    }
    let make: baton_worker::serve::MakeBackend = Box::new(|| Ok(Arc::new(FakeBackend::new()) as Arc<dyn Backend>));
    let served = baton_worker::serve::serve(make);
    if let Err(error) = &served {
        eprintln!("the worker stopped: {error}");
    }
    std::process::exit(if served.is_ok() { 0 } else { 3 });
}

/// The fake engine, run in worker processes of this test binary.
fn backend() -> ProcessBackend {
    baton_core::run::executor::start_spawner();
    let args = ["--exact", "worker", "--nocapture", "--test-threads", "1", "--quiet"];
    let program = std::env::current_exe().unwrap();
    ProcessBackend::new(Arc::new(FakeBackend::new()), program, args.map(str::to_owned).to_vec())
}

/// A verified fake version of `files`, in a directory that lives as long
/// as the returned guard.
fn version(files: &[(&str, &str)]) -> (tempfile::TempDir, Verified) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    baton_core::files::manifest::write(dir.path()).unwrap();
    let verified = baton_core::files::manifest::verify(dir.path()).unwrap();
    (dir, verified)
}

/// The fake model's spec, in a worker, with `engine` added to `[engine]`.
fn spec(engine: &str) -> ModelSpec {
    ModelSpec::parse(&format!("{FAKE_TOML}[engine]\nisolation = \"process\"\n{engine}")).unwrap()
}

fn x(first: f32) -> Vec<Tensor> {
    vec![Tensor::from_f32("x", vec![1, 4], &[first, 1.0, 2.0, 3.0])]
}

/// The engine's panic in a worker reaches the server with the kind it has
/// in the server's own process, not as the worker's failure; the worker
/// serves the next call.
#[test]
fn an_engine_panic_in_a_worker_is_reported_as_the_engine_s_panic() {
    let (_dir, verified) = version(&[("fake.txt", "2"), ("panic-on", "666")]);
    let model = backend().load(&verified, &spec("")).unwrap();
    let error = model.infer(&x(666.0)).unwrap_err();
    assert_eq!(error.kind, "engine_panicked", "{}", error.message);
    let answer = model.infer(&x(1.0)).unwrap();
    assert_eq!(answer[0].to_f32().unwrap(), vec![2.0, 2.0, 4.0, 6.0]);
}

/// A worker that stops (SIGSTOP) while the server asks for its weights,
/// with no heartbeat to find it: the pass fails within the worker's
/// timeout, saying so, and the worker is ended rather than waited on.
#[test]
fn a_worker_that_hangs_while_it_streams_its_weights_fails_the_pass_within_its_timeout() {
    let (_dir, verified) = version(&[("fake.txt", "2")]);
    let model = backend().load(&verified, &spec("worker_timeout_ms = 300\nworker_heartbeat_ms = 0\n")).unwrap();
    let pid = model.process().unwrap().pid;
    // Every thread stopped before the pass begins: a SIGSTOP only queued
    // lets a worker thread that is running answer it.
    baton_testkit::signals::stop(pid);
    let (tx, rx) = std::sync::mpsc::channel();
    let began = Instant::now();
    let model = Arc::new(model);
    let visiting = Arc::clone(&model);
    std::thread::spawn(move || {
        let _ = tx.send(visiting.visit_weights(&mut |_| Ok(())));
    });
    let visited = rx.recv_timeout(LONG);
    if visited.is_err() {
        // Lets the thread that waits on the worker go before failing.
        baton_testkit::signals::send(pid, "KILL");
    }
    let visited = visited.expect("the pass over the weights waited on a stopped worker");
    let Err(WeightsError::Read(why)) = visited else { panic!("{visited:?}") };
    assert!(why.contains("worker_timeout_ms"), "{why}");
    assert!(began.elapsed() < LONG / 2, "{:?}", began.elapsed());
    // Killed for it: its end closes, and the server sees it gone.
    let deadline = Instant::now() + LONG;
    while model.alive() {
        assert!(Instant::now() < deadline, "a worker that hung was not ended");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The open sockets and shared memory files of process `pid`, beyond its
/// standard streams.
fn shared_descriptors(pid: u32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| target.starts_with("socket:") || target.starts_with("/memfd:"))
        .collect()
}

/// Workers start one after another while another thread of the server
/// starts processes of its own as fast as it can: none of those processes
/// holds a worker's socket or shared region. (A worker's ends once had
/// their close-on-exec flag cleared in the server, process-wide, for the
/// time it took to start the worker: a process started then inherited
/// them, and its copy kept the worker's channels open after the worker
/// ended.)
#[test]
fn a_process_started_while_workers_start_inherits_none_of_their_descriptors() {
    let (_dir, verified) = version(&[("fake.txt", "2")]);
    let backend = backend();
    let spec = spec("worker_heartbeat_ms = 0\n");
    let stop = AtomicBool::new(false);
    let (leaked, started) = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            let (mut leaked, mut started) = (Vec::new(), 0);
            while !stop.load(Ordering::Relaxed) {
                let mut child = Command::new("sleep")
                    .arg("60")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                // Started: it runs `sleep` now, with what it inherited.
                leaked.extend(shared_descriptors(child.id()));
                let _ = child.kill();
                let _ = child.wait();
                started += 1;
            }
            (leaked, started)
        });
        for _ in 0..40 {
            drop(backend.load(&verified, &spec).unwrap());
        }
        stop.store(true, Ordering::Relaxed);
        other.join().unwrap()
    });
    assert!(started > 40, "only {started} other processes started");
    assert!(leaked.is_empty(), "processes started meanwhile inherited {leaked:?}");
}

/// A worker started with descriptor numbers that are not channel ends
/// (standard streams, a number given twice, one that is not open) refuses
/// them and stops, saying which, before it takes any of them.
#[test]
fn a_worker_refuses_descriptors_that_are_not_its_channels() {
    let args = ["--exact", "worker", "--nocapture", "--test-threads", "1", "--quiet"];
    for (fds, says) in [("1,2,5", "descriptor 1"), ("3,3,4", "named twice"), ("200,201,202", "not open")] {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(args)
            .env("BATON_WORKER_FDS", fds)
            .env("BATON_WORKER_PARENT", std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + LONG;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{fds}: the worker did not stop");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(3), "{fds}: {stderr}");
        assert!(stderr.contains(says), "{fds}: {stderr}");
    }
}
