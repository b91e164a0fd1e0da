//! Outcome ids in a fleet, black box: real replicas and a real etcd. With
//! the same `--outcomes-key-file` on every replica, a fleet rollout's ids
//! are bound to the fleet's rollout id, so an outcome posted to another
//! replica than the one that answered counts, while a made-up id does not.
//! A duplicate is caught by the replica it is posted to: each remembers
//! what was posted to it alone.

mod common;

use baton_testkit::etcd::Etcd;
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Server, eventually};
use common::{bin, repo_with, token_file};
use serde_json::json;

fn replica(etcd: &Etcd, repo: &TestRepo, id: &str, key: &str) -> Server {
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let args = ["--cluster", &cluster, "--cluster-name", "oc", "--replica-id", id, "--outcomes-key-file", key];
    common::start(repo, &args)
}

/// The outcome id of one answer of `server`.
fn outcome_id(server: &Server) -> String {
    let input = baton_testkit::onnx::sample_input(common::SIZES[0], 1, 7);
    let answer = server.post_json("/v2/models/m/infer", &common::request(&input, 1));
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    answer.json()["parameters"]["baton_outcome_id"].as_str().expect("an outcome id during the rollout").to_owned()
}

#[test]
fn a_fleet_rollouts_ids_count_on_every_replica_that_shares_the_key() {
    let etcd = Etcd::start();
    let (_dir, key) = token_file("a fleet's shared outcome key, 32+ characters");
    let (repo1, repo2) = (repo_with("m", &[1], ""), repo_with("m", &[1], ""));
    let r1 = replica(&etcd, &repo1, "r1", &key);
    let r2 = replica(&etcd, &repo2, "r2", &key);
    r1.wait_ready();
    r2.wait_ready();
    for repo in [&repo1, &repo2] {
        repo.publish_mlp("m", 2, &common::mlp(2));
    }
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let output = std::process::Command::new(bin())
        .args(["fleet", "--cluster", &cluster, "--cluster-name", "oc", "rollout", "m", "--version", "2"])
        .args(["--steps", "50,100", "--interval", "600s", "--detach"])
        .env("BATON_LOG", "warn")
        .output()
        .expect("running baton fleet rollout");
    assert!(output.status.success(), "{}", common::text(&output.stderr));
    // Both replicas prepared the candidate: answers carry outcome ids.
    for r in [&r1, &r2] {
        eventually("the fleet's rollout on every replica", || {
            let status = r.get("/baton/v1/models/m/rollout");
            (status.status == 200 && status.json()["rollout"]["phase"] == "running").then_some(())
        });
    }
    let post = |server: &Server, id: &str| {
        let answer = server.post_json("/baton/v1/models/m/outcomes", &json!({ "outcomes": [{ "id": id }] }));
        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
        answer.json()
    };
    let accepted = json!({ "accepted": 1, "duplicate": 0, "unknown": 0 });
    let duplicate = json!({ "accepted": 0, "duplicate": 1, "unknown": 0 });
    let first = outcome_id(&r1);
    assert_eq!(post(&r2, &first), accepted, "r1's answer's id, posted to r2");
    assert_eq!(post(&r1, &outcome_id(&r2)), accepted, "r2's answer's id, posted to r1");
    // Posted twice to one replica, it counts once; each replica remembers
    // only what was posted to it, so the same id counts again on another
    // (docs/rollout.md, "Posted twice counts once, on one server").
    assert_eq!(post(&r2, &first), duplicate, "the same id, posted to r2 again");
    assert_eq!(post(&r1, &first), accepted, "the same id, posted to r1 after r2");
    assert_eq!(post(&r1, &first), duplicate, "and again to r1");
    let made_up = format!("o{}s{}", "0".repeat(8), "7".repeat(24));
    assert_eq!(post(&r1, &made_up), json!({ "accepted": 0, "duplicate": 0, "unknown": 1 }));
}
