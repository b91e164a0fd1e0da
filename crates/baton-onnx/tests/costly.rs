//! The costly MLP (`baton_onnx::costly`), which the latency guard's tests
//! serve as a candidate several times as costly as its stable version:
//! whatever its rows of work, it answers as the plain MLP does, batch by
//! batch, through the real ONNX Runtime and the ONNX backend, with the
//! engine options those tests give it (engine threads that busy-wait or
//! sleep).

use baton_core::files::spec::ModelSpec;
use baton_core::run::backend::{Backend, Model};
use baton_core::tensors::tensor::Tensor;
use baton_onnx::OnnxBackend;
use baton_onnx::mlp::{Mlp, sample_input};

fn load(backend: &OnnxBackend, mlp: &Mlp, rows: usize, engine: &str) -> Box<dyn Model> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.onnx"), baton_onnx::costly::encode_costly(mlp, rows)).unwrap();
    baton_core::files::manifest::write(dir.path()).unwrap();
    let verified = baton_core::files::manifest::verify(dir.path()).unwrap();
    let spec = ModelSpec::parse(&format!("[engine]\n{engine}")).unwrap();
    backend.load(&verified, &spec).unwrap_or_else(|e| panic!("load failed [{}]: {}", e.kind, e.message))
}

#[test]
fn a_costly_mlp_answers_as_the_plain_one_whatever_its_rows_of_work() {
    if let Err(e) = baton_onnx::init() {
        panic!("ONNX Runtime is required for this test [{}]: {}", e.kind, e.message);
    }
    let backend = OnnxBackend::new().unwrap();
    let mlp = Mlp::new(&[16, 32, 8], 5);
    for (rows, engine) in
        [(1, ""), (7, ""), (64, "intra_op_threads = 2"), (64, "intra_op_threads = 2\nallow_spinning = false")]
    {
        let model = load(&backend, &mlp, rows, engine);
        for batch in [1, 3] {
            let input = sample_input(16, batch, rows as u64);
            let outputs = model.infer(&[Tensor::from_f32("input", vec![batch as i64, 16], &input)]).unwrap();
            let got = outputs.iter().find(|t| t.name == "output").and_then(Tensor::to_f32).unwrap();
            let want = mlp.forward(&input, batch);
            assert_eq!(got.len(), want.len(), "{rows} rows, batch {batch}");
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{rows} rows, {engine:?}, batch {batch}: {g} != {w}");
            }
        }
    }
}
