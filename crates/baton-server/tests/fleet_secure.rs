//! A secured control plane, black box: replicas and `baton fleet` over an
//! etcd with TLS and authentication (certificates made by the test,
//! passwords in files); a replica set up for TLS refuses a plaintext URL;
//! a password is never sent in plaintext unless the operator says so;
//! secrets are never taken from the command line; open status says only
//! whether a replica is connected, and the admin token shows the rest.

mod common;

use std::process::Command;

use baton_testkit::certs::Certs;
use baton_testkit::etcd::{Etcd, Security, ServerTls};
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Server, eventually};
use common::{bin, infer, repo_with, token_file};

/// The options that reach the test's secured etcd.
struct Access {
    args: Vec<String>,
    _secrets: tempfile::TempDir,
}

fn access(etcd: &Etcd, certs: &Certs, password: &str) -> Access {
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("etcd-password");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    let args = [
        "--cluster",
        &format!("etcd://127.0.0.1:{}", etcd.port()),
        "--cluster-name",
        "sec",
        "--etcd-ca",
        certs.ca().to_str().unwrap(),
        "--etcd-user",
        "baton",
        "--etcd-password-file",
        file.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    Access { args, _secrets: secrets }
}

fn secured_etcd(certs: &Certs) -> Etcd {
    let tls = ServerTls { server: certs.server(), client_ca: None };
    Etcd::start_secured(&Security { tls: Some(tls), users: vec![("baton".into(), "s3cret".into())], jwt: false })
}

fn replica(repo: &TestRepo, access: &Access, id: &str, extra: &[&str]) -> Server {
    let mut args: Vec<&str> = access.args.iter().map(String::as_str).collect();
    args.extend_from_slice(&["--replica-id", id]);
    args.extend_from_slice(extra);
    common::start(repo, &args)
}

fn fleet(access: &Access, args: &[&str]) -> (bool, String) {
    let output = Command::new(bin())
        .arg("fleet")
        .args(&access.args)
        .args(args)
        .env("BATON_LOG", "warn")
        .output()
        .expect("running baton fleet");
    let text = format!("{}{}", common::text(&output.stdout), common::text(&output.stderr));
    (output.status.success(), text)
}

#[test]
fn replicas_and_the_fleet_command_work_over_tls_with_a_password_from_a_file() {
    let certs = Certs::new();
    let etcd = secured_etcd(&certs);
    let good = access(&etcd, &certs, "s3cret");
    let (repo1, repo2) = (repo_with("m", &[1], ""), repo_with("m", &[1], ""));
    let r1 = replica(&repo1, &good, "r1", &[]);
    let r2 = replica(&repo2, &good, "r2", &[]);
    r1.wait_ready();
    r2.wait_ready();
    for repo in [&repo1, &repo2] {
        repo.publish_mlp("m", 2, &common::mlp(2));
    }
    let (ok, out) = fleet(&good, &["rollout", "m", "--version", "2"]);
    assert!(ok, "{out}");
    for r in [&r1, &r2] {
        assert_eq!(infer(r, "m", &[0.5; 8], 1).0, 2);
    }
    // A wrong password is refused with a reason, by the CLI and a replica.
    let bad = access(&etcd, &certs, "guess");
    let (ok, out) = fleet(&bad, &["status"]);
    assert!(!ok && out.contains("refused") && out.contains("baton"), "{out}");
    let r3 = replica(&repo_with("m", &[1], ""), &bad, "r3", &[]);
    eventually("r3 to say why it cannot join", || {
        let log = common::plain_log(&r3);
        log.contains("authentication failed").then_some(())
    });
    assert_eq!(r3.get("/v2/health/ready").status, 503, "not ready: it never joined");
}

#[test]
fn a_replica_set_up_for_tls_refuses_a_plaintext_url() {
    let certs = Certs::new();
    let etcd = Etcd::start();
    let repo = repo_with("m", &[1], "");
    let ca = certs.ca();
    let url = format!("http://127.0.0.1:{}", etcd.port());
    let (status, stderr) = common::refused_start(&repo, &["--cluster", &url, "--etcd-ca", ca.to_str().unwrap()]);
    assert!(!status.success());
    assert!(stderr.contains("plaintext"), "{stderr}");
    // etcd:// with TLS set up, against a plaintext etcd: it never joins.
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let r = common::start(&repo, &["--cluster", &cluster, "--etcd-ca", ca.to_str().unwrap(), "--replica-id", "r"]);
    eventually("the replica to say it cannot reach etcd over TLS", || {
        common::plain_log(&r).contains("Lost the cluster store").then_some(())
    });
    let status = r.get("/baton/v1/status").json();
    assert_eq!(status["cluster"]["connected"], false, "{status}");
}

#[test]
fn a_password_is_refused_over_plaintext_unless_the_operator_lets_it_go() {
    // An etcd with users, spoken to without TLS.
    let etcd = Etcd::start_secured(&Security { tls: None, users: vec![("baton".into(), "s3cret".into())], jwt: false });
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("etcd-password");
    std::fs::write(&file, "s3cret\n").unwrap();
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let with_password = ["--cluster", &cluster, "--etcd-user", "baton", "--etcd-password-file", file.to_str().unwrap()];
    let repo = repo_with("m", &[1], "");
    let (status, stderr) = common::refused_start(&repo, &with_password);
    assert!(!status.success(), "a replica started with a password in plaintext");
    assert!(stderr.contains("plaintext") && stderr.contains("--etcd-ca"), "{stderr}");
    let output = Command::new(bin())
        .arg("fleet")
        .args(with_password)
        .arg("status")
        .env("BATON_LOG", "warn")
        .output()
        .expect("running baton fleet");
    let text = format!("{}{}", common::text(&output.stdout), common::text(&output.stderr));
    assert!(!output.status.success() && text.contains("plaintext"), "{text}");
    // Where something else encrypts the way, the operator lets it go.
    let mut allowed = with_password.to_vec();
    allowed.extend_from_slice(&["--etcd-plaintext-password", "--replica-id", "r"]);
    let r = common::start(&repo, &allowed);
    r.wait_ready();
    let status = r.get("/baton/v1/status").json();
    assert_eq!(status["cluster"]["connected"], true, "{status}");
}

#[test]
fn the_agent_takes_its_targets_token_from_a_file_only() {
    let output = Command::new(bin())
        .args(["agent", "--target", "http://127.0.0.1:1", "--target-kind", "baton"])
        .args(["--target-repo", "/tmp", "--source-repo", "/tmp", "--cluster", "etcd://127.0.0.1:1"])
        .args(["--target-token", "hunter2"])
        .output()
        .expect("running baton agent");
    let stderr = common::text(&output.stderr);
    assert!(!output.status.success(), "a token on the command line was taken");
    assert!(stderr.contains("--target-token"), "{stderr}");
    // The file is read, and an empty one refused before anything starts.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("token");
    std::fs::write(&empty, "\n").unwrap();
    let output = Command::new(bin())
        .args(["agent", "--target", "http://127.0.0.1:1", "--target-kind", "baton"])
        .args(["--target-repo", "/tmp", "--source-repo", "/tmp", "--cluster", "etcd://127.0.0.1:1"])
        .arg("--target-token-file")
        .arg(&empty)
        .output()
        .expect("running baton agent");
    let stderr = common::text(&output.stderr);
    assert!(!output.status.success() && stderr.contains("token"), "{stderr}");
}

#[test]
fn open_status_says_only_whether_a_replica_is_connected() {
    let etcd = Etcd::start();
    let repo = repo_with("m", &[1], "");
    let (_dir, token) = token_file("t0ken");
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let r = common::start(&repo, &["--cluster", &cluster, "--replica-id", "r", "--admin-token-file", &token]);
    r.wait_ready();
    let open = r.get("/baton/v1/status").json();
    assert_eq!(open["cluster"], serde_json::json!({ "connected": true }), "{open}");
    let answer =
        baton_testkit::server::Client::new(r.base()).get_with("/baton/v1/status", &[("authorization", "Bearer t0ken")]);
    let full = answer.json();
    assert_eq!(full["cluster"]["connected"], true, "{full}");
    assert!(full["cluster"].get("problems").is_some() && full["cluster"].get("leases_lost").is_some(), "{full}");
    let wrong =
        baton_testkit::server::Client::new(r.base()).get_with("/baton/v1/status", &[("authorization", "Bearer nope")]);
    assert_eq!(wrong.json()["cluster"], serde_json::json!({ "connected": true }));
}
