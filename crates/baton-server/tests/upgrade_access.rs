//! Who may replace the server with a new process, and with what. The
//! upgrade runs a program, so it is refused on a listener that is not
//! loopback unless the admin token or a loopback admin listener protects
//! it, whatever `--model-control` says; and the program is always the
//! server's own executable, never a path a request names. A marker script
//! offered as the "binary" shows that nothing ran.

mod common;

use std::path::{Path, PathBuf};

use baton_testkit::onnx::sample_input;
use common::upgrade::upgrade;
use common::{SIZES, listening_address, post_with, repo_with, start, token_file};
use serde_json::json;

const TOKEN: &str = "upgrade-token-1234";

/// A script that leaves a marker file when it runs, and where the marker
/// would be.
fn marker_script(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let marker = dir.join("ran");
    let script = dir.join("not-baton");
    std::fs::write(&script, format!("#!/bin/sh\ntouch '{}'\nexit 3\n", marker.display())).expect("the script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (script, marker)
}

#[test]
fn an_unprotected_public_listener_refuses_the_upgrade_and_runs_nothing() {
    let repo = repo_with("m", &[1], "");
    let dir = tempfile::tempdir().expect("a temp dir");
    let (script, marker) = marker_script(dir.path());
    let public = ["--http", "0.0.0.0:0", "--grpc", "0.0.0.0:0"];
    // `none` starts without protection (nothing can be managed); the
    // opt-out accepts open model management, not a process replaced.
    for mode in [&["--model-control", "none"][..], &["--insecure-management"]] {
        let args = [&public[..], mode].concat();
        let server = start(&repo, &args);
        server.wait_serving("m", 1);
        let bodies = [json!({ "binary": script }), json!({ "binary": script, "cold": true }), json!({}), json!(null)];
        for body in bodies {
            let body = if body.is_null() { String::new() } else { body.to_string() };
            let refused = upgrade(server.base(), body.as_bytes());
            assert_eq!(refused.status, 403, "{mode:?} {body}: {}", common::text(&refused.body));
            assert_eq!(refused.json()["kind"], "upgrade_unprotected", "{mode:?} {body}");
            for needle in ["--admin-token-file", "--admin-http", "SIGUSR2"] {
                assert!(
                    refused.error().contains(needle),
                    "{mode:?}: the refusal should say {needle:?}: {}",
                    refused.error()
                );
            }
        }
        assert!(!marker.exists(), "{mode:?}: the script named in the request ran");
        assert_eq!(server.get("/v2/health/ready").status, 200, "{mode:?}: the server serves on, ready");
        assert_eq!(common::infer(&server, "m", &sample_input(SIZES[0], 1, 1), 1).0, 1);
        assert!(common::children_of(server.pid(), "serve").is_empty(), "{mode:?}: a new process was started");
    }
}

#[test]
fn a_body_naming_a_binary_is_refused_in_every_mode() {
    let repo = repo_with("m", &[1], "");
    let dir = tempfile::tempdir().expect("a temp dir");
    let (script, marker) = marker_script(dir.path());
    let (_token_dir, token) = token_file(TOKEN);
    let bearer = format!("Bearer {TOKEN}");
    let public = ["--http", "0.0.0.0:0", "--grpc", "0.0.0.0:0"];
    let with_token = [&public[..], &["--admin-token-file", token.as_str()]].concat();
    let admin = [&public[..], &["--admin-http", "127.0.0.1:0", "--admin-grpc", "127.0.0.1:0"]].concat();
    let cases: [(&str, &[&str]); 3] = [("loopback", &[]), ("public with a token", &with_token), ("admin", &admin)];
    for (what, args) in cases {
        let mut server = start(&repo, args);
        server.wait_serving("m", 1);
        let url = if what == "admin" {
            format!("http://{}", listening_address(&server.next_line()))
        } else {
            server.base().to_owned()
        };
        let headers: &[(&str, &str)] = if what == "public with a token" { &[("authorization", &bearer)] } else { &[] };
        for body in [json!({ "binary": script }), json!({ "binary": "baton", "cold": true })] {
            let refused = post_with(&url, "/baton/v1/upgrade", &body, headers);
            assert_eq!(refused.status, 400, "{what} {body}: {}", common::text(&refused.body));
            assert_eq!(refused.json()["kind"], "binary_not_accepted", "{what} {body}");
            let message = refused.error();
            assert!(message.contains("own executable") && message.contains("replace"), "{what}: {message}");
        }
        assert!(!marker.exists(), "{what}: the script named in the request ran");
        assert_eq!(server.get("/v2/health/ready").status, 200, "{what}: the server serves on, ready");
        assert!(common::children_of(server.pid(), "serve").is_empty(), "{what}: a new process was started");
    }
    // Without the token, the public listener's refusal comes first.
    let server = start(&repo, &with_token);
    let refused = post_with(server.base(), "/baton/v1/upgrade", &json!({ "binary": script }), &[]);
    assert_eq!((refused.status, refused.json()["kind"].clone()), (401, json!("unauthorized")));
    assert!(!marker.exists());
}

#[test]
fn a_timeout_out_of_bounds_is_refused_and_runs_nothing() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &[]);
    server.wait_serving("m", 1);
    for timeout in ["18446744073709551615", "0", "86401"] {
        let body = format!("{{\"timeout_s\": {timeout}}}");
        let refused = upgrade(server.base(), body.as_bytes());
        assert_eq!(refused.status, 400, "{body}: {}", common::text(&refused.body));
        assert_eq!(refused.json()["kind"], "invalid_timeout", "{body}");
        assert!(refused.error().contains("86400"), "the refusal names the bounds: {}", refused.error());
    }
    assert!(common::children_of(server.pid(), "serve").is_empty(), "a new process was started");
    assert_eq!(server.get("/v2/health/ready").status, 200, "the server serves on, ready");
    common::assert_no_panic(&server);
}
