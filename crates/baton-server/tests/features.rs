//! Versions that carry their feature transforms, black box: a client sends
//! raw named features, the version normalizes them into its graph's input
//! with its own parameters. Two versions that differ only in their
//! normalization are swapped, then rolled out, under load, and every answer
//! equals exactly the reference of the version that gave it. Bad features
//! are a 400 naming the problem, and change nothing.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use baton_core::tensors::tensor::Tensor;
use baton_testkit::onnx::{OnnxOptions, encode_mlp};
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Server, eventually};
use common::{SIZES, TOLERANCE, assert_no_panic, mlp, output_f32, start};
use serde_json::{Value, json};

/// The features a request carries, one per column of the graph's input.
const FEATURES: usize = SIZES[0];

/// The mean version `version` normalizes every feature with.
fn mean(version: u64) -> f64 {
    version as f64 - 1.0
}

const STD: f64 = 2.0;

/// A features.toml: every feature z-scored with `mean`, into `input`.
fn features(mean: f64) -> String {
    (0..FEATURES)
        .map(|i| {
            format!(
                "[[feature]]\nname = \"f{i}\"\ndatatype = \"FP32\"\ngraph_input = \"input\"\n\
                 scale_to_z_score = {{ mean = {mean:?}, std = {STD:?} }}\n\n"
            )
        })
        .collect()
}

/// Publishes version `version`: the same graph each time, its own
/// normalization.
fn publish(repo: &TestRepo, version: u64) {
    let (model, _) = encode_mlp(&mlp(1), &OnnxOptions::default());
    let spec = features(mean(version));
    repo.write_files("ctr", version, &[("model.onnx", &model), ("features.toml", spec.as_bytes())]);
    repo.seal("ctr", version);
}

/// The raw features of request `n`.
fn raw(n: usize) -> Vec<f32> {
    (0..FEATURES).map(|i| ((n * 7 + i * 3) % 23) as f32 * 0.25 - 2.0).collect()
}

fn request(raw: &[f32]) -> Value {
    let inputs: Vec<Value> = raw
        .iter()
        .enumerate()
        .map(|(i, v)| json!({ "name": format!("f{i}"), "datatype": "FP32", "shape": [1], "data": [v] }))
        .collect();
    json!({ "inputs": inputs })
}

/// What version `version` answers to `raw`, computed here.
fn reference(version: u64, raw: &[f32]) -> Vec<f32> {
    let normalized: Vec<f32> = raw.iter().map(|&v| ((f64::from(v) - mean(version)) / STD) as f32).collect();
    mlp(1).forward(&normalized, 1)
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= TOLERANCE)
}

fn serving(versions: &[u64]) -> (TestRepo, Server) {
    let repo = TestRepo::new();
    repo.add_model("ctr", "backend = \"onnx\"\n[policy]\nkeep_previous = 1\n");
    for &v in versions {
        publish(&repo, v);
    }
    let server = start(&repo, &["--model-control", "explicit", "--load-model", "ctr"]);
    server.wait_serving("ctr", versions[versions.len() - 1]);
    (repo, server)
}

/// Answers counted by the version that gave them (1 to 3).
type Counts = [AtomicUsize; 4];

/// Sets `stop` when dropped, also when the waiting thread panics, so that
/// the clients end and the scope does not wait on them for ever.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Sends requests from three clients until `done` says so, checking each
/// answer against the reference of the version that gave it; returns how
/// many answers came from each version.
fn under_load(server: &Server, done: impl Fn(&Counts) -> bool + Sync) -> Vec<(u64, usize)> {
    let stop = AtomicBool::new(false);
    let counts: Counts = Default::default();
    std::thread::scope(|scope| {
        let clients: Vec<_> = (0..3)
            .map(|c| {
                let (stop, counts) = (&stop, &counts);
                scope.spawn(move || {
                    let client = server.client();
                    let mut n = c;
                    while !stop.load(Ordering::Relaxed) {
                        let features = raw(n);
                        let answer = client.post_json("/v2/models/ctr/infer", &request(&features));
                        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
                        let body = answer.json();
                        let version = common::version_of(&body);
                        let output = output_f32(&body, "output");
                        let expected = reference(version, &features);
                        assert!(close(&output, &expected), "version {version}: {output:?}, its reference {expected:?}");
                        counts[usize::try_from(version).unwrap_or(0).min(3)].fetch_add(1, Ordering::Relaxed);
                        n += 3;
                    }
                })
            })
            .collect();
        let _stop = StopOnDrop(&stop);
        eventually("the load's end", || done(&counts).then_some(()));
        drop(_stop);
        for client in clients {
            client.join().expect("a client");
        }
    });
    (1..=3).map(|v| (v as u64, counts[v].load(Ordering::Relaxed))).filter(|&(_, n)| n > 0).collect()
}

#[test]
fn versions_that_differ_only_in_their_normalization_never_mix_under_a_swap_or_a_rollout() {
    let (repo, server) = serving(&[1]);
    let one = reference(1, &raw(0));
    assert!(!close(&one, &reference(2, &raw(0))), "the two normalizations answer apart");

    // A swap to version 2, the same graph: a processing update.
    publish(&repo, 2);
    let loaded = std::sync::Once::new();
    let counts = under_load(&server, |counts| {
        loaded.call_once(|| {
            let loaded = server.post_json("/baton/v1/models/ctr/load", &json!({ "version": 2 }));
            assert_eq!(loaded.status, 200, "{}", String::from_utf8_lossy(&loaded.body));
            assert_eq!(loaded.json()["update"], "processing", "{}", loaded.json());
        });
        counts[2].load(Ordering::Relaxed) >= 20
    });
    assert!(counts.iter().any(|&(v, n)| v == 2 && n >= 20), "answers of version 2 under load: {counts:?}");

    // A canary rollout to version 3 under load: both sides answer, each
    // with its own normalization, until the rollout ends either way.
    publish(&repo, 3);
    let plan = json!({ "version": 3, "steps": [50, 100], "interval_ms": 1500, "watch_ms": 0 });
    eventually("the rollout to start", || {
        let answer = server.post_json("/baton/v1/models/ctr/rollout", &plan);
        match answer.status {
            200 => Some(()),
            409 => None,
            _ => panic!("start: {}", String::from_utf8_lossy(&answer.body)),
        }
    });
    let counts = under_load(&server, |_| {
        let phase = server.get("/baton/v1/models/ctr/rollout").json()["rollout"]["phase"].clone();
        ["promoted", "rolled_back", "aborted"].contains(&phase.as_str().unwrap_or(""))
    });
    assert!(counts.iter().any(|&(v, _)| v == 3), "the candidate answered during its rollout: {counts:?}");
    assert!(counts.iter().any(|&(v, _)| v == 2), "the stable version answered during the rollout: {counts:?}");
    assert_no_panic(&server);
}

#[test]
fn bad_features_are_a_400_naming_the_problem_and_nothing_changes() {
    let (_repo, server) = serving(&[1]);
    let good = request(&raw(1));
    let before = server.post_json("/v2/models/ctr/infer", &good).json();

    let mut unknown = good.clone();
    unknown["inputs"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "name": "height", "datatype": "FP32", "shape": [1], "data": [1.0] }));
    let mut missing = good.clone();
    missing["inputs"].as_array_mut().unwrap().remove(3);
    let mut wrong_type = good.clone();
    wrong_type["inputs"][2] = json!({ "name": "f2", "datatype": "BYTES", "shape": [1], "data": ["tall"] });
    // Every declared feature is an input of the version's signature: an
    // unknown, missing or mistyped one is refused before the transforms,
    // naming it.
    for (body, named) in [(unknown, "'height'"), (missing, "missing input 'f3'"), (wrong_type, "input 'f2'")] {
        let answer = server.post_json("/v2/models/ctr/infer", &body);
        assert_eq!(answer.status, 400, "{named}: {}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.json()["kind"], "invalid_input", "{named}: {}", answer.json());
        assert!(answer.error().contains(named), "{named}: {}", answer.error());
    }
    // A value that is missing (NaN) of a feature with no default: the
    // transforms refuse it, naming the feature.
    let mut values = raw(1);
    values[5] = f32::NAN;
    let tensors: Vec<Tensor> =
        values.iter().enumerate().map(|(i, v)| Tensor::from_f32(format!("f{i}"), vec![1], &[*v])).collect();
    let (body, length) = common::binary_request(&tensors, &[]);
    let answer = server.post_raw("/v2/models/ctr/infer", &body, &[("inference-header-content-length", &length)]);
    assert_eq!(answer.status, 400, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json()["kind"], "missing_feature", "{}", answer.json());
    assert!(answer.error().contains("f5"), "{}", answer.error());
    let after = server.post_json("/v2/models/ctr/infer", &good).json();
    assert_eq!(before["outputs"], after["outputs"], "bad requests change nothing");
    assert!(close(&output_f32(&after, "output"), &reference(1, &raw(1))));
    assert_no_panic(&server);
}

/// A version takes texts or features: one that declares both a tokenizer
/// and feature transforms is refused at load, saying so, and the version
/// before it serves on.
#[test]
fn a_version_that_declares_both_a_tokenizer_and_features_is_refused() {
    let (repo, server) = serving(&[1]);
    let (model, _) = encode_mlp(&mlp(1), &OnnxOptions::default());
    let tokenizer = baton_testkit::text::word_level(&["a"], Some(8));
    let spec = features(mean(2));
    let processing = "[tokenizer]\n";
    let files: [(&str, &[u8]); 4] = [
        ("model.onnx", &model),
        ("features.toml", spec.as_bytes()),
        ("tokenizer.json", &tokenizer),
        ("processing.toml", processing.as_bytes()),
    ];
    repo.write_files("ctr", 2, &files);
    repo.seal("ctr", 2);
    let refused = server.post_json("/baton/v1/models/ctr/load", &json!({ "version": 2 }));
    assert_eq!(refused.status, 422, "{}", String::from_utf8_lossy(&refused.body));
    assert!(refused.error().contains("both a tokenizer and features.toml"), "{}", refused.error());
    let answer = server.post_json("/v2/models/ctr/infer", &request(&raw(2))).json();
    assert_eq!(common::version_of(&answer), 1, "{answer}");
    assert_no_panic(&server);
}
