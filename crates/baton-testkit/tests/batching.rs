//! Dynamic batching: requests that wait while the engine is busy run as one
//! batch, and every request gets back exactly its own rows.

use std::sync::Arc;

use baton_core::tensors::tensor::Tensor;
use baton_testkit::fake::{FakeBackend, Gate};
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::{max_diff, registry, registry_with};

const FAKE_BATCHING: &str = "backend = \"fake\"\n\
    inputs = [{ name = \"x\", datatype = \"FP32\", shape = [-1, 4] }]\n\
    outputs = [{ name = \"y\", datatype = \"FP32\", shape = [-1, 4] }]\n\
    [warmup]\ngenerated = false\n\
    [batching]\nenabled = true\nmax_batch = 16\n";

fn rows(n: usize, start: f32) -> Tensor {
    let values: Vec<f32> = (0..n * 4).map(|i| start + i as f32).collect();
    Tensor::from_f32("x", vec![n as i64, 4], &values)
}

#[test]
fn requests_queued_behind_a_busy_engine_run_as_one_batch() {
    let repo = TestRepo::new();
    repo.add_model("m", FAKE_BATCHING);
    repo.write_files("m", 1, &[("fake.txt", b"2"), ("hold-first-infer", b"")]);
    repo.seal("m", 1);
    let gate = Gate::closed();
    let backend = FakeBackend::gated(gate.clone());
    let calls = backend.calls();
    let registry = registry_with(repo.root(), vec![Arc::new(backend)]);
    registry.load("m", None).unwrap().wait().unwrap();
    let snapshot = registry.snapshot();
    let version = Arc::clone(snapshot.resolve("m", None).unwrap());
    assert!(version.batches());

    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    // The first request finds the session thread free and runs there, where
    // it is held at the gate…
    let leader = version.submit(vec![rows(1, 0.0)], None).unwrap();
    gate.wait_for_waiters(1);
    // …while three more queue up behind it.
    let queued: Vec<_> = [(2, 100.0), (3, 200.0), (1, 300.0)].iter().map(|(n, s)| (rows(*n, *s), *n, *s)).collect();
    let pending: Vec<_> = queued.iter().map(|(t, _, _)| version.submit(vec![t.clone()], None).unwrap()).collect();
    gate.open();

    let first = runtime.block_on(leader).unwrap();
    assert_eq!(first[0].to_f32().unwrap(), rows(1, 0.0).to_f32().unwrap().iter().map(|v| v * 2.0).collect::<Vec<_>>());
    for ((input, n, _), answer) in queued.iter().zip(pending) {
        let output = runtime.block_on(answer).unwrap();
        assert_eq!(output[0].shape, vec![*n as i64, 4], "each request gets its own number of rows");
        let expected: Vec<f32> = input.to_f32().unwrap().iter().map(|v| v * 2.0).collect();
        assert_eq!(output[0].to_f32().unwrap(), expected, "rows went to the wrong request");
    }
    assert_eq!(*calls.lock().unwrap(), vec![1, 6], "the three queued requests ran as one batch of 6 rows");
    // With the engine free again, a lone request runs at once, unbatched.
    let alone = runtime.block_on(version.submit(vec![rows(2, 5.0)], None).unwrap()).unwrap();
    assert_eq!(alone[0].shape, vec![2, 4]);
    assert_eq!(*calls.lock().unwrap(), vec![1, 6, 2]);
}

#[test]
fn concurrent_requests_through_onnx_runtime_get_their_own_outputs() {
    let repo = TestRepo::new();
    let mlp = Mlp::new(&[16, 32, 4], 3);
    // Room in the queue for all 96 at once: this test is about batching, not admission.
    let extra = "[batching]\nenabled = true\nmax_batch = 8\nmax_queue_delay_us = 200\n[admission]\nmax_queue = 96";
    repo.add_model("m", &mlp_toml(&mlp, extra));
    repo.publish_mlp("m", 1, &mlp);
    let registry = registry(repo.root());
    registry.load("m", None).unwrap().wait().unwrap();
    let version = Arc::clone(registry.snapshot().resolve("m", None).unwrap());
    assert!(version.batches());

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let tasks: Vec<_> = (0..96u64)
        .map(|i| {
            let version = Arc::clone(&version);
            let batch = 1 + (i % 3) as usize;
            let input = sample_input(16, batch, 1000 + i);
            runtime.spawn(async move {
                let tensor = Tensor::from_f32("input", vec![batch as i64, 16], &input);
                let output = version.submit(vec![tensor], None).unwrap().await.unwrap();
                (input, batch, output[0].to_f32().unwrap())
            })
        })
        .collect();
    for task in tasks {
        let (input, batch, output) = runtime.block_on(task).unwrap();
        let diff = max_diff(&output, &mlp.forward(&input, batch));
        assert!(diff < 1e-5, "a batched request got outputs off by {diff}");
    }
}
