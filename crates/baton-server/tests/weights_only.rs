//! A weights-only version, black box: `baton package --graph-from` writes
//! its graph from an earlier version, the server loads it, serves exactly
//! what the whole model with those weights serves, and its status and
//! events say it was a `weights` update, with its memory split up; a
//! weights file that does not fit the earlier graph is refused by `baton
//! package` itself.

mod common;

use std::process::Command;

use baton_onnx::mlp::mlp_safetensors;
use baton_testkit::onnx::sample_input;
use baton_testkit::repo::{TestRepo, mlp_toml};
use common::{SIZES, bin, infer, mlp, start};
use serde_json::json;

#[test]
fn a_packaged_weights_only_version_serves_and_says_what_it_was() {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("m", 1, &mlp(1));
    repo.publish_mlp("m", 3, &mlp(2));
    let dir = repo.write_files("m", 2, &[("weights.safetensors", &mlp_safetensors(&mlp(2)))]);
    let packaged = Command::new(bin())
        .args(["package", dir.to_str().unwrap(), "--graph-from", repo.version_dir("m", 1).to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&packaged.stdout);
    assert!(packaged.status.success(), "{said}{}", String::from_utf8_lossy(&packaged.stderr));
    assert!(said.contains("graph.onnx") && said.contains("MANIFEST"), "{said}");

    let server = start(&repo, &["--model-control", "explicit", "--load-model", "m"]);
    server.wait_settled("m", 3);
    let input = sample_input(SIZES[0], 2, 3);
    let (_, whole) = infer(&server, "m", &input, 2);
    let loaded = server.post_json("/baton/v1/models/m/load", &json!({ "version": 2 }));
    assert_eq!(loaded.status, 200, "{}", common::text(&loaded.body));
    assert_eq!(loaded.json()["update"], "weights", "{}", common::text(&loaded.body));
    let (version, weights_only) = infer(&server, "m", &input, 2);
    assert_eq!(version, 2);
    assert_eq!(weights_only, whole, "the weights-only version answers as the whole model with its weights");

    let status = server.status("m");
    let live = status["live"].as_array().unwrap();
    let two = live.iter().find(|v| v["version"] == 2).expect("version 2 is live");
    assert_eq!(two["update"], "weights");
    let three = live.iter().find(|v| v["version"] == 3).expect("version 3 is kept");
    assert_eq!(three["update"], "graph");
    for key in ["weights", "shared", "session_overhead", "total"] {
        assert!(two["memory"][key].is_u64(), "memory.{key} in {two}");
    }
    assert_eq!(two["memory"]["total"], two["bytes_held"]);
    let metrics = server.metrics();
    let series = r#"baton_version_memory_bytes{model="m",version="2",twin="false",part="weights",update="weights"}"#;
    let weights = baton_testkit::server::metric(&metrics, series);
    assert_eq!(weights, two["memory"]["weights"].as_f64(), "{series} in the metrics");
    assert!(weights.is_some_and(|w| w > 0.0));

    // A weights file of another shape does not fit version 1's graph.
    let wrong = repo.write_files(
        "m",
        4,
        &[("weights.safetensors", &mlp_safetensors(&baton_testkit::onnx::Mlp::new(&[8, 4, 2], 1)))],
    );
    let refused = Command::new(bin())
        .args(["package", wrong.to_str().unwrap(), "--graph-from", repo.version_dir("m", 1).to_str().unwrap()])
        .output()
        .unwrap();
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(error.contains("fc0.weight") && error.contains("shape [8, 4]"), "{error}");
    assert!(!wrong.join("MANIFEST").exists(), "a refused package writes no MANIFEST");
}
