//! Every kind of broken version is refused at the stage that should catch
//! it, with an error naming that stage and the reason, and the serving
//! version keeps answering as if nothing happened. That includes versions
//! whose files reach outside their directory (a symlink out, an external
//! data location with `..` or an absolute path); a symlink between files of
//! the version, or one out that `model.toml` allows, loads. A version whose
//! golden set the model does not reproduce is refused the same way.

use std::path::{Path, PathBuf};

use baton_core::registry::error::LoadError;
use baton_core::registry::events::{Stage, State};
use baton_testkit::onnx::{Mlp, OnnxOptions, encode_mlp, sample_input};
use baton_testkit::repo::{Damage, TestRepo, golden_json, mlp_toml, sample_json};
use baton_testkit::{infer_mlp, max_diff, registry};

const SIZES: [usize; 3] = [8, 16, 2];

/// Publishes version 1, loads it, lets `breaks` publish a broken version 2,
/// loads version 2 and checks the refusal and that version 1 still serves;
/// returns the refusal.
fn refused(stage: Stage, reason: &str, breaks: impl FnOnce(&TestRepo, &Mlp)) -> LoadError {
    let repo = TestRepo::new();
    let good = Mlp::new(&SIZES, 1);
    repo.add_model("m", &mlp_toml(&good, ""));
    repo.publish_mlp("m", 1, &good);
    let registry = registry(repo.root());
    registry.load("m", None).unwrap().wait().unwrap();

    breaks(&repo, &Mlp::new(&SIZES, 2));
    let error = registry.load("m", Some(2)).unwrap().wait().unwrap_err();
    assert_eq!(error.stage(), Some(stage), "{error}");
    assert_eq!(error.reason(), reason, "{error}");
    assert!(error.to_string().starts_with(stage.as_str()), "the message names the stage: {error}");

    let input = sample_input(SIZES[0], 1, 4);
    let (version, output) = infer_mlp(&registry.snapshot(), "m", &input, 1).unwrap();
    assert_eq!(version, 1, "the active version keeps serving");
    assert!(max_diff(&output, &good.forward(&input, 1)) < 1e-5);
    let status = registry.status("m").unwrap();
    assert_eq!(status.state, State::Ready);
    let failure = status.last_error.expect("the failure is recorded");
    assert_eq!((failure.stage, failure.version, failure.reason), (Some(stage), Some(2), reason));
    assert!(!status.busy, "a failed load does not leave the model locked");
    error
}

fn with_weight(mut mlp: Mlp, value: f32) -> Mlp {
    mlp.layers[0].weight[3] = value;
    mlp
}

macro_rules! refused {
    ($name:ident, $stage:ident, $reason:literal, |$repo:ident, $mlp:ident| $body:expr) => {
        #[test]
        fn $name() {
            refused(Stage::$stage, $reason, |$repo: &TestRepo, $mlp: &Mlp| {
                $body;
            });
        }
    };
}

refused!(truncated_file, Verify, "size_mismatch", |repo, mlp| {
    repo.publish_mlp("m", 2, mlp);
    repo.damage("m", 2, Damage::Truncate)
});
refused!(wrong_sha256, Verify, "digest_mismatch", |repo, mlp| {
    repo.publish_mlp("m", 2, mlp);
    repo.damage("m", 2, Damage::FlipByte)
});
refused!(missing_manifest, Verify, "manifest_missing", |repo, mlp| {
    repo.publish_mlp("m", 2, mlp);
    repo.damage("m", 2, Damage::RemoveManifest)
});
refused!(partial_manifest, Verify, "manifest_incomplete", |repo, mlp| {
    repo.publish_mlp("m", 2, mlp);
    repo.damage("m", 2, Damage::CutManifest)
});
refused!(unlisted_file, Verify, "unlisted_file", |repo, mlp| {
    repo.publish_mlp("m", 2, mlp);
    repo.write_files("m", 2, &[("sneaked-in.bin", b"x")])
});
refused!(unparsable_onnx, Load, "model_invalid", |repo, _mlp| {
    repo.write_files("m", 2, &[("model.onnx", b"this is not a protobuf model")]);
    repo.seal("m", 2)
});
refused!(unknown_backend, Load, "unknown_backend", |repo, mlp| {
    repo.add_model("m", &mlp_toml(mlp, "").replace("\"onnx\"", "\"tensorflow\""));
    repo.publish_mlp("m", 2, mlp)
});
refused!(nan_weight, Validate, "nan", |repo, mlp| repo.publish_mlp("m", 2, &with_weight(mlp.clone(), f32::NAN)));
refused!(inf_weight, Validate, "inf", |repo, mlp| repo.publish_mlp("m", 2, &with_weight(mlp.clone(), f32::INFINITY)));
refused!(huge_weight, Validate, "magnitude", |repo, mlp| repo.publish_mlp("m", 2, &with_weight(mlp.clone(), 3e7)));
refused!(all_zero_matrix, Validate, "all_zero", |repo, mlp| {
    let mut zero = mlp.clone();
    zero.layers[1].weight.iter_mut().for_each(|w| *w = 0.0);
    repo.publish_mlp("m", 2, &zero)
});
refused!(nan_in_external_data, Validate, "nan", |repo, mlp| {
    let opts = OnnxOptions { external_data: Some("weights.bin".into()), ..OnnxOptions::default() };
    repo.publish_mlp_with("m", 2, &with_weight(mlp.clone(), f32::NAN), &opts, &[])
});
refused!(input_contradicts_model_toml, Validate, "signature_mismatch", |repo, mlp| {
    let opts = OnnxOptions { input_name: "features".into(), ..OnnxOptions::default() };
    repo.publish_mlp_with("m", 2, mlp, &opts, &[])
});
refused!(output_shape_contradicts_model_toml, Validate, "signature_mismatch", |repo, _mlp| {
    repo.publish_mlp("m", 2, &Mlp::new(&[8, 16, 3], 2))
});
refused!(declared_weight_shape_differs, Validate, "declared_mismatch", |repo, mlp| {
    let declared = "[validation]\ntensors = [{ name = \"fc0.weight\", datatype = \"FP32\", shape = [8, 99] }]";
    repo.add_model("m", &mlp_toml(mlp, declared));
    repo.publish_mlp("m", 2, mlp)
});
refused!(warmup_sample_fails, Warmup, "inference_failed", |repo, mlp| {
    let wrong_width = sample_json("input", 1, 5, &[0.1; 5]);
    repo.publish_mlp_with("m", 2, mlp, &OnnxOptions::default(), &[("warmup/bad.json", &wrong_width)])
});
refused!(warmup_sample_unparsable, Warmup, "bad_sample", |repo, mlp| {
    repo.publish_mlp_with("m", 2, mlp, &OnnxOptions::default(), &[("warmup/bad.json", b"{not json")])
});
refused!(warmup_too_slow, Warmup, "too_slow", |repo, mlp| {
    // A zero budget: any real run is over it, whatever the machine's speed.
    repo.add_model("m", &mlp_toml(mlp, "[warmup]\nmax_latency_ms = 0"));
    repo.publish_mlp("m", 2, mlp)
});
refused!(golden_set_of_other_weights, Validate, "golden_mismatch", |repo, mlp| {
    publish_with_golden(repo, mlp, &golden_json(&Mlp::new(&SIZES, 3), &sample_input(SIZES[0], 2, 7), 2))
});
refused!(golden_file_unparsable, Validate, "golden_invalid", |repo, mlp| {
    publish_with_golden(repo, mlp, b"{\"inputs\": [")
});
refused!(golden_file_names_an_unknown_output, Validate, "golden_invalid", |repo, mlp| {
    let golden = golden_json(mlp, &sample_input(SIZES[0], 1, 7), 1);
    publish_with_golden(repo, mlp, &String::from_utf8(golden).unwrap().replace("\"output\"", "\"logits\"").into_bytes())
});
refused!(golden_output_of_the_wrong_shape, Validate, "golden_invalid", |repo, mlp| {
    let golden = serde_json::json!({
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, SIZES[0]], "data": sample_input(SIZES[0], 1, 7)}],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [1, 3], "data": [0, 0, 0]}],
    });
    publish_with_golden(repo, mlp, golden.to_string().as_bytes())
});
refused!(golden_file_changed_after_packaging, Verify, "digest_mismatch", |repo, mlp| {
    publish_with_golden(repo, mlp, &golden_json(mlp, &sample_input(SIZES[0], 1, 7), 1));
    // One digit changed, the size kept: only the digest can tell.
    let path = repo.version_dir("m", 2).join("golden/a.json");
    let mut bytes = std::fs::read(&path).unwrap();
    let digit = bytes.iter().rposition(u8::is_ascii_digit).unwrap();
    bytes[digit] = b'0' + (bytes[digit] - b'0' + 1) % 10;
    std::fs::write(&path, bytes).unwrap()
});
refused!(missing_version, Fetch, "version_not_found", |repo, _mlp| assert!(!repo.version_dir("m", 2).exists()));
refused!(symlink_out_of_the_version, Verify, "outside_version", |repo, mlp| {
    let outside = write_outside(repo, "model.onnx", &encode_mlp(mlp, &OnnxOptions::default()).0);
    link_in_version(repo, 2, "model.onnx", &outside);
    repo.seal("m", 2)
});
refused!(external_data_symlinked_out_of_the_version, Verify, "outside_version", |repo, mlp| {
    let opts = OnnxOptions { external_data: Some("weights.bin".into()), ..OnnxOptions::default() };
    let (model, data) = encode_mlp(mlp, &opts);
    let outside = write_outside(repo, "weights.bin", &data.expect("external data"));
    repo.write_files("m", 2, &[("model.onnx", &model)]);
    link_in_version(repo, 2, "weights.bin", &outside);
    repo.seal("m", 2)
});
refused!(external_data_location_with_dot_dot, Load, "external_data_outside_version", |repo, mlp| {
    // The data sits beside the version directory, where '../' leads.
    let opts = OnnxOptions { external_data: Some("../weights.bin".into()), ..OnnxOptions::default() };
    let (model, data) = encode_mlp(mlp, &opts);
    std::fs::write(repo.root().join("m/weights.bin"), data.expect("external data")).unwrap();
    repo.write_files("m", 2, &[("model.onnx", &model)]);
    repo.seal("m", 2)
});
refused!(external_data_location_absolute, Load, "external_data_outside_version", |repo, mlp| {
    let absolute = repo.root().join(".outside/weights.bin");
    let opts = OnnxOptions { external_data: Some(absolute.display().to_string()), ..OnnxOptions::default() };
    let (model, data) = encode_mlp(mlp, &opts);
    write_outside(repo, "weights.bin", &data.expect("external data"));
    repo.write_files("m", 2, &[("model.onnx", &model)]);
    repo.seal("m", 2)
});

/// Writes a file into the repository's `.outside` directory, which is no
/// model and no version, and returns its path.
fn write_outside(repo: &TestRepo, name: &str, bytes: &[u8]) -> PathBuf {
    let dir = repo.root().join(".outside");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
    dir.join(name)
}

/// Makes `name` in version `version` of model `m` a symlink to `target`.
fn link_in_version(repo: &TestRepo, version: u64, name: &str, target: &Path) {
    let dir = repo.version_dir("m", version);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(target, dir.join(name)).unwrap();
}

/// Publishes version 1, loads it, lets `publish` publish version 2 and
/// loads that: the version that serves afterwards and its output.
fn load_second(policy: &str, publish: impl FnOnce(&TestRepo, &Mlp)) -> (u64, Vec<f32>, Vec<f32>) {
    let repo = TestRepo::new();
    let (first, second) = (Mlp::new(&SIZES, 1), Mlp::new(&SIZES, 2));
    repo.add_model("m", &mlp_toml(&first, policy));
    repo.publish_mlp("m", 1, &first);
    let registry = registry(repo.root());
    registry.load("m", None).unwrap().wait().unwrap();
    publish(&repo, &second);
    registry.load("m", Some(2)).unwrap().wait().unwrap_or_else(|e| panic!("version 2 was refused: {e}"));
    let input = sample_input(SIZES[0], 1, 4);
    let (version, output) = infer_mlp(&registry.snapshot(), "m", &input, 1).unwrap();
    (version, output, second.forward(&input, 1))
}

#[test]
fn a_symlink_inside_the_version_is_accepted() {
    let (version, output, want) = load_second("", |repo, mlp| {
        repo.write_files("m", 2, &[("blobs/model.bin", &encode_mlp(mlp, &OnnxOptions::default()).0)]);
        link_in_version(repo, 2, "model.onnx", Path::new("blobs/model.bin"));
        repo.seal("m", 2)
    });
    assert_eq!(version, 2);
    assert!(max_diff(&output, &want) < 1e-5);
}

#[test]
fn a_symlink_out_of_the_version_is_accepted_when_model_toml_allows_it() {
    let policy = "[policy]\nallow_symlinks_outside_version = true";
    let (version, output, want) = load_second(policy, |repo, mlp| {
        let outside = write_outside(repo, "model.onnx", &encode_mlp(mlp, &OnnxOptions::default()).0);
        link_in_version(repo, 2, "model.onnx", &outside);
        repo.seal("m", 2)
    });
    assert_eq!(version, 2);
    assert!(max_diff(&output, &want) < 1e-5);
}

#[test]
fn a_shipped_warmup_sample_is_run_and_kept() {
    let repo = TestRepo::new();
    let mlp = Mlp::new(&SIZES, 1);
    repo.add_model("m", &mlp_toml(&mlp, "[warmup]\ngenerated = false"));
    let sample = sample_json("input", 2, 8, &[0.25; 16]);
    repo.publish_mlp_with("m", 1, &mlp, &OnnxOptions::default(), &[("warmup/two.json", &sample)]);
    let registry = registry(repo.root());
    registry.load("m", None).unwrap().wait().unwrap();
    let snapshot = registry.snapshot();
    let version = &snapshot.model("m").unwrap().stable;
    let names: Vec<&str> = version.warmup().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["warmup/two.json"]);
}

/// Publishes `mlp` as version 2 of `m` with `golden` as its `golden/a.json`.
fn publish_with_golden(repo: &TestRepo, mlp: &Mlp, golden: &[u8]) {
    repo.publish_mlp_with("m", 2, mlp, &OnnxOptions::default(), &[("golden/a.json", golden)]);
}

#[test]
fn a_golden_set_the_model_reproduces_lets_it_load_and_serve() {
    let (version, output, want) = load_second("", |repo, mlp| {
        publish_with_golden(repo, mlp, &golden_json(mlp, &sample_input(SIZES[0], 3, 7), 3))
    });
    assert_eq!(version, 2);
    assert!(max_diff(&output, &want) < 1e-5);
}

#[test]
fn a_golden_mismatch_names_the_file_output_element_values_and_tolerance() {
    let error = refused(Stage::Validate, "golden_mismatch", |repo, mlp| {
        // The expected outputs come from version 1's weights, not version 2's.
        publish_with_golden(repo, mlp, &golden_json(&Mlp::new(&SIZES, 1), &sample_input(SIZES[0], 2, 7), 2))
    });
    assert_eq!(error.kind(), "validate_failed");
    let message = error.to_string();
    for part in [
        "validate failed: golden sample golden/a.json: output 'output' element ",
        " expected ",
        "outside atol 0.00001 + rtol 0.0001·|expected|",
        " of 4 elements outside",
    ] {
        assert!(message.contains(part), "'{part}' is missing from: {message}");
    }
}
