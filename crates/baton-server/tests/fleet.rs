//! A fleet, black box: real `baton serve --cluster` replicas and a real
//! etcd. Replicas serve the version the fleet committed before they report
//! ready (not their repository's newest), `baton fleet rollout` switches
//! them together, `baton fleet status` shows them, a replica refuses
//! model operations of its own, and its metrics say it is connected.

mod common;

use std::process::Command;

use baton_testkit::etcd::Etcd;
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Server, eventually, metric};
use common::{bin, infer, repo_with};

fn replica(etcd: &Etcd, repo: &TestRepo, id: &str) -> Server {
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let args = ["--cluster", &cluster, "--cluster-name", "bb", "--replica-id", id, "--label", "zone=a"];
    common::start(repo, &args)
}

fn fleet(etcd: &Etcd, args: &[&str]) -> (bool, String) {
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let output = Command::new(bin())
        .args(["fleet", "--cluster", &cluster, "--cluster-name", "bb"])
        .args(args)
        .env("BATON_LOG", "warn")
        .output()
        .expect("running baton fleet");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

#[test]
fn replicas_serve_the_committed_version_and_switch_together() {
    let etcd = Etcd::start();
    let (repo1, repo2) = (repo_with("m", &[1], ""), repo_with("m", &[1], ""));
    let r1 = replica(&etcd, &repo1, "r1");
    r1.wait_ready();
    let r2 = replica(&etcd, &repo2, "r2");
    r2.wait_ready();
    let input = [0.25f32; 8];
    assert_eq!(infer(&r1, "m", &input, 1).0, 1);

    // A replica refuses model operations of its own: the fleet decides.
    let refused = r1.post_json("/baton/v1/models/m/load", &serde_json::json!({}));
    assert_eq!(refused.status, 403, "{}", refused.error());
    assert!(refused.error().contains("baton fleet rollout"), "{}", refused.error());

    // Version 2 arrives on both; nothing changes until the fleet says so.
    for repo in [&repo1, &repo2] {
        repo.publish_mlp("m", 2, &common::mlp(2));
    }
    // --json: the rollout's record once it is done.
    let (ok, out) = fleet(&etcd, &["rollout", "m", "--version", "2", "--json"]);
    assert!(ok, "{out}");
    let line = out.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON in {out}"));
    let record: serde_json::Value = serde_json::from_str(line).expect("the record is JSON");
    assert_eq!((&record["phase"], &record["switch"]["replicas"]), (&"promoted".into(), &2.into()), "{record}");
    assert!(!out.contains("replicas switched within"), "no text with --json: {out}");
    for r in [&r1, &r2] {
        assert_eq!(infer(r, "m", &input, 1).0, 2);
    }

    // A replica that starts now serves the committed 2, not its newest 3.
    let repo3 = repo_with("m", &[1, 2, 3], "");
    let r3 = replica(&etcd, &repo3, "r3");
    r3.wait_ready();
    assert_eq!(infer(&r3, "m", &input, 1).0, 2);

    let (ok, json) = fleet(&etcd, &["status", "--json"]);
    assert!(ok, "{json}");
    assert!(json.trim_start().starts_with('{'), "{json}");
    let (ok, status) = fleet(&etcd, &["status"]);
    assert!(ok, "{status}");
    assert!(status.contains("3 live replicas") && status.contains("the fleet serves version 2"), "{status}");
    for id in ["r1", "r2", "r3"] {
        assert!(status.contains(id), "{status}");
    }
    let metrics = String::from_utf8(r1.get("/metrics").body).unwrap();
    assert_eq!(metric(&metrics, "baton_cluster_connected"), Some(1.0), "{metrics}");
    assert!(metric(&metrics, "baton_cluster_commit_delay_seconds{model=\"m\"}").is_some(), "{metrics}");

    // Refused with a clear error when etcd is gone; replicas keep serving.
    let mut etcd = etcd;
    etcd.kill();
    let (ok, out) = fleet(&etcd, &["rollout", "m", "--version", "3"]);
    assert!(!ok && out.contains("no fleet can be reached"), "{out}");
    eventually("r1 to say it is disconnected", || {
        let metrics = String::from_utf8(r1.get("/metrics").body).unwrap();
        (metric(&metrics, "baton_cluster_connected") == Some(0.0)).then_some(())
    });
    assert_eq!(infer(&r1, "m", &input, 1).0, 2);
    assert_eq!(r1.get("/v2/health/ready").status, 200, "still ready: it serves what the fleet committed");
}
