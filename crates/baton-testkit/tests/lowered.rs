//! Threads that load and free versions run at idle priority, and take no
//! lock that serving threads take: what they change, the registry's agent
//! applies at serving priority. Checked over whole cycles of loads, swaps,
//! a rollback, a retire, a failed load, an unload and the frees they cause,
//! with the fake backend and with ONNX Runtime, and over swaps under the
//! resource policy and memory budgets (a failed candidate loaded back): no `baton_core::threads::sync::Lock`
//! is taken by a lowered thread (debug builds record each time), and no
//! event is logged on one (a tracing layer of this test records each).

use std::sync::{Arc, Mutex, Once};

use baton_core::registry::Registry;
use baton_core::registry::events::State;
use baton_core::registry::routing::Routing;
use baton_core::tensors::tensor::Tensor;
use baton_testkit::fake::{FAKE_TOML, FakeBackend};
use baton_testkit::onnx::Mlp;
use baton_testkit::repo::{Damage, TestRepo, mlp_toml};
use baton_testkit::server::eventually;
use baton_testkit::{infer_mlp, registry, registry_configured, registry_with};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Events logged on lowered threads: "thread: target, callsite".
static LOWERED_EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The thread that checks that the layer sees what it should.
const PROBE: &str = "lowered-probe";

struct LoweredEvents;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LoweredEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if baton_core::threads::sys::current_thread_lowered() {
            let thread = std::thread::current().name().unwrap_or("unnamed").to_owned();
            let meta = event.metadata();
            let seen = format!("{thread}: {} {}, {}", meta.level(), meta.target(), meta.name());
            LOWERED_EVENTS.lock().unwrap_or_else(|e| e.into_inner()).push(seen);
        }
    }
}

/// Installs the layer for the whole test binary (every level, every
/// target) and checks that it records an event logged on a lowered thread.
fn watch_lowered_threads() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        tracing_subscriber::registry().with(LoweredEvents).init();
        std::thread::Builder::new()
            .name(PROBE.into())
            .spawn(|| {
                let _ = baton_core::threads::sys::lower_current_thread(19, true);
                tracing::debug!("A lowered thread logs, as loading threads must not.");
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(lowered_events(true).len(), 1, "the layer missed the probe's event");
    });
}

fn lowered_events(probe: bool) -> Vec<String> {
    let seen = LOWERED_EVENTS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    seen.into_iter().filter(|e| e.starts_with(PROBE) == probe).collect()
}

/// Fails if any lowered thread so far took a serving lock or logged.
fn assert_lowered_threads_kept_to_themselves() {
    let misuses = baton_core::threads::sync::misuses();
    assert!(misuses.is_empty(), "locks taken by the wrong kind of thread: {misuses:#?}");
    let events = lowered_events(false);
    assert!(events.is_empty(), "events logged on lowered threads: {events:#?}");
}

/// Runs `operation`'s handle to the end and checks the state it left at once.
fn finish(registry: &Registry, model: &str, handle: baton_core::registry::LoadHandle, state: State) {
    handle.wait().unwrap_or_else(|e| panic!("{model}: {e}"));
    let status = registry.status(model).expect("a status");
    assert!(!status.busy, "{model} still busy when its handle resolved");
    assert_eq!(status.state, state, "{model}'s state when its handle resolved");
}

/// Load 1, 2, 3 (1 freed), roll back (3 freed), load 3, retire 2 (freed),
/// fail to load 4, unload (3 freed), with a request through each stable
/// version. Returns once all four frees are recorded.
fn cycle(registry: &Registry, model: &str, infer: impl Fn(&Routing) -> u64) {
    let serving = |registry: &Registry| infer(&registry.snapshot());
    for version in 1..=3 {
        finish(registry, model, registry.load(model, Some(version)).unwrap(), State::Ready);
        assert_eq!(serving(registry), version);
    }
    finish(registry, model, registry.rollback(model).unwrap(), State::Ready);
    assert_eq!(serving(registry), 2);
    finish(registry, model, registry.load(model, Some(3)).unwrap(), State::Ready);
    assert_eq!(registry.status(model).unwrap().previous, vec![2]);
    finish(registry, model, registry.retire(model, 2).unwrap(), State::Ready);
    let refused = registry.load(model, Some(4)).unwrap().wait().expect_err("version 4 is broken");
    let status = registry.status(model).unwrap();
    assert!(!status.busy && status.state == State::Ready, "after the failure: {:?}", status.state);
    assert_eq!(status.last_error.map(|f| f.kind), Some(refused.kind()));
    assert_eq!(serving(registry), 3);
    finish(registry, model, registry.unload(model).unwrap(), State::Idle);
    let freed = eventually("the four frees to be recorded", || {
        let freed: Vec<u64> =
            registry.unload_records().iter().filter(|r| r.model == model).map(|r| r.version).collect();
        (freed.len() == 4).then_some(freed)
    });
    assert_eq!(freed, vec![1, 3, 2, 3], "freed in the order the cycle dropped them");
}

#[test]
fn a_cycle_with_the_fake_backend_takes_no_serving_lock_on_lowered_threads() {
    watch_lowered_threads();
    let repo = TestRepo::new();
    repo.add_model("f", FAKE_TOML);
    for (version, scale) in [(1, "1"), (2, "2"), (3, "3"), (4, "not a number")] {
        repo.write_files("f", version, &[("fake.txt", scale.as_bytes())]);
        repo.seal("f", version);
    }
    let registry = registry_with(repo.root(), vec![Arc::new(FakeBackend::new())]);
    cycle(&registry, "f", |snapshot| {
        let x = Tensor::from_f32("x", vec![1, 4], &[1.0; 4]);
        snapshot.infer("f", None, &[x]).expect("the fake answers").version
    });
    assert_eq!(
        registry.status("f").unwrap().failed_versions[&4].stage,
        Some(baton_core::registry::events::Stage::Load)
    );
    assert_lowered_threads_kept_to_themselves();
}

#[test]
fn a_cycle_with_onnx_runtime_takes_no_serving_lock_on_lowered_threads() {
    watch_lowered_threads();
    let repo = TestRepo::new();
    let mlp = |version: u64| Mlp::new(&[8, 16, 2], 2000 + version);
    repo.add_model("m", &mlp_toml(&mlp(1), ""));
    for version in 1..=3 {
        repo.publish_mlp("m", version, &mlp(version));
    }
    repo.publish_damaged("m", 4, &mlp(4), Damage::FlipByte);
    let registry = registry(repo.root());
    cycle(&registry, "m", |snapshot| infer_mlp(snapshot, "m", &[0.5; 8], 1).expect("the MLP answers").0);
    assert_lowered_threads_kept_to_themselves();
}

#[test]
fn resource_swaps_and_budget_checks_take_no_serving_lock_on_lowered_threads() {
    watch_lowered_threads();
    let repo = TestRepo::new();
    repo.add_model("r", &format!("{FAKE_TOML}[policy]\nswap = \"resource\"\nmemory_budget = \"1GiB\"\n"));
    for (version, scale) in [(1, "1"), (2, "2"), (3, "not a number")] {
        repo.write_files("r", version, &[("fake.txt", scale.as_bytes())]);
        repo.seal("r", version);
    }
    let config = baton_core::registry::RegistryConfig { memory_budget: Some(1 << 30), ..Default::default() };
    let registry = registry_configured(repo.root(), vec![Arc::new(FakeBackend::new())], config);
    let serving = |registry: &Registry| {
        let x = Tensor::from_f32("x", vec![1, 4], &[1.0; 4]);
        registry.snapshot().infer("r", None, &[x]).expect("the fake answers").version
    };
    for version in 1..=2 {
        finish(&registry, "r", registry.load("r", Some(version)).unwrap(), State::Ready);
        assert_eq!(serving(&registry), version);
    }
    registry.load("r", Some(3)).unwrap().wait().expect_err("version 3 is broken");
    assert_eq!(serving(&registry), 2, "version 2 was loaded back");
    assert_lowered_threads_kept_to_themselves();
}

/// The (nice value, scheduling policy) of this process's threads named `name`.
fn priorities_of(name: &str) -> Vec<(i64, i64)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().filter_map(Result::ok) {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        if comm.trim() != name {
            continue;
        }
        // After the parenthesised command name: nice is field 19 overall, policy field 41.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
        found.push((fields[16].parse().unwrap(), fields[38].parse().unwrap()));
    }
    found
}

#[test]
fn a_loads_drain_thread_runs_at_serving_priority() {
    watch_lowered_threads();
    let repo = TestRepo::new();
    repo.add_model("d", FAKE_TOML);
    for version in [1, 2] {
        repo.write_files("d", version, &[("fake.txt", b"1")]);
        repo.seal("d", version);
    }
    let registry = registry_with(repo.root(), vec![Arc::new(FakeBackend::new())]);
    finish(&registry, "d", registry.load("d", Some(1)).unwrap(), State::Ready);
    // A request pinning the table keeps version 2's drain waiting.
    let pinned = registry.snapshot();
    let handle = registry.load("d", Some(2)).unwrap();
    let drains = eventually("a drain thread", || {
        let drains = priorities_of("baton-drain");
        (!drains.is_empty()).then_some(drains)
    });
    let own = (i64::from(baton_core::threads::sys::current_thread_nice().unwrap()), 0); // SCHED_OTHER
    assert!(priorities_of("baton-build").iter().any(|p| p.1 == 5), "the build threads run under SCHED_IDLE");
    assert!(drains.iter().all(|p| *p == own), "drain threads at {drains:?}, serving at {own:?}");
    drop(pinned);
    finish(&registry, "d", handle, State::Ready);
    assert_lowered_threads_kept_to_themselves();
}
