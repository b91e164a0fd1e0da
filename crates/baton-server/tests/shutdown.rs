//! SIGTERM with a request in flight: the request completes with 200 and
//! the right outputs, the server reports not ready (or no longer accepts
//! connections) from the moment it starts shutting down, it exits with
//! status 0 without running into its shutdown timeout, and once it has
//! exited new connections are refused.

mod common;

use baton_core::tensors::tensor::Tensor;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::{eventually, metric};
use common::{binary_request, start};

/// A model and batch that make one request take a while (tens of GFLOP):
/// long enough to be certainly in flight while the test looks at it.
const SLOW: [usize; 4] = [16, 1024, 1024, 1];
const BATCH: usize = 32768;
const BINARY: &str = "inference-header-content-length";

#[test]
fn sigterm_finishes_requests_in_flight_then_exits_cleanly() {
    let slow = Mlp::new(&SLOW, 71);
    let repo = TestRepo::new();
    let toml = format!("max_batch_size = {BATCH}\n[warmup]\nbatch_sizes = [1]\nmax_latency_ms = 60000");
    repo.add_model("slow", &mlp_toml(&slow, &toml));
    repo.publish_mlp("slow", 1, &slow);
    let mut server = start(&repo, &[]);
    server.wait_ready();

    let input = sample_input(SLOW[0], BATCH, 72);
    let tensor = Tensor::from_f32("input", vec![BATCH as i64, SLOW[0] as i64], &input);
    let (body, length) = binary_request(&[tensor], &[]);

    let mut attempts = 0;
    let request = loop {
        attempts += 1;
        assert!(attempts <= 5, "the slow request never stayed in flight long enough to be seen");
        let (client, body, length) = (server.client(), body.clone(), length.clone());
        let request =
            std::thread::spawn(move || client.try_post_raw("/v2/models/slow/infer", &body, &[(BINARY, &length)]));
        let in_flight = eventually("the request to be in flight, or done", || {
            if metric(&server.metrics(), "baton_inflight_requests").is_some_and(|n| n >= 1.0) {
                return Some(true);
            }
            request.is_finished().then_some(false)
        });
        if in_flight {
            break request;
        }
        let done = request.join().expect("the request thread").expect("an answer");
        assert_eq!(done.status, 200, "{}", done.error());
    };

    server.signal_terminate();
    // From the moment the server says it is shutting down, it is not ready:
    // either it answers 503 or it no longer takes connections.
    eventually("the server to start shutting down", || server.log().contains("Shutting down").then_some(()));
    match server.client().try_get("/v2/health/ready") {
        Ok(answer) => {
            assert_eq!(answer.status, 503, "ready while shutting down");
            assert_eq!(answer.json()["draining"], true);
        }
        Err(refused) => assert!(!refused.is_empty()),
    }

    let answer = request.join().expect("the request thread").expect("the request in flight got no answer");
    assert_eq!(answer.status, 200, "the request in flight failed: {}", String::from_utf8_lossy(&answer.body));
    let header_length = answer.header(BINARY).map(|v| v.parse().expect("a numeric header length"));
    let response = baton_protocol::decode_response(&answer.body, header_length).expect("a decodable response");
    assert_eq!(response.model_version, "1");
    let output = response.outputs[0].to_f32().expect("FP32 output");
    assert_eq!(output.len(), BATCH * SLOW[3]);
    // Rows are independent: check the first and last few against the reference.
    for rows in [0..4, BATCH - 4..BATCH] {
        let part = &input[rows.start * SLOW[0]..rows.end * SLOW[0]];
        let want = slow.forward(part, rows.len());
        let got = &output[rows.start * SLOW[3]..rows.end * SLOW[3]];
        let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let diff = baton_testkit::max_diff(got, &want);
        assert!(diff < common::TOLERANCE * scale, "rows {rows:?} differ by {diff}: {got:?} vs {want:?}");
    }

    let status = server.wait_exit();
    assert_eq!(status.code(), Some(0), "baton exits with success after a graceful shutdown: {status:?}");
    let log = server.log();
    assert!(log.contains("baton stopped."), "{log}");
    assert!(!log.contains("Shutdown timed out"), "the request finished within the grace period:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    let after = server.client().try_get("/v2/health/live");
    assert!(after.is_err(), "a connection after exit must be refused, got {after:?}");
}
