//! A BERT-style encoder exported the way PyTorch exports one loads with
//! the default validation, answers exactly as ONNX Runtime run directly
//! does, and warms up with generated token ids inside its vocabulary. A
//! damaged copy of it is still refused.

use baton_core::registry::Registry;
use baton_core::registry::events::Stage;
use baton_core::run::warmed::Sample;
use baton_core::tensors::tensor::{DataType, Tensor, TensorData};
use baton_testkit::encoder::{Batch, Encoder, INPUTS, encoder_toml, lookup_model, reference};
use baton_testkit::registry;
use baton_testkit::repo::TestRepo;

/// A repository with the encoder's `model.toml` (plus `extra`) and
/// `model` published as version 1, with `files` beside it.
fn repo_with(encoder: &Encoder, extra: &str, model: &[u8], files: &[(&str, &[u8])]) -> TestRepo {
    let repo = TestRepo::new();
    repo.add_model("encoder", &encoder_toml(encoder, extra));
    let mut all: Vec<(&str, &[u8])> = vec![("model.onnx", model)];
    all.extend_from_slice(files);
    repo.write_files("encoder", 1, &all);
    repo.seal("encoder", 1);
    repo
}

fn loaded(repo: &TestRepo) -> Registry {
    let registry = registry(repo.root());
    registry.load("encoder", None).unwrap().wait().unwrap_or_else(|e| panic!("the encoder was refused: {e}"));
    registry
}

fn int64s(t: &Tensor) -> Vec<i64> {
    let TensorData::Raw(bytes) = &t.data else { panic!("{} has no raw data", t.name) };
    assert_eq!(t.datatype, DataType::Int64, "{}", t.name);
    bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn the_encoder_loads_with_default_validation_and_answers_exactly_as_onnx_runtime() {
    let encoder = Encoder::new(7);
    let model = encoder.encode();
    assert!((100_000..400_000).contains(&model.len()), "a few hundred KB: {}", model.len());
    let registry = loaded(&repo_with(&encoder, "", &model, &[]));
    for (batch, sequence, seed) in [(1, 1, 1), (3, 7, 2), (2, encoder.max_positions, 3)] {
        let inputs = Batch::new(&encoder, batch, sequence, seed);
        let answer = registry.snapshot().infer("encoder", None, &inputs.tensors()).unwrap();
        let expected = reference(&model, &inputs);
        for (name, shape, values) in expected {
            let got = answer.outputs.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"));
            assert_eq!(got.shape, shape, "{name}");
            let got = got.to_f32().unwrap();
            assert!(values.iter().all(|v| v.is_finite()), "{name} is finite");
            let same_bits = got.iter().zip(&values).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same_bits && got.len() == values.len(), "{name} differs from ONNX Runtime's: {got:?} {values:?}");
        }
    }
}

#[test]
fn generated_warmup_inputs_stay_inside_the_tables_they_index() {
    let encoder = Encoder::new(8);
    let registry = loaded(&repo_with(&encoder, "[warmup]\nbatch_sizes = [1, 8, 64]", &encoder.encode(), &[]));
    let snapshot = registry.snapshot();
    let version = &snapshot.model("encoder").unwrap().stable;
    assert_eq!(version.warmed().generated_skipped, None);
    let generated: Vec<&Sample> = version.warmup().iter().filter(|s| s.name.starts_with("generated")).collect();
    assert_eq!(generated.len(), 3, "one sample per batch size");
    let column = |name: &str| -> Vec<i64> {
        generated.iter().flat_map(|s| int64s(s.inputs.iter().find(|t| t.name == name).unwrap())).collect()
    };
    let ids = column(INPUTS[0]);
    assert!(ids.iter().all(|id| (0..encoder.vocab as i64).contains(id)), "{ids:?}");
    assert!(ids.contains(&(encoder.vocab as i64 - 1)), "the vocabulary's last row is used");
    assert!(ids.iter().filter(|id| **id >= 100).count() > 40, "ids spread over the vocabulary: {ids:?}");
    let types = column(INPUTS[2]);
    assert!(types.iter().all(|t| (0..2).contains(t)) && types.contains(&1), "{types:?}");

    // What generating past the table's end would have met: ONNX Runtime
    // refuses the index, so the load above could not have passed with one.
    let mut past = Batch::new(&encoder, 1, 2, 1);
    past.ids[1] = encoder.vocab as i64;
    let error = snapshot.infer("encoder", None, &past.tensors()).unwrap_err();
    assert!(error.to_string().contains("out of data bounds"), "{error}");
}

#[test]
fn an_integer_input_of_unknown_range_is_not_generated_and_shipped_samples_still_run() {
    let toml = "backend = \"onnx\"\n[validation]\n";
    let sample = br#"{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                                 {"name": "i", "datatype": "INT64", "shape": [2], "data": [3, 0]}]}"#;
    for shipped in [false, true] {
        let repo = TestRepo::new();
        repo.add_model("lookup", toml);
        let files: Vec<(&str, &[u8])> = if shipped { vec![("warmup/a.json", &sample[..])] } else { Vec::new() };
        let model = lookup_model();
        repo.write_files("lookup", 1, &[&[("model.onnx", &model[..])][..], &files].concat());
        repo.seal("lookup", 1);
        let registry = registry(repo.root());
        registry.load("lookup", None).unwrap().wait().unwrap_or_else(|e| panic!("refused: {e}"));
        let snapshot = registry.snapshot();
        let version = &snapshot.model("lookup").unwrap().stable;
        let reason = version.warmed().generated_skipped.clone().expect("generation skipped, with a reason");
        assert!(reason.starts_with("input 'i'") && reason.contains("Gather"), "{reason}");
        let names: Vec<&str> = version.warmup().iter().map(|s| s.name.as_str()).collect();
        let runs = version.warmed().runs;
        if shipped {
            assert_eq!(names, ["warmup/a.json"]);
            assert!(runs >= 1, "the shipped sample ran");
        } else {
            assert!(names.is_empty() && runs == 0, "{names:?}, {runs} runs");
        }
        let x = Tensor::from_f32("x", vec![1, 4], &[1.0, 2.0, 3.0, 4.0]);
        let i = Tensor {
            name: "i".into(),
            datatype: DataType::Int64,
            shape: vec![2],
            data: TensorData::Raw([2i64, 1].iter().flat_map(|v| v.to_le_bytes()).collect()),
        };
        let answer = snapshot.infer("lookup", None, &[x, i]).unwrap();
        assert_eq!(answer.outputs[0].to_f32().unwrap(), [3.0, 2.0]);
    }
}

#[test]
fn a_damaged_encoder_is_still_refused() {
    let encoder = Encoder::new(9);
    let damaged = |target: &'static str, index: usize, value: f32| {
        encoder.encode_with(&mut move |name, values| {
            if name == target {
                values[index] = value;
            }
        })
    };
    let cases = [
        ("NaN in the vocabulary table", damaged("embeddings.word_embeddings.weight", 40, f32::NAN), "nan"),
        ("an outlier in a weight matrix", damaged("encoder.layer.0.attention.self.key.weight", 3, 3e7), "magnitude"),
        ("an Inf in a bias vector", damaged("encoder.layer.0.intermediate.dense.bias", 5, f32::INFINITY), "inf"),
        ("a NaN mask fill value", damaged("fmin", 0, f32::NAN), "nan"),
        ("an ordinary value in the causal mask", damaged("causal_mask", 1, 0.5), "inf"),
    ];
    for (case, model, reason) in cases {
        let repo = repo_with(&encoder, "", &model, &[]);
        let error = registry(repo.root()).load("encoder", None).unwrap().wait().unwrap_err();
        assert_eq!((error.stage(), error.reason()), (Some(Stage::Validate), reason), "{case}: {error}");
    }
}
