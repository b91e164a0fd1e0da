//! Rollouts through the real registry and the real engine: the share a
//! canary gets, sticky keys that only move towards the candidate, a good
//! candidate promoted through every step, a drifting one rolled back with
//! no failed request, low traffic left inconclusive, and an operator's
//! promote and abort mid-rollout. No assertion depends on wall-clock speed:
//! each waits for the decision it expects, within a generous bound.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use baton_core::registry::Registry;
use baton_core::registry::events::{Event, EventKind};
use baton_core::registry::load::RolloutStart;
use baton_core::rollout::control::{Action, Decision, Phase};
use baton_core::rollout::guard::Outcome;
use baton_core::rollout::plan::Overrides;
use baton_core::rollout::{Role, assign};
use baton_core::tensors::tensor::Tensor;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::{registry, wait_for_event};

/// A `[rollout]` section: windows of `interval_ms`, `min_samples` per side,
/// drift guarded by relative L2, and the default guards of error rate and
/// latency.
fn section(steps: &str, interval_ms: u64, min_samples: u64, extra: &str) -> String {
    format!(
        "[rollout]\nsteps = [{steps}]\ninterval_ms = {interval_ms}\nmax_inconclusive = 1000\n{extra}\n\
         [rollout.guards]\nmin_samples = {min_samples}\nmax_rel_l2 = 0.05\n"
    )
}

/// A repository with `m` v1 (stable) and v2 (the candidate), loaded to v1.
fn two_versions(v1: &Mlp, v2: &Mlp, rollout: &str) -> (TestRepo, Registry) {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(v1, rollout));
    repo.publish_mlp("m", 1, v1);
    repo.publish_mlp("m", 2, v2);
    let registry = registry(repo.root());
    registry.load("m", Some(1)).unwrap().wait().unwrap();
    (repo, registry)
}

fn input(seed: u64) -> Tensor {
    Tensor::from_f32("input", vec![1, 8], &sample_input(8, 1, seed))
}

/// Sends keyless requests from a thread of its own until stopped; counts
/// the failed ones.
struct Traffic {
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(registry: &Registry) -> Traffic {
        let (stop, failed, sent) =
            (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (r, s, f, n) = (registry.clone(), Arc::clone(&stop), Arc::clone(&failed), Arc::clone(&sent));
        let thread = std::thread::spawn(move || {
            let mut seed = 0;
            while !s.load(Ordering::Relaxed) {
                seed += 1;
                if r.snapshot().serve("m", None, &[input(seed)]).is_err() {
                    f.fetch_add(1, Ordering::Relaxed);
                }
                n.fetch_add(1, Ordering::Relaxed);
            }
        });
        Traffic { stop, failed, sent, thread: Some(thread) }
    }

    /// Stops and returns (sent, failed).
    fn stop(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        (self.sent.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }
}

fn decision(event: &Event) -> Option<&Decision> {
    match &event.kind {
        EventKind::Rollout { decision } => Some(decision),
        _ => None,
    }
}

const LONG: Duration = Duration::from_secs(120);

#[test]
fn a_canary_at_ten_percent_gets_ten_percent_of_keyless_requests() {
    let mlp = Mlp::new(&[8, 16, 1], 1);
    let (_repo, registry) = two_versions(&mlp, &mlp, &section("10, 100", 600_000, 100, ""));
    registry.start_rollout("m", RolloutStart { version: Some(2), ..RolloutStart::default() }).unwrap().wait().unwrap();
    let snapshot = registry.snapshot();
    let n = 20_000;
    let to_candidate = (0..n).filter(|_| snapshot.route("m", None, None).unwrap().role == Role::Candidate).count();
    let share = to_candidate as f64 / f64::from(n);
    assert!((share - 0.10).abs() <= 0.015, "the candidate got {:.2}% of requests", share * 100.0);
    // A named version is served as asked, in the role it plays.
    assert_eq!(snapshot.route("m", Some(2), None).unwrap().role, Role::Candidate);
    assert_eq!(snapshot.route("m", Some(1), None).unwrap().role, Role::Stable);
    // While it rolls out, loads and rollbacks would cut across it.
    assert_eq!(registry.load("m", Some(2)).unwrap_err().kind(), "rollout_in_progress");
    assert_eq!(registry.rollback("m").unwrap_err().kind(), "rollout_in_progress");
}

#[test]
fn a_good_candidate_is_promoted_through_every_step_and_sticky_keys_never_move_back() {
    let mlp = Mlp::new(&[8, 16, 1], 1);
    let (_repo, registry) = two_versions(&mlp, &mlp, &section("5, 25, 50, 100", 300, 20, ""));
    let mut events = registry.subscribe();
    registry.start_rollout("m", RolloutStart { version: Some(2), ..RolloutStart::default() }).unwrap().wait().unwrap();
    let keys: Vec<String> = (0..2000).map(|i| format!("user-{i}")).collect();
    // By the version a key reaches: once the candidate is promoted (which
    // may come before this thread reads an earlier step's event), version
    // 2 answers every key as stable.
    let on_candidate = |registry: &Registry| -> BTreeSet<String> {
        let snapshot = registry.snapshot();
        keys.iter()
            .filter(|k| snapshot.route("m", None, Some(k.as_bytes())).unwrap().version.number() == 2)
            .cloned()
            .collect()
    };
    let mut before = on_candidate(&registry);
    let traffic = Traffic::start(&registry);
    let mut advanced = 0;
    loop {
        let event = wait_for_event(&mut events, LONG, |e| {
            decision(e).is_some_and(|d| matches!(d.action, Action::Advanced | Action::Promoted | Action::RolledBack))
        });
        let d = decision(&event).unwrap();
        assert_ne!(d.action, Action::RolledBack, "a candidate equal to stable was rolled back: {}", d.message);
        if d.action == Action::Promoted {
            break;
        }
        advanced += 1;
        let verdict = d.verdict.as_ref().expect("a step is decided on a judged window");
        assert!(verdict.checks.iter().all(|c| c.samples >= 20), "{verdict:?}");
        let now = on_candidate(&registry);
        assert!(before.is_subset(&now), "a key went back to stable as the weight rose");
        assert!(now.len() > before.len() || now.len() == keys.len());
        before = now;
    }
    let (sent, failed) = traffic.stop();
    assert_eq!(failed, 0, "{failed} of {sent} requests failed");
    assert_eq!(advanced, 3, "four steps: three advances, then the promotion");
    let route = registry.snapshot().model("m").unwrap().clone();
    assert_eq!(route.stable.number(), 2);
    assert_eq!(route.previous.iter().map(|v| v.number()).collect::<Vec<_>>(), vec![1]);
    // Watched after promotion (five minutes by default) against version 1.
    let baseline = route.rollout.as_ref().and_then(|r| r.baseline.as_ref()).map(|v| v.number());
    assert_eq!(baseline, Some(1));
    let status = registry.status("m").unwrap().rollout.unwrap();
    assert_eq!(status.phase, Phase::Watching);
    assert_eq!(status.watch.map(|w| w.against), Some(1));
}

#[test]
fn a_drifting_candidate_is_rolled_back_with_no_failed_request() {
    let (v1, v2) = (Mlp::new(&[8, 16, 1], 1), Mlp::new(&[8, 16, 1], 2));
    let (_repo, registry) = two_versions(&v1, &v2, &section("50, 100", 300, 20, ""));
    let mut events = registry.subscribe();
    registry.start_rollout("m", RolloutStart { version: Some(2), ..RolloutStart::default() }).unwrap().wait().unwrap();
    let traffic = Traffic::start(&registry);
    let event = wait_for_event(&mut events, LONG, |e| {
        decision(e).is_some_and(|d| matches!(d.action, Action::Advanced | Action::Promoted | Action::RolledBack))
    });
    let d = decision(&event).unwrap().clone();
    assert_eq!(d.action, Action::RolledBack, "{}", d.message);
    let verdict = d.verdict.expect("the rollback carries the window it was decided on");
    let drift = verdict.checks.iter().find(|c| c.guard.starts_with("rel_l2")).expect("a drift check");
    assert!(drift.value.unwrap() > drift.threshold, "{drift:?}");
    assert!(drift.samples >= 20);
    // The candidate leaves traffic by one store: every request after it
    // goes to version 1.
    wait_for_event(
        &mut events,
        LONG,
        |e| matches!(&e.kind, EventKind::Finished { report } if report.operation == baton_core::registry::Operation::Abort),
    );
    for seed in 0..200 {
        let (answer, role) = registry.snapshot().serve("m", None, &[input(seed)]).unwrap();
        assert_eq!((answer.version, role), (1, Role::Stable));
    }
    let (sent, failed) = traffic.stop();
    assert_eq!(failed, 0, "{failed} of {sent} requests failed");
    let status = registry.status("m").unwrap();
    assert_eq!(status.serving, Some(1));
    assert_eq!(status.rollout.unwrap().phase, Phase::RolledBack);
}

#[test]
fn low_traffic_leaves_the_rollout_inconclusive_and_then_paused() {
    let mlp = Mlp::new(&[8, 16, 1], 1);
    let extra = "max_inconclusive = 3\n";
    let rollout = section("50, 100", 100, 1_000_000, "").replace("max_inconclusive = 1000\n", extra);
    let (_repo, registry) = two_versions(&mlp, &mlp, &rollout);
    let mut events = registry.subscribe();
    registry.start_rollout("m", RolloutStart { version: Some(2), ..RolloutStart::default() }).unwrap().wait().unwrap();
    for seed in 0..50 {
        registry.snapshot().serve("m", None, &[input(seed)]).unwrap();
    }
    let event = wait_for_event(&mut events, LONG, |e| {
        decision(e).is_some_and(|d| !matches!(d.action, Action::Started | Action::Held))
    });
    let d = decision(&event).unwrap();
    assert_eq!(d.action, Action::Paused, "{}", d.message);
    let status = registry.rollout("m").unwrap();
    assert_eq!((status.phase, status.step), (Phase::Paused, 0), "never advanced on too few samples");
    assert!(status.paused.as_deref().unwrap().contains("inconclusive"), "{:?}", status.paused);
    assert_eq!(registry.snapshot().model("m").unwrap().stable.number(), 1);
}

#[test]
fn an_operator_can_promote_or_abort_mid_rollout() {
    let mlp = Mlp::new(&[8, 16, 1], 1);
    let (_repo, registry) = two_versions(&mlp, &mlp, &section("10, 100", 600_000, 100, ""));
    let start = || RolloutStart { version: Some(2), ..RolloutStart::default() };
    registry.start_rollout("m", start()).unwrap().wait().unwrap();
    registry.pause_rollout("m", "looking at dashboards").unwrap();
    assert_eq!(registry.rollout("m").unwrap().phase, Phase::Paused);
    registry.resume_rollout("m").unwrap();
    registry.abort_rollout("m").unwrap().wait().unwrap();
    let route = registry.snapshot().model("m").unwrap().clone();
    assert!(route.rollout.is_none());
    assert_eq!(route.stable.number(), 1);
    assert_eq!(registry.rollout("m").unwrap().phase, Phase::Aborted);
    assert_eq!(registry.abort_rollout("m").unwrap_err().kind(), "no_rollout");

    registry.start_rollout("m", start()).unwrap().wait().unwrap();
    registry.promote_rollout("m").unwrap().wait().unwrap();
    let route = registry.snapshot().model("m").unwrap().clone();
    assert_eq!(route.stable.number(), 2);
    assert_eq!(route.previous[0].number(), 1);
    assert_eq!(registry.rollout("m").unwrap().phase, Phase::Watching);
    // Promoting again confirms it: the watch ends, 1 stays as previous.
    registry.promote_rollout("m").unwrap().wait().unwrap();
    assert_eq!(registry.rollout("m").unwrap().phase, Phase::Promoted);
    assert!(registry.snapshot().model("m").unwrap().rollout.is_none());
}

#[test]
fn a_plan_that_cannot_run_is_refused_and_nothing_changes() {
    let mlp = Mlp::new(&[8, 16, 1], 1);
    let (_repo, registry) = two_versions(&mlp, &mlp, &section("10, 100", 600_000, 100, ""));
    let falling = Overrides { steps: Some(vec![50.0, 10.0]), ..Overrides::default() };
    let error = registry
        .start_rollout("m", RolloutStart { version: Some(2), overrides: falling, ..RolloutStart::default() })
        .unwrap()
        .wait()
        .unwrap_err();
    assert_eq!(error.kind(), "rollout_refused", "{error}");
    assert!(registry.snapshot().model("m").unwrap().rollout.is_none());
    let same = registry.start_rollout("m", RolloutStart { version: Some(1), ..RolloutStart::default() });
    assert_eq!(same.unwrap().wait().unwrap_err().kind(), "rollout_refused");
    // A key's bucket is fixed: the same key, the same side.
    let salt = assign::salt("m", 2);
    assert_eq!(assign::bucket(salt, b"user-1"), assign::bucket(salt, b"user-1"));
}

#[test]
fn a_shadow_never_answers_and_its_drift_rolls_it_back() {
    let (v1, v2) = (Mlp::new(&[8, 16, 1], 1), Mlp::new(&[8, 16, 1], 2));
    let rollout = section("100", 300, 20, "mode = \"shadow\"\n");
    let (_repo, registry) = two_versions(&v1, &v2, &rollout);
    let mut events = registry.subscribe();
    registry.start_rollout("m", RolloutStart { version: Some(2), ..RolloutStart::default() }).unwrap().wait().unwrap();
    let mut seed = 0;
    let mut answered_by_stable = 0;
    let event = loop {
        // Every answer comes from stable; the copies run off the path, on
        // the lowered runner, and are judged.
        for _ in 0..20 {
            seed += 1;
            let (answer, role) = registry.snapshot().serve("m", None, &[input(seed)]).unwrap();
            assert_eq!((answer.version, role), (1, Role::Stable));
            answered_by_stable += 1;
        }
        let deadline = std::time::Instant::now() + Duration::from_millis(1);
        let found = loop {
            match events.try_recv() {
                Ok(e) if decision(&e).is_some_and(|d| d.action != Action::Started && d.action != Action::Held) => {
                    break Some(e);
                }
                Ok(_) => continue,
                Err(_) if std::time::Instant::now() < deadline => continue,
                Err(_) => break None,
            }
        };
        if let Some(event) = found {
            break event;
        }
        assert!(answered_by_stable < 1_000_000, "no decision after {answered_by_stable} requests");
    };
    let d = decision(&event).unwrap();
    assert_eq!(d.action, Action::RolledBack, "{}", d.message);
    let verdict = d.verdict.as_ref().unwrap();
    assert!(verdict.checks.iter().any(|c| c.guard.starts_with("rel_l2") && c.outcome == Outcome::Fail), "{verdict:?}");
    let status = registry.rollout("m").unwrap();
    assert!(status.totals.candidate.requests >= 20, "the shadow ran copies: {:?}", status.totals.candidate);
    let misused: Vec<_> = baton_core::threads::sync::misuses()
        .into_iter()
        .filter(|m| m.thread.as_deref() == Some("baton-shadow"))
        .collect();
    assert!(misused.is_empty(), "the lowered shadow runner took a serving lock: {misused:?}");
}

#[test]
fn held_rollouts_do_not_move_until_released_then_judge_the_windows_that_ended() {
    let mlp = Mlp::new(&[8, 16, 1], 1);
    let (_repo, registry) = two_versions(&mlp, &mlp, &section("10, 100", 100, 1, ""));
    registry.hold_rollouts(true);
    registry.start_rollout("m", RolloutStart { version: Some(2), ..RolloutStart::default() }).unwrap().wait().unwrap();
    let traffic = Traffic::start(&registry);
    // Ten windows' time: held, none is judged.
    std::thread::sleep(Duration::from_millis(1000));
    let status = registry.status("m").unwrap().rollout.unwrap();
    assert_eq!((status.phase, status.step), (Phase::Running, 0), "a held rollout moved");
    let mut events = registry.subscribe();
    registry.hold_rollouts(false);
    let event = wait_for_event(&mut events, LONG, |e| decision(e).is_some_and(|d| d.action != Action::Started));
    let (sent, failed) = traffic.stop();
    assert_eq!(failed, 0, "{failed} of {sent} requests failed");
    assert!(matches!(decision(&event).unwrap().action, Action::Advanced | Action::Held), "{event:?}");
}
