//! The ONNX backend against the real ONNX Runtime library, on MLP models
//! written by baton-testkit.
//!
//! These tests need the library: run `scripts/fetch-onnxruntime.sh` (or set
//! `ORT_DYLIB_PATH`). Without it they fail, saying so.

use std::path::Path;
use std::sync::Arc;

use baton_core::files::spec::ModelSpec;
use baton_core::files::verified::Verified;
use baton_core::run::backend::{Backend, Model, WeightsError};
use baton_core::tensors::tensor::{DataType, Tensor, TensorData};
use baton_onnx::OnnxBackend;
use baton_onnx::mlp::{Mlp, OnnxOptions, encode_mlp, sample_input};

/// The backend; fails the test with the fix when the runtime is missing.
fn backend() -> OnnxBackend {
    if let Err(e) = baton_onnx::init() {
        panic!("ONNX Runtime is required for these tests [{}]: {}", e.kind, e.message);
    }
    OnnxBackend::new().expect("backend after a successful init")
}

/// Seals `dir` as a version (writes its MANIFEST) and verifies it, as the
/// load transaction does before the backend sees a version.
fn sealed(dir: &Path) -> Verified {
    baton_core::files::manifest::write(dir).expect("writing MANIFEST");
    baton_core::files::manifest::verify(dir).expect("verifying the version")
}

fn spec(engine: &str) -> ModelSpec {
    ModelSpec::parse(&format!("[engine]\n{engine}")).expect("valid model.toml")
}

/// Writes the MLP as `dir/model.onnx` (plus its external data file, if any).
fn write_mlp(dir: &Path, mlp: &Mlp, opts: &OnnxOptions) {
    let (model, external) = encode_mlp(mlp, opts);
    std::fs::write(dir.join("model.onnx"), model).unwrap();
    if let (Some(data), Some(name)) = (external, &opts.external_data) {
        std::fs::write(dir.join(name), data).unwrap();
    }
}

fn load(backend: &OnnxBackend, dir: &Path, engine: &str) -> Box<dyn Model> {
    match backend.load(&sealed(dir), &spec(engine)) {
        Ok(model) => model,
        Err(e) => panic!("load failed [{}]: {}", e.kind, e.message),
    }
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-4, "element {i}: got {g}, want {w}");
    }
}

/// Runs the model on a batch and checks it against the reference forward pass.
fn check_batch(model: &dyn Model, mlp: &Mlp, batch: usize, seed: u64, instance: Option<usize>) {
    let x = sample_input(mlp.input_width(), batch, seed);
    let input = Tensor::from_f32("input", vec![batch as i64, mlp.input_width() as i64], &x);
    let outputs = match instance {
        Some(i) => model.infer_on(i, &[input]),
        None => model.infer(&[input]),
    }
    .unwrap_or_else(|e| panic!("inference failed [{}]: {}", e.kind, e.message));
    assert_eq!(outputs.len(), 1);
    let out = &outputs[0];
    assert_eq!(out.name, "output");
    assert_eq!(out.datatype, DataType::Fp32);
    assert_eq!(out.shape, vec![batch as i64, mlp.output_width() as i64]);
    assert_close(&out.to_f32().unwrap(), &mlp.forward(&x, batch));
}

#[test]
fn outputs_match_the_reference_at_batch_1_and_32() {
    let backend = backend();
    assert_eq!(backend.name(), "onnx");
    let dir = tempfile::tempdir().unwrap();
    let mlp = Mlp::new(&[64, 128, 32, 3], 11);
    write_mlp(dir.path(), &mlp, &OnnxOptions::default());
    let model = load(&backend, dir.path(), "sessions = 1");
    let sig = model.signature();
    assert_eq!(sig.inputs.len(), 1);
    assert_eq!(sig.inputs[0].name, "input");
    assert_eq!(sig.inputs[0].datatype, DataType::Fp32);
    assert_eq!(sig.inputs[0].shape, vec![-1, 64]);
    assert_eq!(sig.outputs[0].name, "output");
    assert_eq!(sig.outputs[0].shape, vec![-1, 3]);
    for batch in [1, 32] {
        check_batch(model.as_ref(), &mlp, batch, batch as u64, None);
    }
}

#[test]
fn every_optimization_level_gives_the_same_answer() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    let mlp = Mlp::new(&[16, 32, 4], 5);
    write_mlp(dir.path(), &mlp, &OnnxOptions::default());
    for level in ["disable", "basic", "extended", "all"] {
        let model = load(&backend, dir.path(), &format!("sessions = 1\noptimization = \"{level}\""));
        check_batch(model.as_ref(), &mlp, 8, 3, None);
    }
}

#[test]
fn infer_on_reaches_each_instance() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    let mlp = Mlp::new(&[8, 16, 2], 21);
    write_mlp(dir.path(), &mlp, &OnnxOptions::default());
    let model = load(&backend, dir.path(), "sessions = 3");
    assert_eq!(model.instances(), 3);
    for i in 0..3 {
        check_batch(model.as_ref(), &mlp, 4, i as u64, Some(i));
    }
    let input = Tensor::from_f32("input", vec![1, 8], &[0.0; 8]);
    let e = model.infer_on(3, &[input]).unwrap_err();
    assert!(e.message.contains("instance 3"), "{}", e.message);
}

#[test]
fn default_pool_size_is_cpus_capped_at_four() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    write_mlp(dir.path(), &Mlp::new(&[4, 2], 1), &OnnxOptions::default());
    let model = backend.load(&sealed(dir.path()), &ModelSpec::parse("").unwrap()).unwrap();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(model.instances(), cpus.min(4));
}

#[test]
fn concurrent_requests_are_all_correct() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    let mlp = Arc::new(Mlp::new(&[32, 64, 4], 8));
    write_mlp(dir.path(), &mlp, &OnnxOptions::default());
    let model: Arc<dyn Model> = Arc::from(load(&backend, dir.path(), "sessions = 4"));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (model, mlp) = (Arc::clone(&model), Arc::clone(&mlp));
            std::thread::spawn(move || {
                for r in 0..200u64 {
                    let batch = 1 + (r % 4) as usize;
                    check_batch(model.as_ref(), &mlp, batch, t * 1000 + r, None);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a request thread failed");
    }
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    write_mlp(dir.path(), &Mlp::new(&[4, 3, 2], 2), &OnnxOptions::default());
    let model = load(&backend, dir.path(), "sessions = 2");
    let good = Tensor::from_f32("input", vec![2, 4], &[0.5; 8]);
    assert!(model.infer(std::slice::from_ref(&good)).is_ok());

    let mut cases: Vec<(&str, Vec<Tensor>)> = Vec::new();
    cases.push(("wrong width", vec![Tensor::from_f32("input", vec![2, 5], &[0.5; 10])]));
    cases.push(("wrong rank", vec![Tensor::from_f32("input", vec![8], &[0.5; 8])]));
    cases.push(("scalar", vec![Tensor::from_f32("input", vec![], &[0.5])]));
    let mut fp64 = good.clone();
    fp64.datatype = DataType::Fp64;
    fp64.shape = vec![1, 4];
    cases.push(("wrong dtype", vec![fp64]));
    let mut int32 = good.clone();
    int32.datatype = DataType::Int32;
    cases.push(("int32 for fp32", vec![int32]));
    let mut bytes = good.clone();
    bytes.datatype = DataType::Bytes;
    bytes.data = TensorData::Bytes(vec![b"x".to_vec(); 8]);
    cases.push(("bytes for fp32", vec![bytes]));
    let mut short = good.clone();
    short.data = TensorData::Raw(vec![0; 7]);
    cases.push(("short data", vec![short]));
    let mut negative = good.clone();
    negative.shape = vec![-2, -4];
    cases.push(("negative dims", vec![negative]));
    let mut huge = good.clone();
    huge.shape = vec![i64::MAX, i64::MAX];
    cases.push(("overflowing shape", vec![huge]));
    let mut mismatched = good.clone();
    mismatched.data = TensorData::Bytes(vec![]);
    cases.push(("bytes data for fp32", vec![mismatched]));
    cases.push(("no inputs", vec![]));
    cases.push(("unknown name", vec![Tensor::from_f32("nope", vec![2, 4], &[0.5; 8])]));
    cases.push(("duplicate", vec![good.clone(), good.clone()]));
    let non_utf8 = Tensor {
        name: "input".into(),
        datatype: DataType::Bytes,
        shape: vec![1],
        data: TensorData::Bytes(vec![vec![0xff, 0x00]]),
    };
    cases.push(("non-utf8 bytes", vec![non_utf8]));
    for (what, inputs) in cases {
        match model.infer(&inputs) {
            Ok(out) => panic!("{what}: expected an error, got {out:?}"),
            Err(e) => {
                assert!(
                    ["inference_failed", "invalid_input"].contains(&e.kind),
                    "{what}: kind {} ({})",
                    e.kind,
                    e.message
                );
                assert!(!e.message.is_empty(), "{what}");
            }
        }
    }
    // The pool still serves after all that.
    for i in 0..model.instances() {
        assert!(model.infer_on(i, std::slice::from_ref(&good)).is_ok());
    }
}

#[test]
fn an_empty_batch_is_served() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    write_mlp(dir.path(), &Mlp::new(&[4, 3], 2), &OnnxOptions::default());
    let model = load(&backend, dir.path(), "sessions = 1");
    let out = model.infer(&[Tensor::from_f32("input", vec![0, 4], &[])]).unwrap();
    assert_eq!(out[0].shape, vec![0, 3]);
    assert_eq!(out[0].data, TensorData::Raw(vec![]));
}

#[test]
fn garbage_model_files_are_model_invalid() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    let missing = backend.load(&sealed(dir.path()), &spec("")).err().expect("no model.onnx");
    assert_eq!(missing.kind, "model_invalid");
    for garbage in
        [b"this is not an onnx model".to_vec(), vec![], vec![0xff; 4096], (0..=255u8).cycle().take(10_000).collect()]
    {
        std::fs::write(dir.path().join("model.onnx"), &garbage).unwrap();
        let e = backend.load(&sealed(dir.path()), &spec("sessions = 1")).err().expect("garbage must not load");
        assert_eq!(e.kind, "model_invalid", "{}", e.message);
        assert!(!e.message.is_empty());
    }
    // A truncated real model.
    let (model, _) = encode_mlp(&Mlp::new(&[8, 8, 2], 1), &OnnxOptions::default());
    std::fs::write(dir.path().join("model.onnx"), &model[..model.len() / 2]).unwrap();
    let e = backend.load(&sealed(dir.path()), &spec("sessions = 1")).err().expect("truncated model must not load");
    assert_eq!(e.kind, "model_invalid", "{}", e.message);
}

#[test]
fn unknown_or_bad_engine_options_are_refused() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    write_mlp(dir.path(), &Mlp::new(&[4, 2], 1), &OnnxOptions::default());
    for engine in ["sesions = 2", "sessions = 0", "optimization = \"fast\"", "intra_op_threads = \"2\""] {
        let e = backend.load(&sealed(dir.path()), &spec(engine)).err().expect(engine);
        assert_eq!(e.kind, "invalid_engine_options", "{engine}: {}", e.message);
    }
    let e = backend.load(&sealed(dir.path()), &spec("gpu = true")).err().unwrap();
    assert!(e.message.contains("'gpu'"), "{}", e.message);
}

#[test]
fn weights_are_visited_inline_and_external() {
    let _staging = staging();
    let backend = backend();
    let mlp = Mlp::new(&[12, 20, 3], 7);
    let expected = mlp.tensors();
    for external in [None, Some("model.onnx.data".to_string())] {
        let dir = tempfile::tempdir().unwrap();
        let opts = OnnxOptions { external_data: external.clone(), ..Default::default() };
        write_mlp(dir.path(), &mlp, &opts);
        let model = load(&backend, dir.path(), "sessions = 2");
        check_batch(model.as_ref(), &mlp, 5, 9, None);

        let mut seen = Vec::new();
        model
            .visit_weights(&mut |w| {
                assert_eq!(w.datatype, Some(DataType::Fp32), "{}", w.name);
                seen.push((w.name.to_string(), w.shape.to_vec(), w.data.to_vec()));
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, expected, "external: {external:?}");

        // A refusal stops the walk and is reported as such.
        let mut calls = 0;
        let e = model
            .visit_weights(&mut |w| {
                calls += 1;
                Err(format!("{} refused", w.name))
            })
            .unwrap_err();
        assert!(matches!(&e, WeightsError::Refused(m) if m == "fc0.weight refused"), "{e}");
        assert_eq!(calls, 1);

        if external.is_some() {
            // The weights are read from the verified files again at each
            // visit, and a file deleted since is noticed.
            std::fs::remove_file(dir.path().join("model.onnx.data")).unwrap();
            let e = model.visit_weights(&mut |_| Ok(())).unwrap_err();
            assert!(matches!(&e, WeightsError::Read(m) if m.contains("model.onnx.data")), "{e}");
            // The loaded sessions keep serving.
            check_batch(model.as_ref(), &mlp, 2, 1, None);
        }
    }
}

/// Held by the tests that stage models (a model with external data, or a
/// large one), so that the staged directories and mappings one of them
/// counts are its own.
static STAGING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn staging() -> std::sync::MutexGuard<'static, ()> {
    STAGING.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The staged directories this process has left in the temporary directory.
fn staged_dirs_left() -> Vec<String> {
    let prefix = format!("baton-staged-{}-", std::process::id());
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(&prefix))
        .collect()
}

/// The files of staged directories this process still maps (their
/// directories are removed once the sessions exist, so they show as deleted).
fn staged_files_mapped() -> Vec<String> {
    let prefix = format!("baton-staged-{}-", std::process::id());
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mut files: Vec<String> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.contains(&prefix))
        .map(str::to_owned)
        .collect();
    files.dedup();
    files
}

#[test]
fn a_large_model_serves_the_same_answers_staged_or_not_and_leaves_no_files() {
    let _staging = staging();
    let backend = backend();
    // 1100 × 1100 floats: a 4.8 MB file, over the size read once, so staged.
    let mlp = Mlp::new(&[1100, 1100, 3], 5);
    let dir = tempfile::tempdir().unwrap();
    write_mlp(dir.path(), &mlp, &OnnxOptions::default());
    for staging in ["true", "false"] {
        let model = load(&backend, dir.path(), &format!("sessions = 2\nstage_weights = {staging}"));
        assert_eq!(staged_dirs_left(), Vec::<String>::new(), "staging {staging}: files left after the load");
        // Staging ran exactly when asked: the sessions map the staged weights.
        let mapped = staged_files_mapped();
        assert_eq!(!mapped.is_empty(), staging == "true", "staging {staging}: staged files mapped {mapped:?}");
        for instance in 0..2 {
            check_batch(model.as_ref(), &mlp, 1, 3, Some(instance));
            check_batch(model.as_ref(), &mlp, 8, 4, Some(instance));
        }
        let mut weights = 0;
        model
            .visit_weights(&mut |w| {
                weights += w.data.len();
                Ok(())
            })
            .unwrap();
        assert_eq!(weights, 4 * (1100 * 1100 + 1100 + 1100 * 3 + 3), "staging {staging}");
        drop(model);
        assert_eq!(staged_files_mapped(), Vec::<String>::new(), "staging {staging}: mapped after the model was freed");
    }
}

/// How a version's file changes between the verify stage and the load.
#[derive(Clone, Copy, Debug)]
enum Change {
    /// Another model's file renamed over it.
    RenamedOver,
    /// The same file written again with another model's bytes (same length).
    WrittenInPlace,
}

#[test]
fn a_file_swapped_or_written_between_verify_and_load_is_never_served() {
    let _staging = staging();
    let backend = backend();
    let external = OnnxOptions { external_data: Some("weights.bin".into()), ..OnnxOptions::default() };
    // Every way the backend reads a model: small and read once, large and
    // staged, large and read by ONNX Runtime itself, with external data.
    let cases = [
        ("small", &[8usize, 16, 2][..], OnnxOptions::default(), "sessions = 1", "model.onnx"),
        ("large staged", &[1100, 1100, 3][..], OnnxOptions::default(), "sessions = 1", "model.onnx"),
        ("large unstaged", &[1100, 1100, 3][..], OnnxOptions::default(), "stage_weights = false", "model.onnx"),
        ("external model", &[8, 16, 2][..], external.clone(), "sessions = 1", "model.onnx"),
        ("external data", &[8, 16, 2][..], external, "sessions = 1", "weights.bin"),
    ];
    for (what, sizes, opts, engine, file) in cases {
        let (good, other) = (Mlp::new(sizes, 1), Mlp::new(sizes, 2));
        // Unchanged: the verified model loads and serves.
        let dir = tempfile::tempdir().unwrap();
        write_mlp(dir.path(), &good, &opts);
        let model = load(&backend, dir.path(), engine);
        check_batch(model.as_ref(), &good, 2, 7, None);
        for change in [Change::RenamedOver, Change::WrittenInPlace] {
            let dir = tempfile::tempdir().unwrap();
            write_mlp(dir.path(), &good, &opts);
            let version = sealed(dir.path());
            let swapped = tempfile::tempdir().unwrap();
            write_mlp(swapped.path(), &other, &opts);
            let (from, to) = (swapped.path().join(file), dir.path().join(file));
            assert_eq!(std::fs::metadata(&from).unwrap().len(), std::fs::metadata(&to).unwrap().len());
            match change {
                Change::RenamedOver => std::fs::rename(&from, &to).unwrap(),
                Change::WrittenInPlace => std::fs::write(&to, std::fs::read(&from).unwrap()).unwrap(),
            }
            match backend.load(&version, &spec(engine)) {
                Ok(model) => panic!("{what}, {change:?}: loaded {} instances", model.instances()),
                Err(e) => {
                    assert_eq!(e.kind, "file_changed", "{what}, {change:?}: {}", e.message);
                    assert!(e.message.contains(file), "{what}, {change:?}: {}", e.message);
                }
            }
        }
    }
    assert_eq!(staged_dirs_left(), Vec::<String>::new(), "a refused load left a staged directory");
}
