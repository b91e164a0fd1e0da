//! Which thread runs a request: a cheap one runs on the thread that submits
//! it when a session is free (the inline fast path), a large batch on a
//! session thread, and with `inline_us = 0` every request on a session
//! thread. The fake engine records the thread of each inference.

use std::sync::Arc;

use baton_core::tensors::tensor::Tensor;
use baton_testkit::fake::{FAKE_TOML, FakeBackend};
use baton_testkit::registry_with;
use baton_testkit::repo::TestRepo;

fn rows(n: usize) -> Vec<Tensor> {
    vec![Tensor::from_f32("x", vec![n as i64, 4], &vec![1.0; n * 4])]
}

/// The threads that ran the requests of `sizes`, sent one after another
/// to version 1 of a fake model with `extra` in its `model.toml`.
fn threads_running(extra: &str, sizes: &[usize]) -> Vec<String> {
    let repo = TestRepo::new();
    repo.add_model("m", &format!("{FAKE_TOML}{extra}"));
    repo.write_files("m", 1, &[("fake.txt", b"2")]);
    repo.seal("m", 1);
    let backend = FakeBackend::new();
    let threads = backend.threads();
    let registry = registry_with(repo.root(), vec![Arc::new(backend)]);
    registry.load("m", None).unwrap().wait().unwrap();
    let version = Arc::clone(registry.snapshot().resolve("m", None).unwrap());
    let warmup = threads.lock().unwrap().len();
    for &n in sizes {
        assert_eq!(version.infer(&rows(n)).unwrap()[0].shape, vec![n as i64, 4]);
    }
    threads.lock().unwrap()[warmup..].to_vec()
}

#[test]
fn cheap_requests_run_inline_and_large_batches_on_a_session_thread() {
    let here = std::thread::current().name().unwrap_or_default().to_owned();
    // The fake's warmup runs take microseconds: one row is cheap, and
    // 100,000 rows are estimated at 100,000 times that, over 1 ms.
    let ran = threads_running("", &[1, 2, 100_000]);
    assert_eq!(ran, [here.as_str(), here.as_str(), "baton-session"]);
    let ran = threads_running("[admission]\ninline_us = 0\n", &[1]);
    assert_eq!(ran, ["baton-session"], "inline_us = 0 hands every request over");
}
