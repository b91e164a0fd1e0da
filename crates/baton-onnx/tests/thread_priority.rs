//! ONNX Runtime worker threads run at serving priority even though models
//! are loaded on a low-priority loader thread.
//!
//! One test in its own binary, so that no other test creates or ends
//! threads while it counts them. Needs the ONNX Runtime library: run
//! `scripts/fetch-onnxruntime.sh` (or set `ORT_DYLIB_PATH`).

use baton_core::files::spec::ModelSpec;
use baton_core::files::verified::Verified;
use baton_core::run::backend::Backend;
use baton_core::tensors::tensor::Tensor;
use baton_core::threads::sys::{current_thread_nice, set_current_thread_nice};
use baton_onnx::mlp::{Mlp, OnnxOptions, encode_mlp, sample_input};
use baton_onnx::{OnnxBackend, SPAWNER_THREAD_NAME, WORKER_THREAD_NAME};

/// (thread id, name, nice) of every thread of this process, from
/// `/proc/self/task/*/stat` (the nice value is field 19).
fn threads() -> Vec<(u32, String, i32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let entry = entry.unwrap();
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let (open, close) = (stat.find('(').unwrap(), stat.rfind(')').unwrap());
        let name = stat[open + 1..close].to_string();
        // Fields after the name start at field 3 (state); nice is field 19.
        let nice = stat[close + 1..].split_whitespace().nth(16).unwrap().parse().unwrap();
        let tid = entry.file_name().to_str().unwrap().parse().unwrap();
        out.push((tid, name, nice));
    }
    out
}

/// The threads with this name; Linux shows only the first 15 bytes of it.
fn named(name: &str) -> Vec<(u32, String, i32)> {
    let shown = &name[..name.len().min(15)];
    threads().into_iter().filter(|t| t.1 == shown).collect()
}

/// Waits until exactly one thread bears the spawner's name: a thread
/// starts with its creator's name and sets its own once it runs, so the
/// spawner shows only once it has run, and new workers show under the
/// spawner's name until they have named themselves.
fn settle() {
    for _ in 0..200 {
        if named(SPAWNER_THREAD_NAME).len() == 1 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("worker threads did not name themselves: {:?}", threads());
}

/// Seals `dir` as a version (writes its MANIFEST) and verifies it, as the
/// load transaction does before the backend sees a version.
fn sealed(dir: &std::path::Path) -> Verified {
    baton_core::files::manifest::write(dir).expect("writing MANIFEST");
    baton_core::files::manifest::verify(dir).expect("verifying the version")
}

#[test]
fn workers_of_a_model_loaded_at_low_priority_run_at_serving_priority() {
    // Start ONNX Runtime from this (serving-priority) thread, as baton does at startup.
    if let Err(e) = baton_onnx::init() {
        panic!("ONNX Runtime is required for this test [{}]: {}", e.kind, e.message);
    }
    let backend = OnnxBackend::new().unwrap();
    let serving = current_thread_nice().unwrap();
    let loader_nice = (serving + 10).min(19);
    assert!(loader_nice > serving, "this test needs a nice value below 19 to start from, got {serving}");

    let mlp = Mlp::new(&[256, 512, 64, 4], 3);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.onnx"), encode_mlp(&mlp, &OnnxOptions::default()).0).unwrap();
    let path = dir.path().to_path_buf();

    // init started the spawner; on a busy machine it may not have run yet.
    settle();
    let spawner = named(SPAWNER_THREAD_NAME);
    assert_eq!(spawner.len(), 1, "{spawner:?}");
    assert_eq!(spawner[0].2, serving, "the spawner runs at the priority init ran at");
    assert!(named(WORKER_THREAD_NAME).is_empty());

    let (single, pooled, parallel) = std::thread::spawn(move || {
        set_current_thread_nice(loader_nice).unwrap();
        assert_eq!(current_thread_nice().unwrap(), loader_nice);
        // Control: on this system a new thread does inherit its creator's nice value.
        let inherited = std::thread::spawn(|| current_thread_nice().unwrap()).join().unwrap();
        assert_eq!(inherited, loader_nice, "threads should inherit the creator's nice value");
        let low = || threads().into_iter().filter(|t| t.2 == loader_nice).count();
        assert_eq!(low(), 1, "only this loader thread runs at loader priority");

        // intra_op_threads = 1: ORT creates no threads at all.
        let before = threads().len();
        let spec = ModelSpec::parse("[engine]\nsessions = 2\nintra_op_threads = 1").unwrap();
        let single = backend.load(&sealed(&path), &spec).unwrap();
        assert_eq!(threads().len(), before, "a single-threaded session creates no threads");

        // intra_op_threads > 1: the workers come from the spawner.
        let spec = ModelSpec::parse("[engine]\nsessions = 2\nintra_op_threads = 3").unwrap();
        let pooled = backend.load(&sealed(&path), &spec).unwrap_or_else(|e| panic!("[{}] {}", e.kind, e.message));
        assert_eq!(low(), 1, "no thread inherited the loader's priority: {:?}", threads());

        // inter_op_threads > 1 (parallel execution) also gets its threads from the spawner.
        let spec = ModelSpec::parse("[engine]\nsessions = 1\nintra_op_threads = 2\ninter_op_threads = 2").unwrap();
        let parallel = backend.load(&sealed(&path), &spec).unwrap_or_else(|e| panic!("[{}] {}", e.kind, e.message));
        assert_eq!(low(), 1, "no thread inherited the loader's priority: {:?}", threads());
        assert_eq!(current_thread_nice().unwrap(), loader_nice);
        (single, pooled, parallel)
    })
    .join()
    .expect("loader thread");

    settle();
    let workers = named(WORKER_THREAD_NAME);
    // ORT's pool of 3 uses the calling thread plus 2 workers, per session.
    assert!(workers.len() >= 2, "expected worker threads, found {:?}", threads());
    for (tid, _, nice) in &workers {
        assert_eq!(*nice, serving, "worker {tid} runs at nice {nice}, not the serving {serving}");
    }
    println!("{} workers at nice {serving}; loader ran at nice {loader_nice}", workers.len());

    // Both models serve correct results.
    for batch in [1usize, 64] {
        let x = sample_input(256, batch, batch as u64);
        let input = Tensor::from_f32("input", vec![batch as i64, 256], &x);
        let want = mlp.forward(&x, batch);
        for model in [&single, &pooled, &parallel] {
            for i in 0..model.instances() {
                let out = model.infer_on(i, std::slice::from_ref(&input)).unwrap();
                let got = out[0].to_f32().unwrap();
                assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-4));
            }
        }
    }

    // Dropping the models joins their workers.
    drop((pooled, parallel));
    assert!(named(WORKER_THREAD_NAME).is_empty(), "{:?}", threads());
}
