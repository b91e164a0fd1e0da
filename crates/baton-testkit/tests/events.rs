//! The state machine: every transition of a load, a failed load and an
//! unload arrives as an event, with the durations of the stages so far; and
//! the loader runs at a lower CPU priority than the threads that serve.
//!
//! Transitions are sent before an operation's handle resolves, so once
//! `wait()` returns, all of them are in the receiver.

use std::sync::Arc;

use baton_core::registry::events::{EventKind, Stage, State};
use baton_testkit::fake::{FAKE_TOML, FakeBackend};
use baton_testkit::repo::TestRepo;
use baton_testkit::{drain_events, registry_with, states};

#[test]
fn loads_failures_and_unloads_walk_the_state_machine() {
    let repo = TestRepo::new();
    repo.add_model("m", FAKE_TOML);
    repo.write_files("m", 1, &[("fake.txt", b"2")]);
    repo.seal("m", 1);
    let registry = registry_with(repo.root(), vec![Arc::new(FakeBackend::new())]);
    let mut rx = registry.subscribe();

    registry.load("m", None).unwrap().wait().unwrap();
    let events = drain_events(&mut rx);
    use State::*;
    assert_eq!(states(&events), vec![Loading, Warming, Swapping, Draining, Ready]);
    let last_transition = events.iter().rev().find(|e| matches!(e.kind, EventKind::Transition { .. })).unwrap();
    let EventKind::Transition { from, stages, .. } = &last_transition.kind else { unreachable!() };
    assert_eq!(*from, Draining);
    let order: Vec<Stage> = stages.iter().map(|s| s.stage).collect();
    use Stage as S;
    assert_eq!(order, vec![S::Config, S::Fetch, S::Verify, S::Load, S::Validate, S::Warmup, S::Commit, S::Drain]);
    assert!(events.iter().all(|e| e.model == "m"));
    let finished = events.iter().find_map(|e| match &e.kind {
        EventKind::Finished { report } => Some(report.clone()),
        _ => None,
    });
    assert_eq!(finished.expect("a finished event").stages.len(), 8);
    assert!(events.windows(2).all(|w| w[0].at <= w[1].at), "timestamps in order");

    // Version 2 is altered after sealing: refused at verify, READY again on version 1.
    repo.write_files("m", 2, &[("fake.txt", b"3")]);
    repo.seal("m", 2);
    repo.write_files("m", 2, &[("fake.txt", b"4")]);
    let error = registry.load("m", Some(2)).unwrap().wait().unwrap_err();
    assert_eq!(error.kind(), "verify_failed");
    let events = drain_events(&mut rx);
    assert_eq!(states(&events), vec![Loading, Failed, Ready]);
    let failed = events.iter().find_map(|e| match &e.kind {
        EventKind::Failed { stage, kind, .. } => Some((*stage, kind.clone())),
        _ => None,
    });
    assert_eq!(failed, Some((Stage::Verify, "digest_mismatch".to_owned())));
    let status = registry.status("m").unwrap();
    assert_eq!(status.failed_versions.keys().copied().collect::<Vec<_>>(), vec![2]);
    assert_eq!(status.failed_versions[&2].stage, Some(Stage::Verify));

    registry.unload("m").unwrap().wait().unwrap();
    let events = drain_events(&mut rx);
    assert_eq!(states(&events), vec![Swapping, Draining, Idle]);
    assert!(registry.snapshot().model("m").is_none());
    assert_eq!(registry.status("m").unwrap().state, Idle);
}

/// The (nice value, scheduling policy) of the threads of this process with this name.
fn nice_of(thread: &str) -> Vec<(i64, i64)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().filter_map(Result::ok) {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != thread {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap();
        // Fields after the parenthesised command name: nice is field 19 overall, policy field 41.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        found.push((fields[16].parse().unwrap(), fields[38].parse().unwrap()));
    }
    found
}

#[test]
fn a_loader_can_keep_the_normal_policy() {
    let repo = TestRepo::new();
    repo.add_model("m", FAKE_TOML);
    repo.write_files("m", 1, &[("fake.txt", b"2")]);
    repo.seal("m", 1);
    // As the server does; see the_loader_runs_at_lower_priority_than_serving.
    baton_core::run::executor::start_spawner();
    let config = baton_core::registry::RegistryConfig { loader_idle: false, ..Default::default() };
    let source = Arc::new(baton_core::files::source::LocalRepository::new(repo.root()));
    let registry = baton_core::registry::Registry::new(source, vec![Arc::new(FakeBackend::new())], config);
    registry.load("m", None).unwrap().wait().unwrap();
    // Other tests' registries may run loaders at the same time; at least one is not idle.
    assert!(nice_of("baton-loader").iter().any(|(_, policy)| *policy == 0), "no loader under SCHED_OTHER");
}

#[test]
fn the_loader_runs_at_lower_priority_than_serving() {
    let repo = TestRepo::new();
    repo.add_model("m", FAKE_TOML);
    repo.write_files("m", 1, &[("fake.txt", b"2")]);
    repo.seal("m", 1);
    let registry = registry_with(repo.root(), vec![Arc::new(FakeBackend::new())]);
    // After one load the loader thread has certainly applied its priority.
    registry.load("m", None).unwrap().wait().unwrap();
    let own = baton_core::threads::sys::current_thread_nice().unwrap() as i64;
    let loaders = nice_of("baton-loader");
    assert!(!loaders.is_empty(), "no loader thread found");
    let wanted = i64::from(baton_core::registry::RegistryConfig::default().loader_nice);
    assert!(own < wanted, "this test needs to run below nice {wanted}, runs at {own}");
    assert!(loaders.iter().all(|(n, _)| *n == wanted), "loader nice {loaders:?}, serving {own}");
    let policy = if baton_core::registry::RegistryConfig::default().loader_idle { 5 } else { 0 }; // SCHED_IDLE, SCHED_OTHER
    // Another test of this file runs a loader under SCHED_OTHER meanwhile.
    assert!(loaders.iter().any(|(_, p)| *p == policy), "loader policy {loaders:?}");
    assert_eq!(
        baton_core::threads::sys::current_thread_nice().unwrap() as i64,
        own,
        "the caller's priority is untouched"
    );
    // The version was built on a loader thread, but its session threads
    // serve at the priority of the thread that started the registry.
    let sessions = nice_of("baton-session");
    assert!(!sessions.is_empty(), "no session thread found");
    assert!(sessions.iter().all(|&(n, p)| n == own && p == 0), "session threads {sessions:?}, serving {own}");
}
