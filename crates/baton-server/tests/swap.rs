//! A swap is a non-event for clients over HTTP: while several client
//! threads send inference requests in a loop, versions 2 to 5 are published
//! into the watched repository (files first, MANIFEST last) and the server
//! picks each one up and swaps it in. No request fails, every response's
//! `model_version` is the version whose outputs it carries, and the
//! versions each client sees never go backwards.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use baton_onnx::mlp::{OnnxOptions, encode_mlp};
use baton_testkit::onnx::sample_input;
use baton_testkit::server::{PATIENCE, metric};
use common::{SIZES, mlp, output_f32, repo_with, start, version_of};

const LAST: u64 = 5;
const CLIENTS: usize = 4;
/// Requests per client at most: a bound, far above what the test needs.
const MAX_REQUESTS: usize = 200_000;

#[test]
fn versions_swap_under_http_traffic_without_a_failed_or_mixed_response() {
    let repo = repo_with("m", &[1], "[policy]\nkeep_previous = 1");
    let server = start(&repo, &[]);
    server.wait_ready();

    let batch = 3;
    let input = sample_input(SIZES[0], batch, 61);
    let expected: BTreeMap<u64, Vec<f32>> = (1..=LAST).map(|v| (v, mlp(v).forward(&input, batch))).collect();
    for (v, a) in &expected {
        for (w, b) in &expected {
            assert!(v == w || baton_testkit::max_diff(a, b) > 1e-3, "versions {v} and {w} look alike");
        }
    }
    let body = common::request(&input, batch);

    let published = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (client, body, expected, published) =
                (server.client(), body.clone(), expected.clone(), Arc::clone(&published));
            std::thread::spawn(move || {
                let deadline = Instant::now() + PATIENCE;
                let mut seen: Vec<u64> = Vec::new();
                let mut answered = 0;
                // Until this client has been answered by the last version
                // (which only happens once every version was published).
                while seen.last() != Some(&LAST) {
                    assert!(answered < MAX_REQUESTS && Instant::now() < deadline, "never saw version {LAST}");
                    let answer = client.post_json("/v2/models/m/infer", &body);
                    assert_eq!(answer.status, 200, "request {answered} failed: {}", answer.error());
                    let json = answer.json();
                    let version = version_of(&json);
                    let output = output_f32(&json, "output");
                    let want = expected.get(&version).unwrap_or_else(|| panic!("unknown version {version}"));
                    let diff = baton_testkit::max_diff(&output, want);
                    assert!(diff < common::TOLERANCE, "version {version} answered with outputs off by {diff}");
                    if let Some(&last) = seen.last() {
                        assert!(version >= last, "went back from version {last} to {version}");
                    }
                    if seen.last() != Some(&version) {
                        seen.push(version);
                    }
                    answered += 1;
                }
                assert!(published.load(Ordering::SeqCst));
                (answered, seen)
            })
        })
        .collect();

    // Every client is answered by version 1 before anything changes.
    baton_testkit::server::eventually("every client to be answered", || {
        let text = server.metrics();
        let answered =
            metric(&text, "baton_inference_requests_total{model=\"m\",version=\"1\",role=\"stable\"}").unwrap_or(0.0);
        (answered >= (CLIENTS * 2) as f64).then_some(())
    });
    for version in 2..=LAST {
        // Files first, then the MANIFEST that makes the version complete.
        let (model, _) = encode_mlp(&mlp(version), &OnnxOptions::default());
        repo.write_files("m", version, &[("model.onnx", &model)]);
        repo.seal("m", version);
        if version == LAST {
            published.store(true, Ordering::SeqCst);
        }
        server.wait_serving("m", version);
    }

    let mut all_seen = Vec::new();
    for client in clients {
        let (answered, seen) = client.join().expect("a client thread failed");
        assert!(answered > 0 && seen.first().is_some_and(|&v| v == 1), "{seen:?}");
        all_seen.extend(seen);
    }
    all_seen.sort_unstable();
    all_seen.dedup();
    assert!(all_seen.contains(&1) && all_seen.contains(&LAST), "{all_seen:?}");

    let text = server.metrics();
    assert!(!text.contains("baton_inference_errors_total{"), "no request failed:\n{text}");
    let status = server.status("m");
    assert_eq!((&status["serving"], &status["previous"]), (&serde_json::json!(LAST), &serde_json::json!([LAST - 1])));
    assert!(status["last_error"].is_null(), "{status}");
    common::assert_no_panic(&server);
}
