//! Posted outcomes at the edge of trust, black box: what a client posts
//! decides a canary, so it is checked as carefully as a management call.
//!
//! - Ids are authenticated: one computed from public facts (the model and
//!   the candidate) counts as unknown, and so does an id of an earlier
//!   rollout of the same candidate.
//! - A batch is decoded item by item: one item too many, or a value out of
//!   range, is refused where it stands, before the rest is read.
//! - The body has a bound of its own, far below `--max-request-bytes`, and
//!   is admitted and counted against the request memory budget like an
//!   inference request (503 when the server is full).
//! - With `--outcomes-token-file`, posting needs that token; without it,
//!   posting is open to inference clients and a value may be one click
//!   at most.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;

use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Server, eventually, metric};
use common::{mlp, repo_with, start, token_file};
use serde_json::{Value, json};

/// A server of `m` serving version 1, with version 2 published beside it.
fn two_versions(args: &[&str]) -> (TestRepo, Server) {
    let repo = repo_with("m", &[1], "[policy]\nkeep_previous = 1\n");
    let mut all = vec!["--no-watch"];
    all.extend_from_slice(args);
    let server = start(&repo, &all);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    (repo, server)
}

/// Starts a rollout of version 2 that judges no window during the test.
fn start_rollout(server: &Server) {
    eventually("the rollout to start", || {
        let answer =
            server.post_json("/baton/v1/models/m/rollout", &json!({ "steps": [50, 100], "interval_ms": 600000 }));
        match answer.status {
            200 => Some(()),
            409 if answer.json()["kind"] == "load_in_progress" => None,
            _ => panic!("start: {}", String::from_utf8_lossy(&answer.body)),
        }
    });
}

/// The outcome ids of `count` answers.
fn ids(server: &Server, count: usize) -> Vec<String> {
    let input = baton_testkit::onnx::sample_input(common::SIZES[0], 1, 7);
    (0..count)
        .map(|_| {
            let answer = server.post_json("/v2/models/m/infer", &common::request(&input, 1));
            assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
            answer.json()["parameters"]["baton_outcome_id"].as_str().expect("an outcome id").to_owned()
        })
        .collect()
}

fn post(server: &Server, body: &[u8]) -> baton_testkit::server::Answer {
    server.post_raw("/baton/v1/models/m/outcomes", body, &[("content-type", "application/json")])
}

fn post_ids(server: &Server, ids: &[String]) -> Value {
    let items: Vec<Value> = ids.iter().map(|id| json!({ "id": id })).collect();
    let answer = post(server, json!({ "outcomes": items }).to_string().as_bytes());
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    answer.json()
}

/// The splitmix64 finalizer, as earlier servers salted their ids' check
/// digits with it.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// An id for the candidate's answer number `seq`, made the way earlier
/// servers made them: from the rollout's salt, which anyone can compute
/// from the model's name and the candidate's version.
fn forged(seq: u64) -> String {
    let salt = baton_core::rollout::assign::salt("m", 2);
    let check = mix(salt ^ mix(seq ^ 1u64.rotate_right(1))) as u32;
    format!("o{:08x}c{seq:016x}{check:08x}", (salt >> 32) as u32)
}

#[test]
fn forged_and_replayed_outcome_ids_count_as_unknown() {
    let (_repo, server) = two_versions(&[]);
    start_rollout(&server);
    let earlier = ids(&server, 4);
    let forgeries: Vec<String> = (0..4).map(|seq| forged(0x1000 + seq)).collect();
    assert_eq!(post_ids(&server, &forgeries), json!({ "accepted": 0, "duplicate": 0, "unknown": 4 }));

    // The same candidate, rolled out again: the first rollout's ids are
    // not this one's.
    assert_eq!(server.post_json("/baton/v1/models/m/rollout/abort", &json!({})).status, 200);
    start_rollout(&server);
    assert_eq!(post_ids(&server, &earlier), json!({ "accepted": 0, "duplicate": 0, "unknown": 4 }));
    let now = ids(&server, 2);
    assert_eq!(post_ids(&server, &now), json!({ "accepted": 2, "duplicate": 0, "unknown": 0 }));
    let totals = &server.get("/baton/v1/models/m/rollout").json()["rollout"]["totals"];
    let counted =
        totals["stable"]["outcomes"].as_u64().unwrap_or(0) + totals["candidate"]["outcomes"].as_u64().unwrap_or(0);
    assert_eq!(counted, 2, "{totals}");
}

#[test]
fn a_batch_is_refused_where_it_goes_wrong_before_the_rest_is_read() {
    let (_repo, server) = two_versions(&[]);
    start_rollout(&server);
    let id = ids(&server, 1).remove(0);
    // One item too many, then bytes that are not JSON: refused at the
    // extra item, not for the bytes after it.
    let item = json!({ "id": id }).to_string();
    let mut body = String::from("{\"outcomes\": [");
    for _ in 0..10_001 {
        body.push_str(&item);
        body.push(',');
    }
    body.push_str("this is not JSON");
    let answer = post(&server, body.as_bytes());
    assert_eq!(answer.status, 400, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json()["kind"], "invalid_outcome", "{}", answer.error());
    assert!(answer.error().contains("outcome 10000") && answer.error().contains("at most 10000"), "{}", answer.error());

    // A value out of range, then garbage: refused at that item.
    let huge = format!("{{\"outcomes\": [{item}, {{\"id\": \"{id}\", \"value\": 1e300}}, this is not JSON");
    let answer = post(&server, huge.as_bytes());
    assert_eq!(answer.status, 400, "{}", String::from_utf8_lossy(&answer.body));
    assert!(answer.error().contains("outcome 1") && answer.error().contains("1e12"), "{}", answer.error());
    for value in ["1e300", "-0.5"] {
        let body = format!("{{\"outcomes\": [{{\"id\": \"{id}\", \"value\": {value}}}]}}");
        assert_eq!(post(&server, body.as_bytes()).status, 400, "{value}");
    }

    // A body beyond the outcomes' own limit is refused unread, however
    // small next to --max-request-bytes: the answer comes to the head.
    let mut held = hold_request(&server, "outcomes", 2 << 20);
    held.set_read_timeout(Some(baton_testkit::server::PATIENCE)).expect("a read timeout");
    let mut answer = String::new();
    held.read_to_string(&mut answer).expect("the answer to the head");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("the limit of an outcomes post"), "{answer}");

    let totals = &server.get("/baton/v1/models/m/rollout").json()["rollout"]["totals"];
    assert_eq!(
        totals["stable"]["outcomes"].as_u64().unwrap_or(0) + totals["candidate"]["outcomes"].as_u64().unwrap_or(0),
        0
    );
    // Without the outcomes token anyone who may infer may post: one value
    // of an order's size would outweigh every click of a window, so a
    // value above one click is refused, and nothing of its batch counts.
    let click = json!({ "id": id }).to_string();
    let large = format!("{{\"outcomes\": [{click}, {{\"id\": \"{id}\", \"value\": 1e12}}]}}");
    let answer = post(&server, large.as_bytes());
    assert_eq!(answer.status, 400, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json()["kind"], "invalid_outcome", "{}", answer.error());
    assert!(
        answer.error().contains("outcome 1") && answer.error().contains("--outcomes-token-file"),
        "{}",
        answer.error()
    );
    let one = format!("{{\"outcomes\": [{{\"id\": \"{id}\", \"value\": 1}}]}}");
    assert_eq!(post(&server, one.as_bytes()).json()["accepted"], 1);
}

/// Sends the head of a request to `m`'s `endpoint` (`infer`, `outcomes`)
/// at `server`, announcing `length` bytes of body, and none of the body:
/// an inference request so held takes a place in flight and its body's
/// room in the request memory budget until dropped.
fn hold_request(server: &Server, endpoint: &str, length: usize) -> TcpStream {
    let address = server.base().trim_start_matches("http://").to_owned();
    let mut stream = TcpStream::connect(&address).expect("connecting to baton");
    let path = if endpoint == "infer" { "/v2/models/m/infer" } else { "/baton/v1/models/m/outcomes" };
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).expect("sending the head");
    stream
}

#[test]
fn outcomes_are_admitted_and_held_to_the_request_memory_budget() {
    let (_repo, server) = two_versions(&["--max-in-flight", "1", "--request-memory-budget", "1MiB"]);
    start_rollout(&server);
    let id = ids(&server, 1).remove(0);
    let body = json!({ "outcomes": [{ "id": id }] }).to_string();
    // The one place in flight is taken.
    // Waiting on the server's own gauge, not on posts: a post racing the
    // held request could take the place first and have it refused.
    let held = hold_request(&server, "infer", 1000);
    eventually("the held request to be in flight", || {
        (metric(&server.metrics(), "baton_inflight_requests") == Some(1.0)).then_some(())
    });
    let refused = post(&server, body.as_bytes());
    assert_eq!(refused.status, 503, "{}", String::from_utf8_lossy(&refused.body));
    assert_eq!(refused.json()["kind"], "overloaded", "{}", refused.error());
    drop(held);
    eventually("the place in flight to be free", || (post(&server, body.as_bytes()).status == 200).then_some(()));
    // Room in the budget: a request holds most of it, and an outcomes
    // post that needs more than is left waits briefly, then is refused.
    let (_repo, server) = two_versions(&["--request-memory-budget", "1MiB"]);
    start_rollout(&server);
    let id = ids(&server, 1).remove(0);
    let padded = format!("{{\"outcomes\": [{{\"id\": \"{id}\"}}]{}}}", " ".repeat(300 << 10));
    let held = hold_request(&server, "infer", 900 << 10);
    eventually("the held request's room to be taken", || {
        let used = metric(&server.metrics(), "baton_request_memory_bytes").unwrap_or(0.0);
        (used >= f64::from(900 << 10)).then_some(())
    });
    let refused = post(&server, padded.as_bytes());
    assert_eq!(refused.status, 503, "{}", String::from_utf8_lossy(&refused.body));
    assert!(refused.error().contains("request memory"), "{}", refused.error());
    drop(held);
    eventually("the room to be given back", || (post(&server, padded.as_bytes()).status == 200).then_some(()));
}

#[test]
fn with_an_outcomes_token_posting_needs_it_and_inference_does_not() {
    let (_dir, outcomes) = token_file("outc0mes-Token");
    let (_admin_dir, admin) = token_file("adm1n-Token");
    let (_repo, server) = two_versions(&["--outcomes-token-file", &outcomes, "--admin-token-file", &admin]);
    eventually("the rollout to start", || {
        let answer = server.post_raw(
            "/baton/v1/models/m/rollout",
            json!({ "steps": [50, 100], "interval_ms": 600000 }).to_string().as_bytes(),
            &[("content-type", "application/json"), ("authorization", "Bearer adm1n-Token")],
        );
        match answer.status {
            200 => Some(()),
            409 => None,
            _ => panic!("start: {}", String::from_utf8_lossy(&answer.body)),
        }
    });
    let ids = ids(&server, 3);
    let body = |id: &str| json!({ "outcomes": [{ "id": id }] }).to_string();
    let with = |id: &str, authorization: Option<&str>| {
        let mut headers = vec![("content-type", "application/json")];
        if let Some(value) = authorization {
            headers.push(("authorization", value));
        }
        server.post_raw("/baton/v1/models/m/outcomes", body(id).as_bytes(), &headers)
    };
    for (authorization, why) in
        [(None, "no token"), (Some("Bearer wrong"), "a wrong token"), (Some("Bearer adm1n-Token"), "the admin token")]
    {
        let answer = with(&ids[0], authorization);
        assert_eq!(answer.status, 401, "{why}: {}", String::from_utf8_lossy(&answer.body));
        assert!(answer.error().contains("--outcomes-token-file"), "{why}: {}", answer.error());
    }
    let answer = with(&ids[1], Some("Bearer outc0mes-Token"));
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json(), json!({ "accepted": 1, "duplicate": 0, "unknown": 0 }));
    // With the token, an order's value up to 1e12 is taken.
    let order = json!({ "outcomes": [{ "id": ids[2], "value": 1e12 }] }).to_string();
    let headers = [("content-type", "application/json"), ("authorization", "Bearer outc0mes-Token")];
    let answer = server.post_raw("/baton/v1/models/m/outcomes", order.as_bytes(), &headers);
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json()["accepted"], 1);
    assert!(!common::plain_log(&server).contains("outc0mes-Token"), "the token reached the log");
}

#[test]
fn a_web_page_cannot_post_outcomes_without_a_token() {
    let (_repo, server) = two_versions(&[]);
    start_rollout(&server);
    let id = ids(&server, 1).remove(0);
    let body = json!({ "outcomes": [{ "id": id }] }).to_string();
    let from = |headers: &[(&str, &str)]| {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        server.post_raw("/baton/v1/models/m/outcomes", body.as_bytes(), &all)
    };
    // Another site's page, and a page that rebound its name to this
    // server: both refused, and the outcome is not counted.
    for (headers, kind) in [
        (vec![("origin", "https://evil.example"), ("sec-fetch-site", "cross-site")], "cross_site"),
        (vec![("origin", "http://evil.example"), ("sec-fetch-site", "same-origin")], "untrusted_host"),
    ] {
        let answer = from(&headers);
        assert_eq!(answer.status, 403, "{headers:?}: {}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.json()["kind"], kind, "{headers:?}");
    }
    // A client that is not a browser posts it.
    let answer = from(&[]);
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json(), json!({ "accepted": 1, "duplicate": 0, "unknown": 0 }));
}
