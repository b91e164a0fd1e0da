//! Holding rollouts is a barrier, through the real registry and engine:
//! `hold_rollouts(true)` returns only once no judgement is in flight, and
//! a judgement that read its numbers before the hold never lands after it.
//! The upgrade relies on it: it holds, then writes what the new process
//! takes up, and nothing may move in between.
//!
//! The judgement is made slow by a metric source that stalls until the
//! test lets it answer, as a slow Prometheus would.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use baton_core::registry::RegistryConfig;
use baton_core::registry::events::{Event, EventKind};
use baton_core::registry::load::RolloutStart;
use baton_core::rollout::control::{By, Decision, Phase};
use baton_core::rollout::metric::MetricSource;
use baton_testkit::onnx::Mlp;
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::{registry_configured, wait_for_event};

const LONG: Duration = Duration::from_secs(120);

/// A metric source whose first window's two queries stall until
/// released, and read the candidate at a tenth of the stable version
/// then; every later query answers at once, both sides equal.
#[derive(Debug, Default)]
struct Stalling {
    calls: AtomicU64,
    released: Mutex<bool>,
    changed: Condvar,
}

impl Stalling {
    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.changed.notify_all();
    }

    /// Waits until the first window's queries have begun.
    fn wait_entered(&self) {
        let deadline = std::time::Instant::now() + LONG;
        while self.calls.load(Ordering::SeqCst) == 0 {
            assert!(std::time::Instant::now() < deadline, "the controller never read the metric guard");
            std::thread::yield_now();
        }
    }
}

impl MetricSource for Stalling {
    fn read(&self, query: &str) -> Result<f64, String> {
        let first_window = self.calls.fetch_add(1, Ordering::SeqCst) < 2;
        let candidate = query.contains("version=\"2\"");
        if first_window {
            let mut released = self.released.lock().unwrap();
            while !*released {
                released = self.changed.wait(released).unwrap();
            }
            return Ok(if candidate { 0.1 } else { 1.0 });
        }
        Ok(1.0)
    }
}

fn decision(event: &Event) -> Option<&Decision> {
    match &event.kind {
        EventKind::Rollout { decision } => Some(decision),
        _ => None,
    }
}

#[test]
fn a_hold_waits_for_the_judgement_in_flight_and_it_never_lands_after() {
    let mlp = Mlp::new(&[8, 16, 1], 1);
    let rollout = "[rollout]\nsteps = [10, 100]\ninterval_ms = 100\nmax_inconclusive = 1000\n\
                   [rollout.guards]\nmin_samples = 1\n\
                   [[rollout.guards.metrics]]\nname = \"ctr\"\nquery = 'ctr{version=\"{{version}}\"}'\nmin_ratio = 0.9\n";
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp, rollout));
    repo.publish_mlp("m", 1, &mlp);
    repo.publish_mlp("m", 2, &mlp);
    let source = Arc::new(Stalling::default());
    let onnx = baton_onnx::OnnxBackend::new().expect("ONNX Runtime is needed for this test");
    let config = RegistryConfig {
        metric_source: Some(Arc::clone(&source) as Arc<dyn MetricSource>),
        ..RegistryConfig::default()
    };
    let registry = registry_configured(repo.root(), vec![Arc::new(onnx)], config);
    registry.load("m", Some(1)).unwrap().wait().unwrap();
    let mut events = registry.subscribe();
    registry.start_rollout("m", RolloutStart { version: Some(2), ..RolloutStart::default() }).unwrap().wait().unwrap();
    // The first window's judgement stalls in its metric reading.
    source.wait_entered();
    let holder = {
        let registry = registry.clone();
        std::thread::spawn(move || {
            registry.hold_rollouts(true);
            registry.rollout("m").expect("the rollout")
        })
    };
    let deadline = std::time::Instant::now() + LONG;
    while !registry.rollouts_held() {
        assert!(std::time::Instant::now() < deadline, "the hold was never set");
        std::thread::yield_now();
    }
    assert!(!holder.is_finished(), "the hold returned while a judgement was still reading its numbers");
    // The reading the judgement waited for would roll the candidate back;
    // it comes after the hold was set, so nothing may come of it.
    source.release();
    let held = holder.join().expect("the holder");
    let judged: Vec<&Decision> = held.decisions.iter().filter(|d| d.by == By::Guards).collect();
    assert!(judged.is_empty(), "a judgement landed during the hold: {judged:?}");
    assert_eq!((held.phase, held.step), (Phase::Running, 0));

    // Released: the windows are judged afresh, on a reading made now.
    registry.hold_rollouts(false);
    let event = wait_for_event(&mut events, LONG, |e| decision(e).is_some_and(|d| d.by == By::Guards));
    let first = decision(&event).unwrap();
    let checks = &first.verdict.as_ref().expect("a judged window").checks;
    let ctr = checks.iter().find(|c| c.guard == "metric:ctr").expect("the metric guard's check");
    assert_eq!(ctr.value, Some(1.0), "the first judgement after the hold read before it: {}", first.message);
}
