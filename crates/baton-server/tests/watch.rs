//! The repository watcher, end to end: a new complete version is loaded
//! automatically; a version directory without its MANIFEST is ignored until
//! it is sealed; a corrupt new version is refused, reported in the model's
//! status and the repository index, and not retried in a loop (its failure
//! is counted once across many scans); removing a kept previous version's
//! directory retires it; removing a model's directory takes it out of
//! service, once it has been missing for `--missing-polls` polls in a row;
//! a model or kept version that cannot be read (here a symlink loop, which
//! fails even for root) keeps serving however many polls pass, with one
//! warning, and is back to normal once readable; and with `--no-poll`
//! nothing new is picked up.
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
use std::path::Path;

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
    let still = start(&repo, &["--no-poll"]);
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
    assert_eq!(still.status("m")["serving"], 1, "--no-poll must not load version 2");
    let (version, output) = infer(&still, "m", &input, batch);
    assert_eq!(version, 1);
    assert_close(&output, &mlp(1).forward(&input, batch), "version 1 without watching");
    assert_eq!(still.get("/baton/v1/models/probe/status").status, 404, "a model it never loaded");
    // The version was there to load: an explicit load takes it.
    let load = still.post_json("/v2/repository/models/m/load", &json!({}));
    assert_eq!(load.status, 200, "{}", load.error());
    assert_eq!(infer(&still, "m", &input, batch).0, 2);
}

/// Replaces `path` by a symlink to itself, whose every use fails with
/// ELOOP (root included, unlike a permission), and returns where the
/// original went.
fn make_unreadable(path: &Path) -> std::path::PathBuf {
    let aside = path.with_file_name(format!(".aside-{}", path.file_name().unwrap().to_string_lossy()));
    std::fs::rename(path, &aside).expect("moving the directory aside");
    std::os::unix::fs::symlink(path.file_name().unwrap(), path).expect("a symlink loop");
    aside
}

/// Undoes [`make_unreadable`].
fn make_readable(path: &Path, aside: &Path) {
    std::fs::remove_file(path).expect("removing the symlink loop");
    std::fs::rename(aside, path).expect("moving the directory back");
}

/// How many lines of the server's log contain every one of `needles`.
fn log_lines(server: &Server, needles: &[&str]) -> usize {
    common::plain_log(server).lines().filter(|line| needles.iter().all(|n| line.contains(n))).count()
}

const CANNOT_READ: &str = "The repository cannot be read";
const CAN_READ: &str = "The repository can be read again.";

#[test]
fn an_unreadable_model_keeps_serving_and_a_removed_one_goes_after_the_polls_in_a_row() {
    let repo = common::repo_with("m", &[1], "[policy]\nkeep_previous = 1");
    let server = start(&repo, &[]);
    server.wait_ready();
    let batch = 2;
    let input = sample_input(SIZES[0], batch, 83);

    // The model's directory cannot be read for many polls: nothing changes.
    let dir = repo.root().join("m");
    let aside = make_unreadable(&dir);
    for v in 1..=4 {
        await_scan(&repo, &server, v);
        let (version, output) = infer(&server, "m", &input, batch);
        assert_eq!(version, 1, "after {v} scans");
        assert_close(&output, &mlp(1).forward(&input, batch), "while unreadable");
    }
    let status = server.status("m");
    assert_eq!((&status["serving"], &status["state"]), (&json!(1), &json!("READY")), "{status}");
    assert_eq!(log_lines(&server, &[CANNOT_READ, "what=model m "]), 1, "one warning for the whole episode");
    assert_eq!(log_lines(&server, &["left the repository"]), 0);

    // Readable again: said once, and new versions load as before.
    make_readable(&dir, &aside);
    await_scan(&repo, &server, 5);
    assert_eq!(log_lines(&server, &[CAN_READ, "what=model m "]), 1);
    repo.publish_mlp("m", 2, &mlp(2));
    server.wait_serving("m", 2);
    assert_eq!(infer(&server, "m", &input, batch).0, 2);

    // A real removal unloads it, after three polls in a row found it missing.
    std::fs::remove_dir_all(&dir).expect("removing the model");
    eventually("m to be unloaded", || server.status("m")["serving"].is_null().then_some(()));
    for polls in 1..=2 {
        let line = format!("what=model m polls={polls} needed=3");
        assert_eq!(log_lines(&server, &[&line]), 1, "no line {line:?} before the unload");
    }
    assert_eq!(log_lines(&server, &["The model left the repository; unloading it.", "model=m"]), 1);
    common::assert_no_panic(&server);
}

#[test]
fn an_unreadable_kept_version_is_not_retired_and_a_removed_one_is() {
    let repo = common::repo_with("m", &[1, 2], "[policy]\nkeep_previous = 1");
    let server = start(&repo, &[]);
    server.wait_ready();
    server.wait_serving("m", 2);
    // Version 1 becomes the kept one once 2 loads over it.
    repo.publish_mlp("m", 3, &mlp(3));
    server.wait_serving("m", 3);
    let batch = 1;
    let input = sample_input(SIZES[0], batch, 84);
    eventually("version 2 to be kept", || (server.status("m")["previous"] == json!([2])).then_some(()));

    let kept = repo.version_dir("m", 2);
    let aside = make_unreadable(&kept);
    for v in 1..=4 {
        await_scan(&repo, &server, v);
    }
    assert_eq!(server.status("m")["previous"], json!([2]), "an unreadable version is not a removed one");
    let (version, output) = infer_at(&server, "/v2/models/m/versions/2/infer", &input, batch);
    assert_eq!(version, 2);
    assert_close(&output, &mlp(2).forward(&input, batch), "the kept version");
    assert_eq!(log_lines(&server, &[CANNOT_READ, "what=version 2 of model m "]), 1);

    make_readable(&kept, &aside);
    await_scan(&repo, &server, 5);
    assert_eq!(log_lines(&server, &[CAN_READ, "what=version 2 of model m "]), 1);
    assert_eq!(server.status("m")["previous"], json!([2]));

    repo.remove_version("m", 2);
    eventually("version 2 to be retired", || server.status("m")["previous"].as_array()?.is_empty().then_some(()));
    assert_eq!(infer(&server, "m", &input, batch).0, 3, "the stable version is untouched");
    common::assert_no_panic(&server);
}

#[test]
fn a_model_missing_for_fewer_polls_than_needed_stays_and_its_count_starts_again() {
    let repo = common::repo_with("m", &[1], "");
    // A threshold far above the polls the test takes: what is checked is
    // that a short absence does not unload and that the run then restarts.
    let server = start(&repo, &["--missing-polls", "1000"]);
    server.wait_ready();
    let dir = repo.root().join("m");
    let aside = repo.root().join(".aside-m");
    let first_miss = "what=model m polls=1 needed=1000";
    for episode in 1..=2 {
        // Gone for a moment, as when a directory is replaced by a rename.
        // The second absence counts from one again: the model was found in
        // between.
        std::fs::rename(&dir, &aside).expect("moving the model away");
        eventually("the watcher to miss the model", || (log_lines(&server, &[first_miss]) == episode).then_some(()));
        std::fs::rename(&aside, &dir).expect("moving the model back");
        await_scan(&repo, &server, episode as u64);
        assert_eq!(server.status("m")["serving"], 1, "episode {episode}");
    }
    assert_eq!(log_lines(&server, &["left the repository"]), 0);
    common::assert_no_panic(&server);
}

#[test]
fn a_listing_that_leaves_out_the_served_model_keeps_it_ready_and_a_listing_with_it_clears_the_reason() {
    // A model.toml that cannot be read for a moment (an editor replacing
    // it) leaves the repository listing no model: a serving replica must
    // stay in service, and once the model is listed again nothing of that
    // moment may stay behind.
    let repo = common::repo_with("m", &[1], "");
    let server = start(&repo, &["--missing-polls", "1000000"]);
    server.wait_serving("m", 1);
    let toml = repo.root().join("m/model.toml");
    let hidden = repo.root().join("m/model.toml.away");
    std::fs::rename(&toml, &hidden).unwrap();
    eventually("a scan to list no model", || server.log().contains("lists no model").then_some(()));
    let answer = server.get("/v2/health/ready");
    assert_eq!(answer.status, 200, "a serving server taken out: {}", String::from_utf8_lossy(&answer.body));
    assert!(answer.json().get("reason").is_none(), "{}", answer.json());
    assert!(!server.status("m")["serving"].is_null(), "the model still serves");

    std::fs::rename(&hidden, &toml).unwrap();
    eventually("a scan to list the model again", || server.log().contains("lists models again").then_some(()));
    // With no model serving, what readiness says is the listing's: it lists
    // a model, so no reason about an empty repository may remain.
    let unload = common::post_with(server.base(), "/v2/repository/models/m/unload", &json!({}), &[]);
    assert_eq!(unload.status, 200, "{}", unload.error());
    // The next scan stops waiting for the model unloaded.
    let answer = eventually("readiness to decide", || {
        let answer = server.get("/v2/health/ready");
        (answer.status == 200 || answer.json().get("reason").is_some()).then_some(answer)
    });
    assert!(answer.json().get("reason").is_none(), "a reason that outlived its cause: {}", answer.json());
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
}
