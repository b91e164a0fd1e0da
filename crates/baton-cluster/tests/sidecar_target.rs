//! The sidecar agent's trial load against a target that hangs: a stand-in
//! KServe V2 server on a loopback port, a real HTTP listener that answers
//! the repository's load and readiness calls (after a delay the test
//! chooses; a version's metadata too, when a test asks) and never answers
//! others. A trial whose metadata call hangs fails (a hang is not a pass),
//! and the whole trial ends at one load timeout, however many calls hang.
//! A prepare that finds a load of the same model under way is refused as
//! busy at once (the participant then waits within its prepare timeout)
//! rather than queued behind it; a converge on the committed version keeps
//! a candidate staged for a later step.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_cluster::node::Node;
use baton_cluster::{SidecarConfig, SidecarNode, TargetLayout};
use baton_core::files::source::LocalRepository;
use baton_testkit::fake::FAKE_TOML;
use baton_testkit::repo::TestRepo;

/// How long one load, readiness included, may take here.
const LOAD_TIMEOUT: Duration = Duration::from_secs(3);

/// A stand-in target: answers `POST …/load` and `GET …/ready` with 200
/// after `delay` (each), `POST …/unload` at once, and holds every other
/// request unanswered until it is dropped.
struct StandIn {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl StandIn {
    fn start(delay: Duration) -> StandIn {
        StandIn::answering(delay, false)
    }

    /// [`StandIn::start`], answering a version's metadata call too when
    /// `metadata` (with metadata that names no inputs: readiness only).
    fn answering(delay: Duration, metadata: bool) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let stopping = Arc::clone(&stopping);
                        std::thread::spawn(move || serve(stream, delay, metadata, &stopping));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        StandIn { port, stop }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Answers the requests of one connection, in order, until it closes.
fn serve(stream: TcpStream, delay: Duration, metadata: bool, stop: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut head = String::new();
        if reader.read_line(&mut head).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let path = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
        let is_metadata = head.starts_with("GET ") && path.rsplit('/').nth(1) == Some("versions");
        let answers = path.ends_with("/load")
            || path.ends_with("/unload")
            || path.ends_with("/ready")
            || (metadata && is_metadata);
        if !answers {
            // A server that hangs: the request is never answered.
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
            return;
        }
        if !path.ends_with("/unload") {
            std::thread::sleep(delay);
        }
        let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// An agent for the stand-in, over a source with version 1 of `m`.
fn agent(source: &Path, target: &Path, url: &str) -> SidecarNode {
    SidecarNode::new(SidecarConfig {
        source: Arc::new(LocalRepository::new(source)),
        specs: source.to_owned(),
        target_repo: target.to_owned(),
        staging: None,
        target_url: url.to_owned(),
        target_token: None,
        layout: TargetLayout::Baton,
        load_timeout: LOAD_TIMEOUT,
    })
    .expect("the agent's directories")
}

/// A source repository holding version 1 of `m`, sealed, and a target
/// directory with an empty repository in it (kept while the directory is).
fn source_and_target() -> (TestRepo, tempfile::TempDir, std::path::PathBuf) {
    let source = TestRepo::new();
    source.add_model("m", FAKE_TOML);
    source.write_files("m", 1, &[("fake.txt", b"1")]);
    source.seal("m", 1);
    let target = tempfile::tempdir().unwrap();
    let repo = target.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    (source, target, repo)
}

/// Prepares version 1 against a stand-in whose answers take `delay`: what
/// the prepare said, and how long it took.
fn prepare_against(delay: Duration) -> (Result<(), baton_cluster::node::Refusal>, Duration) {
    let (source, _target, repo) = source_and_target();
    let stand_in = StandIn::start(delay);
    let node = agent(source.root(), &repo, &stand_in.url());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let started = Instant::now();
    let prepared = runtime.block_on(node.prepare("m", 1));
    let took = started.elapsed();
    assert!(!repo.join("m.baton-probe").exists(), "the trial's files are left in the target's repository");
    (prepared, took)
}

#[test]
fn a_trial_whose_metadata_call_hangs_fails_the_prepare() {
    let (prepared, took) = prepare_against(Duration::ZERO);
    let refused = prepared.expect_err("a target that never answered the metadata call passed the trial");
    assert_eq!(refused.stage, "validate", "{refused}");
    assert!(refused.reason.contains("metadata"), "{refused}");
    assert!(took < 2 * LOAD_TIMEOUT, "the trial took {took:?}");
}

#[test]
fn a_trial_ends_at_one_load_timeout_however_many_calls_are_slow() {
    // The load and each readiness answer take most of the load timeout.
    let (prepared, took) = prepare_against(LOAD_TIMEOUT * 5 / 6);
    assert!(prepared.is_err(), "a target that did not answer within the load timeout passed the trial");
    assert!(
        took < LOAD_TIMEOUT + Duration::from_secs(2),
        "the trial took {took:?}, past its load timeout of {LOAD_TIMEOUT:?}"
    );
}

#[test]
fn a_prepare_finds_a_load_under_way_busy_instead_of_waiting_behind_it() {
    let (source, _target, repo) = source_and_target();
    // Each load and readiness answer takes a while: the converge holds
    // the model's turn for most of a load timeout.
    let stand_in = StandIn::start(LOAD_TIMEOUT / 3);
    let node = agent(source.root(), &repo, &stand_in.url());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // The converge is polled first: it takes the model's turn at once.
    let (converged, (prepared, took)) = runtime.block_on(async {
        tokio::join!(node.converge("m", 1), async {
            let started = Instant::now();
            (node.prepare("m", 1).await, started.elapsed())
        })
    });
    let refused = prepared.expect_err("the prepare waited for the converge instead of finding it busy");
    assert_eq!(refused.stage, baton_cluster::node::BUSY, "{refused}");
    assert!(took < LOAD_TIMEOUT / 3, "the prepare waited {took:?} behind the converge");
    assert!(converged.is_err(), "the stand-in never answers the trial's metadata call");
    // Once the converge ended, the model is free again.
    runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(1), node.until_free("m")).await.expect("the model's turn is free")
    });
}

#[test]
fn a_converge_keeps_the_candidate_staged_for_a_later_step() {
    let source = TestRepo::new();
    source.add_model("m", FAKE_TOML);
    for version in 1..=2u64 {
        source.write_files("m", version, &[("fake.txt", version.to_string().as_bytes())]);
        source.seal("m", version);
    }
    let target = tempfile::tempdir().unwrap();
    let repo = target.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let stand_in = StandIn::answering(Duration::ZERO, true);
    let node = agent(source.root(), &repo, &stand_in.url());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Version 2 prepared for a gray step this agent is not part of yet;
    // meanwhile it converges on the committed version 1.
    runtime.block_on(node.prepare("m", 2)).expect("the prepare of version 2");
    runtime.block_on(node.converge("m", 1)).expect("the converge on version 1");
    let serving = node.serving("m");
    assert_eq!(serving.stable, Some(1), "{serving:?}");
    assert_eq!(serving.candidate, Some(2), "the prepared candidate was discarded: {serving:?}");
    assert_eq!(serving.candidate_percent, 0.0, "{serving:?}");
}
