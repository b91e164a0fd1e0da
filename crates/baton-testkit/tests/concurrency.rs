//! One load per model at a time, and loading never stands in the way of
//! serving or of another model's rollback. Loads are held at a gate in the
//! fake backend, so the overlap is certain rather than a matter of timing.

use std::sync::Arc;

use baton_core::registry::error::LoadError;
use baton_core::tensors::tensor::Tensor;
use baton_testkit::fake::{FAKE_TOML, FakeBackend, Gate};
use baton_testkit::registry_with;
use baton_testkit::repo::TestRepo;

fn publish_fake(repo: &TestRepo, model: &str, version: u64, scale: f32, hold: bool) {
    let scale = scale.to_string();
    let mut files: Vec<(&str, &[u8])> = vec![("fake.txt", scale.as_bytes())];
    if hold {
        files.push(("hold", b""));
    }
    repo.write_files(model, version, &files);
    repo.seal(model, version);
}

fn infer(registry: &baton_core::registry::Registry, model: &str) -> (u64, Vec<f32>) {
    let x = Tensor::from_f32("x", vec![1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let answer = registry.snapshot().infer(model, None, &[x]).unwrap();
    (answer.version, answer.outputs[0].to_f32().unwrap())
}

#[test]
fn a_second_load_of_the_same_model_is_refused_while_one_runs() {
    let repo = TestRepo::new();
    repo.add_model("m", FAKE_TOML);
    publish_fake(&repo, "m", 1, 2.0, true);
    let gate = Gate::closed();
    let registry = registry_with(repo.root(), vec![Arc::new(FakeBackend::gated(gate.clone()))]);

    let first = registry.load("m", None).unwrap();
    gate.wait_for_waiters(1);
    let second = registry.load("m", None).unwrap_err();
    assert!(matches!(second, LoadError::InProgress { .. }), "{second}");
    assert_eq!(second.kind(), "load_in_progress");
    assert!(registry.rollback("m").is_err(), "a rollback does not cut in either");
    assert!(registry.status("m").unwrap().busy);

    gate.open();
    let report = first.wait().unwrap();
    assert_eq!(report.version, Some(1));
    assert!(!registry.status("m").unwrap().busy);
    assert!(registry.load("m", None).unwrap().wait().is_ok(), "free again once the first finished");
}

#[test]
fn serving_and_rollback_go_on_while_another_model_loads() {
    let repo = TestRepo::new();
    for model in ["served", "loading"] {
        repo.add_model(model, FAKE_TOML);
    }
    publish_fake(&repo, "served", 1, 2.0, false);
    publish_fake(&repo, "served", 2, 3.0, false);
    publish_fake(&repo, "loading", 1, 5.0, true);
    let gate = Gate::closed();
    let registry = registry_with(repo.root(), vec![Arc::new(FakeBackend::gated(gate.clone()))]);
    registry.load("served", Some(1)).unwrap().wait().unwrap();
    registry.load("served", Some(2)).unwrap().wait().unwrap();

    // The loader thread is now held inside another model's load.
    let held = registry.load("loading", None).unwrap();
    gate.wait_for_waiters(1);
    assert!(registry.status("loading").unwrap().busy);

    assert_eq!(infer(&registry, "served"), (2, vec![3.0, 6.0, 9.0, 12.0]), "serving does not wait for the loader");
    let rolled = registry.rollback("served").unwrap().wait().unwrap();
    assert_eq!(rolled.version, Some(1), "a rollback does not queue behind a load");
    assert_eq!(infer(&registry, "served").0, 1);

    gate.open();
    assert_eq!(held.wait().unwrap().version, Some(1));
    assert_eq!(infer(&registry, "loading"), (1, vec![5.0, 10.0, 15.0, 20.0]));
}
