//! The repository watcher, end to end: a new complete version is loaded
//! automatically; a version directory without its MANIFEST is ignored until
//! it is sealed; a corrupt new version is refused, reported in the model's
//! status and the repository index, and not retried in a loop (its failure
//! is counted once across many scans); removing a kept previous version's
//! directory retires it; removing a model's directory takes it out of
//! service; and with `--no-watch` nothing new is picked up.
//!
//! "Many scans happened" is never assumed from elapsed time: another model
//! is published and the test waits until the watcher has loaded it, which
//! takes a scan that started after the thing being checked.

mod common;

use baton_onnx::mlp::{OnnxOptions, encode_mlp};
use baton_testkit::onnx::sample_input;
use baton_testkit::repo::{Damage, TestRepo, mlp_toml};
use baton_testkit::server::{Server, eventually, metric};
use common::{SIZES, assert_close, index, infer, infer_at, mlp, start};
use serde_json::json;

/// Publishes `probe` version `v` and waits until the server serves it:
/// proof that at least one full scan ran after this call began.
fn await_scan(repo: &TestRepo, server: &Server, v: u64) {
    if v == 1 {
        repo.add_model("probe", &mlp_toml(&mlp(1), "required = false"));
    }
    repo.publish_mlp("probe", v, &mlp(v));
    server.wait_serving("probe", v);
}

fn failures(server: &Server) -> Option<f64> {
    metric(&server.metrics(), "baton_load_failures_total{model=\"m\",stage=\"verify\"}")
}

#[test]
fn the_watcher_loads_new_versions_ignores_unsealed_refuses_corrupt_once_and_retires_removed() {
    let repo = common::repo_with("m", &[1], "[policy]\nkeep_previous = 1");
    let server = start(&repo, &[]);
    server.wait_ready();
    let batch = 2;
    let input = sample_input(SIZES[0], batch, 81);
    let expect = |v: u64| mlp(v).forward(&input, batch);

    // A new complete version is picked up and serves.
    repo.publish_mlp("m", 2, &mlp(2));
    server.wait_serving("m", 2);
    let (version, output) = infer(&server, "m", &input, batch);
    assert_eq!(version, 2);
    assert_close(&output, &expect(2), "version 2");

    // Files without a MANIFEST are not a version yet, however many scans pass.
    let (model, _) = encode_mlp(&mlp(3), &OnnxOptions::default());
    repo.write_files("m", 3, &[("model.onnx", &model)]);
    await_scan(&repo, &server, 1);
    await_scan(&repo, &server, 2);
    let status = server.status("m");
    assert_eq!(status["serving"], 2, "an unsealed version must not load: {status}");
    assert!(status["failed_versions"].as_object().is_some_and(|f| f.is_empty()), "nor be tried: {status}");
    assert!(!index(&server, &json!({})).iter().any(|r| r.0 == "m" && r.1 == "3"), "nor be listed");
    // Sealed, it loads.
    repo.seal("m", 3);
    server.wait_serving("m", 3);
    assert_close(&infer(&server, "m", &input, batch).1, &expect(3), "version 3");

    // A corrupt version is refused and reported, and 3 keeps serving.
    repo.publish_damaged("m", 4, &mlp(4), Damage::FlipByte);
    let failure = eventually("version 4 to be refused", || server.status("m")["failed_versions"].get("4").cloned());
    assert_eq!((&failure["stage"], &failure["reason"]), (&json!("verify"), &json!("digest_mismatch")), "{failure}");
    let status = server.status("m");
    assert_eq!((&status["serving"], &status["state"]), (&json!(3), &json!("READY")));
    assert_eq!(status["last_error"]["version"], 4);
    let rows = index(&server, &json!({}));
    let row = rows.iter().find(|r| r.0 == "m" && r.1 == "4").expect("version 4 in the index");
    assert_eq!(row.2, "FAILED");
    assert!(row.3.contains("verify failed"), "{row:?}");
    eventually("the refusal to be counted", || (failures(&server) == Some(1.0)).then_some(()));
    // ...and not tried again: many scans later it has still failed once.
    for v in 3..=6 {
        await_scan(&repo, &server, v);
    }
    assert_eq!(failures(&server), Some(1.0), "a refused version must not be retried in a loop");
    let tried = "A new version appeared in the repository; loading it. model=\"m\" version=4";
    let tries = common::plain_log(&server).matches(tried).count();
    assert_eq!(tries, 1, "version 4 was tried {tries} times");
    let (version, output) = infer(&server, "m", &input, batch);
    assert_eq!(version, 3);
    assert_close(&output, &expect(3), "after the refusal");

    // Removing the kept version's directory retires it.
    assert_eq!(server.status("m")["previous"], json!([2]));
    assert_eq!(infer_at(&server, "/v2/models/m/versions/2/infer", &input, batch).0, 2);
    repo.remove_version("m", 2);
    eventually("version 2 to be retired", || server.status("m")["previous"].as_array()?.is_empty().then_some(()));
    let gone = server.post_json("/v2/models/m/versions/2/infer", &common::request(&input, batch));
    assert_eq!(gone.status, 404, "{}", gone.error());
    assert_eq!(infer(&server, "m", &input, batch).0, 3, "the stable version is untouched");

    // Removing a model's directory takes it out of service.
    std::fs::remove_dir_all(repo.root().join("probe")).expect("removing the probe model");
    eventually("probe to be unloaded", || server.status("probe")["serving"].is_null().then_some(()));
    let answer = server.post_json("/v2/models/probe/infer", &common::request(&input, batch));
    assert!(matches!(answer.status, 404 | 503), "{}", answer.error());
    common::assert_no_panic(&server);
}

#[test]
fn without_watching_new_versions_are_not_picked_up() {
    let repo = common::repo_with("m", &[1], "");
    let still = start(&repo, &["--no-watch"]);
    // A watching server on the same repository is the witness that the new
    // version was there to be seen, for long enough to be seen.
    let watching = start(&repo, &[]);
    still.wait_ready();
    still.wait_settled("m", 1);
    watching.wait_ready();

    repo.publish_mlp("m", 2, &mlp(2));
    watching.wait_serving("m", 2);
    await_scan(&repo, &watching, 1);
    await_scan(&repo, &watching, 2);

    let batch = 2;
    let input = sample_input(SIZES[0], batch, 82);
    assert_eq!(still.status("m")["serving"], 1, "--no-watch must not load version 2");
    let (version, output) = infer(&still, "m", &input, batch);
    assert_eq!(version, 1);
    assert_close(&output, &mlp(1).forward(&input, batch), "version 1 without watching");
    assert_eq!(still.get("/baton/v1/models/probe/status").status, 404, "a model it never loaded");
    // The version was there to load: an explicit load takes it.
    let load = still.post_json("/v2/repository/models/m/load", &json!({}));
    assert_eq!(load.status, 200, "{}", load.error());
    assert_eq!(infer(&still, "m", &input, batch).0, 2);
}
