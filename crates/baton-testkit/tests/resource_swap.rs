//! The resource swap policy (`[policy] swap = "resource"`): the version
//! that serves is drained and freed before the new one loads, requests that
//! arrive meanwhile wait at the model's gate and are answered by the new
//! version, a candidate refused by verify pauses nothing, and one that
//! fails after the pause brings the old version back.

use baton_core::registry::Registry;
use baton_core::registry::error::LoadError;
use baton_core::registry::events::{Event, EventKind, Stage, State};
use baton_core::tensors::tensor::Tensor;
use baton_testkit::fake::{FAKE_TOML, FakeBackend, Gate};
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{Damage, TestRepo, mlp_toml};
use baton_testkit::{drain_events, infer_mlp, registry_with};
use std::sync::{Arc, Barrier, Mutex};

const RESOURCE: &str = "[policy]\nswap = \"resource\"\nkeep_previous = 1\n";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
}

/// Runs one fake inference the way a server does: waits while the model is
/// paused, then serves on the snapshot it gets.
fn fake_request(registry: &Registry) -> Result<u64, baton_core::run::error::InferError> {
    let snapshot = runtime().block_on(registry.snapshot_serving("f"));
    let x = Tensor::from_f32("x", vec![1, 4], &[1.0, 2.0, 3.0, 4.0]);
    snapshot.infer("f", None, &[x]).map(|answer| answer.version)
}

fn position(events: &[Event], what: impl Fn(&Event) -> bool) -> usize {
    events.iter().position(what).unwrap_or_else(|| panic!("no such event among {events:#?}"))
}

#[test]
fn requests_wait_while_the_old_version_is_freed_and_the_new_one_loads() {
    let repo = TestRepo::new();
    repo.add_model("f", &format!("{FAKE_TOML}{RESOURCE}"));
    repo.write_files("f", 1, &[("fake.txt", b"2")]);
    repo.seal("f", 1);
    repo.write_files("f", 2, &[("fake.txt", b"3"), ("hold", b"")]);
    repo.seal("f", 2);
    let gate = Gate::closed();
    let registry = registry_with(repo.root(), vec![Arc::new(FakeBackend::gated(gate.clone()))]);
    registry.load("f", Some(1)).unwrap().wait().unwrap();
    let mut events = registry.subscribe();

    let loading = registry.load("f", Some(2)).unwrap();
    // Held in its load stage: the old version is gone already.
    gate.wait_for_waiters(1);
    assert!(registry.snapshot().paused("f").is_some(), "the model is paused");
    assert!(registry.snapshot().model("f").is_none(), "no route while paused");
    assert!(registry.live_versions("f").is_empty(), "version 1 was freed before version 2 loads");
    assert!(registry.unload_records().iter().any(|r| r.model == "f" && r.version == 1));
    let status = registry.status("f").unwrap();
    assert!(status.paused && status.busy, "{status:?}");

    // Requests sent now wait; none fails.
    const WAITING: usize = 4;
    let started = Arc::new(Barrier::new(WAITING + 1));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..WAITING)
        .map(|_| {
            let (registry, started, answers) = (registry.clone(), Arc::clone(&started), Arc::clone(&answers));
            std::thread::spawn(move || {
                started.wait();
                let answer = fake_request(&registry);
                answers.lock().unwrap().push(answer.map_err(|e| e.to_string()));
            })
        })
        .collect();
    started.wait();
    assert!(registry.snapshot().paused("f").is_some(), "still paused while the requests are sent");
    gate.open();
    let report = loading.wait().unwrap();
    for client in clients {
        client.join().unwrap();
    }
    let answers = answers.lock().unwrap().clone();
    assert_eq!(answers, vec![Ok(2); WAITING], "every waiting request was answered by version 2");

    assert_eq!((report.version, report.replaced), (Some(2), Some(1)));
    let paused = report.paused.expect("the report says how long the model was paused");
    assert!(report.stage(Stage::Vacate).is_some(), "{report:?}");
    assert!(paused >= report.stage(Stage::Load).unwrap(), "the pause covers the load");
    let events = drain_events(&mut events);
    let pause = position(&events, |e| matches!(e.kind, EventKind::Paused { replacing: 1 }));
    let freed = position(&events, |e| e.version == Some(1) && matches!(e.kind, EventKind::Unloaded { .. }));
    let vacating = position(&events, |e| matches!(e.kind, EventKind::Transition { to: State::Draining, .. }));
    let loads = vacating
        + position(&events[vacating..], |e| matches!(e.kind, EventKind::Transition { to: State::Loading, .. }));
    let resumed = position(&events, |e| matches!(e.kind, EventKind::Resumed { restored: false, .. }));
    assert!(pause < freed && freed < loads && loads < resumed, "paused, freed, loaded, resumed: {events:#?}");
    let EventKind::Resumed { paused: in_event, serving, .. } = &events[resumed].kind else { unreachable!() };
    assert_eq!((*in_event, *serving), (paused, Some(2)));

    // No version is kept: going back is a load, not a rollback.
    let status = registry.status("f").unwrap();
    assert!(status.previous.is_empty() && !status.paused, "{status:?}");
    assert!(matches!(registry.rollback("f").unwrap_err(), LoadError::NoPrevious { .. }));
    registry.load("f", Some(1)).unwrap().wait().unwrap();
    assert_eq!(fake_request(&registry).unwrap(), 1);
    gate.close();
}

#[test]
fn a_damaged_candidate_pauses_nothing_and_a_failed_one_brings_the_old_version_back() {
    let repo = TestRepo::new();
    repo.add_model("f", &format!("{FAKE_TOML}{RESOURCE}"));
    repo.write_files("f", 1, &[("fake.txt", b"2")]);
    repo.seal("f", 1);
    // Refused at verify: changed after it was sealed.
    repo.write_files("f", 2, &[("fake.txt", b"3")]);
    repo.seal("f", 2);
    repo.write_files("f", 2, &[("fake.txt", b"4")]);
    // Refused at load, once the old version is gone.
    repo.write_files("f", 3, &[("fake.txt", b"not a number")]);
    repo.seal("f", 3);
    let registry = registry_with(repo.root(), vec![Arc::new(FakeBackend::new())]);
    registry.load("f", Some(1)).unwrap().wait().unwrap();
    let mut events = registry.subscribe();

    let error = registry.load("f", Some(2)).unwrap().wait().unwrap_err();
    assert_eq!(error.stage(), Some(Stage::Verify), "{error}");
    let seen = drain_events(&mut events);
    assert!(!seen.iter().any(|e| matches!(e.kind, EventKind::Paused { .. })), "verify failed before any pause");
    assert_eq!(registry.live_versions("f").iter().map(|v| v.version).collect::<Vec<_>>(), vec![1]);

    let error = registry.load("f", Some(3)).unwrap().wait().unwrap_err();
    assert_eq!((error.stage(), error.kind()), (Some(Stage::Load), "load_failed"), "{error}");
    // The failure is answered once its events are out.
    let seen = drain_events(&mut events);
    let freed = position(&seen, |e| e.version == Some(1) && matches!(e.kind, EventKind::Unloaded { .. }));
    let resumed = position(&seen, |e| matches!(e.kind, EventKind::Resumed { .. }));
    let failed = position(&seen, |e| matches!(e.kind, EventKind::Failed { stage: Stage::Load, .. }));
    assert!(freed < resumed && resumed < failed, "freed, loaded back, then the failure reported: {seen:#?}");
    let EventKind::Resumed { serving, restored, .. } = seen[resumed].kind else { unreachable!() };
    assert_eq!((serving, restored), (Some(1), true), "the old version was loaded back");
    let status = registry.status("f").unwrap();
    assert_eq!((status.serving, status.paused), (Some(1), false));
    let failure = status.last_error.unwrap();
    assert_eq!(
        (failure.stage, failure.version),
        (Some(Stage::Load), Some(3)),
        "the failure names the candidate's stage"
    );
    assert_eq!(fake_request(&registry).unwrap(), 1);
}

#[test]
fn an_onnx_model_swaps_under_traffic_with_one_version_in_memory() {
    let repo = TestRepo::new();
    let sizes = [16, 64, 2];
    let mlps: Vec<Mlp> = (1..=3).map(|v| Mlp::new(&sizes, v)).collect();
    repo.add_model("m", &mlp_toml(&mlps[0], RESOURCE));
    for (v, mlp) in (1..).zip(&mlps) {
        repo.publish_mlp("m", v, mlp);
    }
    // Passes verify, fails validation (weights damaged before sealing
    // would be caught by verify; this one is refused by its golden set).
    let input = sample_input(16, 2, 5);
    let wrong = baton_testkit::repo::golden_json(&mlps[0], &input, 2);
    let (model, _) = baton_testkit::onnx::encode_mlp(&mlps[2], &Default::default());
    repo.write_files("m", 4, &[("model.onnx", &model), ("golden/a.json", &wrong)]);
    repo.seal("m", 4);
    repo.publish_damaged("m", 5, &mlps[1], Damage::FlipByte);
    let registry = baton_testkit::registry(repo.root());
    registry.load("m", Some(1)).unwrap().wait().unwrap();

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let most_live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watcher = {
        let (registry, stop, most_live) = (registry.clone(), Arc::clone(&stop), Arc::clone(&most_live));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let live = registry.live_versions("m").len();
                most_live.fetch_max(live, std::sync::atomic::Ordering::SeqCst);
                std::thread::yield_now();
            }
        })
    };
    let clients: Vec<_> = (0..3)
        .map(|c| {
            let (registry, stop, mlps) = (registry.clone(), Arc::clone(&stop), mlps.clone());
            std::thread::spawn(move || {
                let runtime = runtime();
                let input = sample_input(16, 1, 100 + c);
                let mut answered = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let snapshot = runtime.block_on(registry.snapshot_serving("m"));
                    let (version, output) = infer_mlp(&snapshot, "m", &input, 1).expect("no request fails");
                    let expected = mlps[version as usize - 1].forward(&input, 1);
                    assert!(baton_testkit::max_diff(&output, &expected) < 1e-5, "version {version}'s outputs");
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    let mut pauses = Vec::new();
    for v in [2, 3] {
        let report = registry.load("m", Some(v)).unwrap().wait().unwrap();
        pauses.push(report.paused.expect("paused"));
    }
    let failed = registry.load("m", Some(4)).unwrap().wait().unwrap_err();
    assert_eq!((failed.stage(), failed.reason()), (Some(Stage::Validate), "golden_mismatch"), "{failed}");
    let refused = registry.load("m", Some(5)).unwrap().wait().unwrap_err();
    assert_eq!(refused.stage(), Some(Stage::Verify));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let answered: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    watcher.join().unwrap();
    assert!(answered > 0);
    assert_eq!(most_live.load(std::sync::atomic::Ordering::SeqCst), 1, "never two versions in memory");
    assert_eq!(registry.status("m").unwrap().serving, Some(3), "version 3 was loaded back after 4 failed");
    eprintln!("resource pauses of a {sizes:?} MLP: {pauses:?}; {answered} requests answered");
}
