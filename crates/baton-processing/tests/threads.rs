//! Which thread runs a version's processing: a session thread, always,
//! even for a request cheap enough that the version without processing
//! would run it inline on the thread that submits it (an async worker in
//! the server). The fake engine records the thread of each inference.

use std::sync::Arc;

use baton_core::tensors::tensor::Tensor;
use baton_processing::ProcessingBackend;
use baton_testkit::fake::{FAKE_TOML, FakeBackend};
use baton_testkit::registry_with;
use baton_testkit::repo::TestRepo;

/// The threads that ran one cheap request each on version 1 and version 2
/// (version 2 with a sigmoid after its graph), and version 2's answer.
fn threads_running() -> (Vec<String>, Vec<String>, Vec<f32>) {
    let repo = TestRepo::new();
    repo.add_model("m", FAKE_TOML);
    repo.write_files("m", 1, &[("fake.txt", b"2")]);
    repo.seal("m", 1);
    let processing = "[output]\nname = \"y\"\nsteps = [\"sigmoid\"]\n";
    repo.write_files("m", 2, &[("fake.txt", b"2"), ("processing.toml", processing.as_bytes())]);
    repo.seal("m", 2);
    let backend = FakeBackend::new();
    let threads = backend.threads();
    let registry = registry_with(repo.root(), vec![Arc::new(ProcessingBackend::new(Arc::new(backend)))]);
    let input = vec![Tensor::from_f32("x", vec![1, 4], &[0.0; 4])];
    let mut ran = Vec::new();
    let mut answer = Vec::new();
    for version in [1, 2] {
        registry.load("m", Some(version)).unwrap().wait().unwrap();
        let served = Arc::clone(registry.snapshot().resolve("m", Some(version)).unwrap());
        let before = threads.lock().unwrap().len();
        let outputs = served.infer(&input).unwrap();
        ran.push(threads.lock().unwrap()[before..].to_vec());
        answer = outputs.iter().find(|t| t.name == "y").and_then(Tensor::to_f32).unwrap_or_default();
    }
    (ran[0].clone(), ran[1].clone(), answer)
}

#[test]
fn processing_runs_on_a_session_thread_never_inline() {
    let here = std::thread::current().name().unwrap_or_default().to_owned();
    let (plain, processed, answer) = threads_running();
    assert_eq!(plain, [here.as_str()], "a cheap request to a plain version runs inline");
    assert_eq!(processed, ["baton-session"], "a version with processing runs it on a session thread");
    assert_eq!(answer.len(), 4, "the sigmoid's output, named as processing.toml says");
}
