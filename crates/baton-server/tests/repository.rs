//! The model repository extension end to end: the index lists every model
//! and version on disk or in memory as READY, UNAVAILABLE or FAILED (with
//! the refusing stage and its reason), and `{"ready": true}` keeps only the
//! ready ones; load without parameters brings the newest complete version
//! and `{"parameters": {"version": N}}` a chosen one; a corrupt version's
//! load is 422 naming the stage while the serving version keeps answering;
//! unload takes the model out of service (infer 503, index UNAVAILABLE,
//! server not ready since the model is required) and a new load brings it
//! back.

mod common;

use baton_testkit::onnx::sample_input;
use baton_testkit::repo::{Damage, TestRepo, mlp_toml};
use common::{SIZES, assert_close, assert_error, index, infer, mlp, start};
use serde_json::json;

fn row(name: &str, version: u64, state: &str) -> (String, String, String) {
    (name.to_owned(), version.to_string(), state.to_owned())
}

/// The index without reasons, for comparing states.
fn states(rows: &[(String, String, String, String)]) -> Vec<(String, String, String)> {
    rows.iter().map(|(n, v, s, _)| (n.clone(), v.clone(), s.clone())).collect()
}

#[test]
fn index_load_unload_and_load_again() {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), "[policy]\nkeep_previous = 1"));
    for v in 1..=3 {
        repo.publish_mlp("m", v, &mlp(v));
    }
    repo.publish_damaged("m", 4, &mlp(4), Damage::FlipByte);
    repo.add_model("other", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("other", 1, &mlp(1));
    // No watching: after the start-up scan, only the test loads anything.
    let server = start(&repo, &["--no-watch"]);
    // At start the newest version is refused, so the one before it loads.
    server.wait_settled("m", 3);
    server.wait_settled("other", 1);
    server.wait_ready();

    let batch = 2;
    let input = sample_input(SIZES[0], batch, 51);
    let expect = |version: u64| mlp(version).forward(&input, batch);

    let rows = index(&server, &json!({}));
    assert_eq!(
        states(&rows),
        vec![
            row("m", 1, "UNAVAILABLE"),
            row("m", 2, "UNAVAILABLE"),
            row("m", 3, "READY"),
            row("m", 4, "FAILED"),
            row("other", 1, "READY"),
        ]
    );
    let reason = &rows[3].3;
    assert!(reason.contains("verify failed") && reason.contains("SHA-256"), "the stage and the cause: {reason}");
    assert_eq!(rows[0].3, "not loaded");
    assert_eq!(index(&server, &json!({ "ready": false })).len(), 5);
    let ready = index(&server, &json!({ "ready": true }));
    assert_eq!(states(&ready), vec![row("m", 3, "READY"), row("other", 1, "READY")]);
    // An empty body is the same as `{}`; a wrong one says what is wrong.
    assert_eq!(server.post_raw("/v2/repository/index", b"", &[]).status, 200);
    let bad = server.post_json("/v2/repository/index", &json!({ "ready": "yes" }));
    assert_error(&bad, 400, &["request body"], "index with a bad body");

    // A chosen version.
    let load = server.post_json("/v2/repository/models/m/load", &json!({ "parameters": { "version": 2 } }));
    assert_eq!(load.status, 200, "{}", String::from_utf8_lossy(&load.body));
    let report = load.json();
    assert_eq!((&report["version"], &report["replaced"]), (&json!(2), &json!(3)), "{report}");
    assert_eq!(infer(&server, "m", &input, batch).0, 2);
    let rows = index(&server, &json!({}));
    assert_eq!(states(&rows)[..3], [row("m", 1, "UNAVAILABLE"), row("m", 2, "READY"), row("m", 3, "READY")]);

    // A corrupt version: 422 naming the stage, and 2 keeps serving.
    let load = server.post_json("/v2/repository/models/m/load", &json!({ "parameters": { "version": "4" } }));
    assert_error(&load, 422, &["verify failed", "model.onnx", "SHA-256"], "loading the corrupt version");
    assert_eq!(load.json()["kind"], "verify_failed");
    let (version, output) = infer(&server, "m", &input, batch);
    assert_eq!(version, 2, "the serving version is untouched");
    assert_close(&output, &expect(2), "after the refused load");
    let status = server.status("m");
    assert_eq!((&status["state"], &status["serving"]), (&json!("READY"), &json!(2)));
    assert_eq!(status["last_error"]["stage"], "verify");
    assert_eq!(status["last_error"]["reason"], "digest_mismatch");

    // Bad parameters and unknown names.
    let load = server.post_json("/v2/repository/models/m/load", &json!({ "parameters": { "version": -3 } }));
    assert_error(&load, 400, &["not a version number"], "negative version");
    let load = server.post_json("/v2/repository/models/m/load", &json!({ "parameters": { "config": "{}" } }));
    assert_error(&load, 400, &["'config'", "not supported"], "unsupported parameter");
    let load = server.post_json("/v2/repository/models/m/load", &json!({ "parameters": { "version": 9 } }));
    assert_error(&load, 404, &["version 9"], "a version the repository does not have");
    let load = server.post_json("/v2/repository/models/nope/load", &json!({}));
    assert_error(&load, 404, &["nope"], "an unknown model");

    // Without parameters: the newest complete version. Version 4 is
    // repaired, and a version 5 without its MANIFEST is not complete.
    repo.publish_mlp("m", 4, &mlp(4));
    repo.write_files("m", 5, &[("model.onnx", b"half-copied")]);
    let load = server.post_raw("/v2/repository/models/m/load", b"", &[]);
    assert_eq!(load.status, 200, "{}", String::from_utf8_lossy(&load.body));
    assert_eq!(load.json()["version"], 4);
    let (version, output) = infer(&server, "m", &input, batch);
    assert_eq!(version, 4);
    assert_close(&output, &expect(4), "the repaired version");
    let rows = states(&index(&server, &json!({})));
    assert!(rows.contains(&row("m", 4, "READY")), "a successful load clears the failure: {rows:?}");
    assert!(!rows.iter().any(|(_, v, _)| v == "5"), "an incomplete version is not listed: {rows:?}");

    // Unload: out of service, not ready, every version unavailable.
    let unload = server.post_json("/v2/repository/models/m/unload", &json!({}));
    assert_eq!(unload.status, 200, "{}", String::from_utf8_lossy(&unload.body));
    let answer = server.post_json("/v2/models/m/infer", &common::request(&input, batch));
    assert_error(&answer, 503, &["model 'm' is not ready"], "infer after unload");
    assert_eq!(server.get("/v2/models/m/ready").status, 503);
    let ready = server.get("/v2/health/ready");
    assert_eq!(ready.status, 503, "m is required");
    assert_eq!(ready.json()["waiting_for"], json!(["m"]));
    let rows = states(&index(&server, &json!({})));
    for v in 1..=4 {
        assert!(rows.contains(&row("m", v, "UNAVAILABLE")), "version {v} after unload: {rows:?}");
    }
    assert_eq!(states(&index(&server, &json!({ "ready": true }))), vec![row("other", 1, "READY")]);
    assert_eq!(infer(&server, "other", &input, batch).0, 1, "other models are not affected");
    // Unloading a model that is not loaded is not an error; an unknown one is.
    assert_eq!(server.post_json("/v2/repository/models/m/unload", &json!({})).status, 200);
    assert_eq!(server.post_json("/v2/repository/models/nope/unload", &json!({})).status, 404);

    // And back.
    let load = server.post_json("/v2/repository/models/m/load", &json!({}));
    assert_eq!(load.status, 200, "{}", String::from_utf8_lossy(&load.body));
    server.wait_ready();
    let (version, output) = infer(&server, "m", &input, batch);
    assert_eq!(version, 4);
    assert_close(&output, &expect(4), "loaded again");
    assert_eq!(server.get("/v2/models/m/ready").status, 200);
    common::assert_no_panic(&server);
}
