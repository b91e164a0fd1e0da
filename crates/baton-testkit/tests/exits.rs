//! An engine that ends by itself (as a version's worker process does)
//! before its version is published: the load fails, naming the end, and
//! the version that served serves on. A worker's end cannot be timed into
//! those moments from outside; the test kit's fake engine reports its end
//! at the moment a test names instead (with its last warmup inference, or
//! once the load has checked that it is alive), through the same contract
//! a worker uses (`Model::alive`, `Model::on_exit`).

use std::sync::Arc;

use baton_core::registry::events::Stage;
use baton_core::tensors::tensor::Tensor;
use baton_testkit::fake::{FAKE_TOML, FakeBackend};
use baton_testkit::registry_with;
use baton_testkit::repo::TestRepo;

#[test]
fn an_engine_that_ends_before_its_version_is_published_fails_the_load_and_the_old_version_serves_on() {
    let repo = TestRepo::new();
    repo.add_model("m", FAKE_TOML);
    repo.write_files("m", 1, &[("fake.txt", b"2")]);
    repo.seal("m", 1);
    let backend = Arc::new(FakeBackend::new());
    let calls = backend.calls();
    let registry = registry_with(repo.root(), vec![backend]);
    registry.load("m", Some(1)).unwrap().wait().unwrap();
    // As many inferences as a load's warmup runs: version 2's engine ends
    // with the last of them.
    let warmup = calls.lock().unwrap().len();
    assert!(warmup > 0, "the warmup ran no inference");
    repo.write_files("m", 2, &[("fake.txt", b"3"), ("exit-after", warmup.to_string().as_bytes())]);
    repo.seal("m", 2);
    let error = registry.load("m", Some(2)).unwrap().wait().unwrap_err();
    assert_eq!((error.kind(), error.reason()), ("commit_failed", "engine_ended"), "{error}");
    assert_eq!(error.stage(), Some(Stage::Commit));
    assert!(error.to_string().contains("ended before"), "{error}");
    let snapshot = registry.snapshot();
    let stable = &snapshot.model("m").expect("model m still serves").stable;
    assert_eq!(stable.number(), 1);
    let answer = stable.infer(&[Tensor::from_f32("x", vec![1, 4], &[1.0, 2.0, 3.0, 4.0])]).unwrap();
    assert_eq!(answer[0].to_f32().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
    let status = registry.status("m").unwrap();
    assert_eq!(status.failed_versions[&2].stage, Some(Stage::Commit), "{status:?}");
}

/// The engine ends after the load's last stage found it alive and before
/// the version is published (as a worker may end in the moment between):
/// the check made where the version is published refuses it, the load
/// fails at its commit, and the version that served serves on.
#[test]
fn an_engine_that_ends_between_its_load_and_its_publish_fails_the_load_and_the_old_version_serves_on() {
    let repo = TestRepo::new();
    repo.add_model("m", FAKE_TOML);
    repo.write_files("m", 1, &[("fake.txt", b"2")]);
    repo.seal("m", 1);
    let registry = registry_with(repo.root(), vec![Arc::new(FakeBackend::new())]);
    registry.load("m", Some(1)).unwrap().wait().unwrap();
    // Ends once the load has asked whether it is alive, at the end of its
    // last stage; the next question, before the publish, finds it ended.
    repo.write_files("m", 2, &[("fake.txt", b"3"), ("exit-when-asked", b"1")]);
    repo.seal("m", 2);
    let error = registry.load("m", Some(2)).unwrap().wait().unwrap_err();
    assert_eq!((error.kind(), error.reason()), ("commit_failed", "engine_ended"), "{error}");
    assert_eq!(error.stage(), Some(Stage::Commit));
    let snapshot = registry.snapshot();
    let stable = &snapshot.model("m").expect("model m still serves").stable;
    assert_eq!(stable.number(), 1);
    let answer = stable.infer(&[Tensor::from_f32("x", vec![1, 4], &[1.0, 2.0, 3.0, 4.0])]).unwrap();
    assert_eq!(answer[0].to_f32().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
}
