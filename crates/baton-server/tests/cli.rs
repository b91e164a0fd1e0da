//! The `baton` command line against a running server: `baton package`
//! writes a MANIFEST the server accepts; `baton status` shows each model's
//! state and versions; `baton load` prints every stage as it finishes and
//! exits 0, or exits non-zero with one line on stderr naming the stage that
//! refused the version; `baton rollback` switches back to the kept version;
//! `baton events` prints the transitions of a load as they happen, and ends
//! by itself when the server shuts down.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use baton_onnx::mlp::{OnnxOptions, encode_mlp};
use baton_testkit::onnx::sample_input;
use baton_testkit::repo::{Damage, TestRepo};
use baton_testkit::server::{PATIENCE, eventually};
use common::{Reaper, SIZES, assert_close, bin, infer, mlp, repo_with, start, text};
use serde_json::json;

/// Runs `baton args...` to completion.
fn baton(args: &[&str]) -> Output {
    Command::new(bin()).args(args).env_remove("BATON_URL").env_remove("BATON_LOG").output().expect("running baton")
}

#[test]
fn package_writes_a_manifest_the_server_accepts() {
    let repo: TestRepo = repo_with("m", &[1], "");
    let server = start(&repo, &[]);
    server.wait_ready();
    let (model, _) = encode_mlp(&mlp(2), &OnnxOptions::default());
    let sample = baton_testkit::repo::sample_json("input", 1, SIZES[0], &sample_input(SIZES[0], 1, 1));
    let dir = repo.write_files("m", 2, &[("model.onnx", &model), ("warmup/one.json", &sample)]);

    let out = baton(&["package", dir.to_str().unwrap()]);
    assert!(out.status.success(), "baton package failed: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("MANIFEST") && stdout.contains("listing 2 files"), "{stdout}");
    let manifest = std::fs::read_to_string(dir.join("MANIFEST")).expect("a MANIFEST");
    assert!(manifest.starts_with("baton-manifest 2\n") && manifest.trim_end().ends_with("end 2"), "{manifest}");
    // Format 1, as sha256sum prints each file's digest, on request.
    let out = baton(&["package", "--json", dir.to_str().unwrap()]);
    assert!(out.status.success(), "baton package --json failed: {}", text(&out.stderr));
    let written: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!((written["files"].as_u64(), written["format"].as_u64()), (Some(2), Some(2)), "{written}");
    let out = baton(&["package", "--manifest-format", "1", dir.to_str().unwrap()]);
    assert!(out.status.success(), "baton package failed: {}", text(&out.stderr));
    let manifest = std::fs::read_to_string(dir.join("MANIFEST")).expect("a MANIFEST");
    let model_sha = baton_core::files::manifest::digest_file(&dir.join("model.onnx")).unwrap().0;
    assert!(manifest.starts_with("baton-manifest 1\n") && manifest.contains(&model_sha), "{manifest}");

    server.wait_serving("m", 2);
    let input = sample_input(SIZES[0], 2, 91);
    let (version, output) = infer(&server, "m", &input, 2);
    assert_eq!(version, 2);
    assert_close(&output, &mlp(2).forward(&input, 2), "the packaged version");

    let out = baton(&["package", repo.root().join("m/99").to_str().unwrap()]);
    assert!(!out.status.success(), "packaging a missing directory must fail");
    assert!(text(&out.stderr).contains("is not a directory"), "{}", text(&out.stderr));
}

#[test]
fn status_load_and_rollback() {
    let repo = repo_with("m", &[1, 2], "[policy]\nkeep_previous = 1");
    repo.publish_damaged("m", 3, &mlp(3), Damage::FlipByte);
    let server = start(&repo, &["--no-watch"]);
    // At start 3 is refused and 2 loads.
    server.wait_settled("m", 2);
    server.wait_ready();
    let url = server.base();
    let batch = 2;
    let input = sample_input(SIZES[0], batch, 92);

    let out = baton(&["status", "--url", url]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("server: ready"), "{stdout}");
    let line = stdout.lines().find(|l| l.starts_with("m ")).unwrap_or_else(|| panic!("no line for m: {stdout}"));
    let columns: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&columns[..3], ["m", "READY", "2"], "{line}");
    // The refused version has its row, and a sentence with when and why.
    let refused =
        stdout.lines().find(|l| l.starts_with("m ") && l.contains(" 3 ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(refused.contains("refused at verify (verify_failed)"), "{refused}");
    assert!(
        stdout.lines().any(|l| l.starts_with("m: version 3 was refused at ") && l.contains("verify failed")),
        "{stdout}"
    );
    // Version 2 loaded after version 3 was refused: no error is current.
    assert!(!stdout.contains("LAST ERROR"), "{stdout}");

    // A load prints every stage, then its report.
    let out = baton(&["load", "m", "--version", "1", "--url", url]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "baton load failed: {}\n{stdout}", text(&out.stderr));
    let mut at = 0;
    for stage in ["fetch", "verify", "load", "validate", "warmup", "commit", "drain", "READY"] {
        let found = stdout[at..].find(stage).unwrap_or_else(|| panic!("stage {stage} not printed in order:\n{stdout}"));
        at += found + stage.len();
    }
    assert!(stdout.contains("load m: version 1 serving (was 2)"), "{stdout}");
    assert_eq!(server.status("m")["serving"], 1);
    assert_close(&infer(&server, "m", &input, batch).1, &mlp(1).forward(&input, batch), "loaded by the CLI");

    // A refused load: non-zero, one line on stderr naming the stage.
    let out = baton(&["load", "m", "--version", "3", "--url", url]);
    assert!(!out.status.success(), "loading a corrupt version must fail");
    let stderr = text(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line on stderr: {stderr:?}");
    assert!(stderr.contains("verify failed") && stderr.contains("422"), "{stderr}");
    assert!(text(&out.stdout).contains("FAILED at verify"), "{}", text(&out.stdout));
    assert_eq!(server.status("m")["serving"], 1, "the serving version is untouched");

    // Rollback goes back to the kept version, 2.
    let out = baton(&["rollback", "m", "--url", url]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("rollback m: version 2 serving (was 1)"), "{stdout}");
    assert!(stdout.contains("commit") && stdout.contains("drain") && !stdout.contains("verify"), "{stdout}");
    let (version, output) = infer(&server, "m", &input, batch);
    assert_eq!(version, 2);
    assert_close(&output, &mlp(2).forward(&input, batch), "after the rollback");
    // Nothing left to roll back to.
    let out = baton(&["rollback", "m", "--url", url]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    assert!(stderr.contains("no previous version"), "{stderr}");

    // No server there: one line saying so.
    let out = baton(&["status", "--url", "http://127.0.0.1:9"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("cannot reach baton"), "{}", text(&out.stderr));
    common::assert_no_panic(&server);
}

#[test]
fn events_prints_a_load_as_it_happens_and_ends_with_the_server() {
    let repo = repo_with("m", &[1, 2], "");
    let mut server = start(&repo, &["--no-watch"]);
    server.wait_settled("m", 2);
    let child = Command::new(bin())
        .args(["events", "--url", server.base()])
        .env_remove("BATON_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting baton events");
    let mut events = Reaper(Some(child));
    let stdout = events.0.as_mut().and_then(|c| c.stdout.take()).expect("piped stdout");
    let (lines_tx, lines) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });

    // The stream may not be open yet: load until the first event shows up.
    let mut attempts = 0;
    loop {
        attempts += 1;
        assert!(attempts <= 60, "baton events printed nothing");
        let load = server.post_json("/baton/v1/models/m/load", &json!({ "version": 2 }));
        assert_eq!(load.status, 200, "{}", load.error());
        if lines.recv_timeout(Duration::from_secs(1)).is_ok() {
            break;
        }
    }
    while lines.try_recv().is_ok() {}
    // Wait for the load still being printed to finish, then follow a new one.
    eventually("m to be idle", || (server.status("m")["busy"] == false).then_some(()));
    let load = server.post_json("/baton/v1/models/m/load", &json!({ "version": 1 }));
    assert_eq!(load.status, 200, "{}", load.error());

    let mut seen = Vec::new();
    loop {
        let line = lines.recv_timeout(PATIENCE).unwrap_or_else(|_| panic!("no READY transition in {seen:#?}"));
        let done = line.contains("m v1 DRAINING -> READY");
        seen.push(line);
        if done {
            break;
        }
    }
    let transitions: Vec<&str> = seen
        .iter()
        .filter(|l| l.contains(" m v1 ") && l.contains(" -> "))
        .map(|l| l.split(" m v1 ").nth(1).unwrap_or_default())
        .collect();
    let states: Vec<&str> = transitions.iter().map(|t| t.split(" [").next().unwrap_or_default()).collect();
    assert_eq!(
        states,
        ["LOADING -> WARMING", "WARMING -> SWAPPING", "SWAPPING -> DRAINING", "DRAINING -> READY"],
        "{seen:#?}"
    );
    // Each line starts with the local time of day, to the millisecond.
    let time = seen.last().and_then(|l| l.split(' ').next()).unwrap_or_default();
    assert!(time.len() == 12 && time.as_bytes()[2] == b':' && time.as_bytes()[8] == b'.', "{seen:#?}");
    let last = transitions.last().copied().unwrap_or_default();
    for stage in ["fetch", "verify", "load", "validate", "warmup", "commit"] {
        assert!(last.contains(&format!("{stage} ")), "the READY line lists the stage {stage}: {last}");
    }

    // The server shuts down: the stream ends and `baton events` exits by itself.
    assert!(server.terminate().success());
    let status = eventually("baton events to exit", || events.0.as_mut()?.try_wait().expect("waiting"));
    events.0 = None;
    assert!(status.success(), "baton events exits cleanly when the server closes the stream: {status:?}");
    reader.join().expect("the reader thread");
}
