//! Version pinning: a request keeps the routing table it started with
//! for every model call it makes, even when a swap lands in between.

use std::time::Duration;

use baton_core::registry::events::{EventKind, State};
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::{infer_mlp, max_diff, registry, wait_for_event};

#[test]
fn a_request_calls_the_same_version_before_and_after_a_swap() {
    let repo = TestRepo::new();
    let (v1, v2) = (Mlp::new(&[8, 16, 2], 1), Mlp::new(&[8, 16, 2], 2));
    let (s1, s2) = (Mlp::new(&[8, 4, 1], 11), Mlp::new(&[8, 4, 1], 12));
    repo.add_model("retrieve", &mlp_toml(&v1, ""));
    repo.add_model("rank", &mlp_toml(&s1, ""));
    repo.publish_mlp("retrieve", 1, &v1);
    repo.publish_mlp("rank", 1, &s1);
    let registry = registry(repo.root());
    registry.load("retrieve", None).unwrap().wait().unwrap();
    registry.load("rank", None).unwrap().wait().unwrap();
    let input = sample_input(8, 1, 3);

    // A two-stage request: first call, then a swap of both models, then the second call.
    let request = registry.snapshot();
    let (first_version, first) = infer_mlp(&request, "retrieve", &input, 1).unwrap();
    let mut events = registry.subscribe();
    repo.publish_mlp("retrieve", 2, &v2);
    repo.publish_mlp("rank", 2, &s2);
    let retrieve_swap = registry.load("retrieve", None).unwrap();
    wait_for_event(&mut events, Duration::from_secs(60), |e| {
        e.model == "retrieve" && matches!(e.kind, EventKind::Transition { to: State::Draining, .. })
    });
    // The swap is committed: new requests see version 2 …
    let (fresh_version, _) = infer_mlp(&registry.snapshot(), "retrieve", &input, 1).unwrap();
    assert_eq!(fresh_version, 2);
    // … but this request still calls version 1, with version 1's outputs.
    let (second_version, second) = infer_mlp(&request, "retrieve", &input, 1).unwrap();
    assert_eq!((first_version, second_version), (1, 1));
    assert_eq!(first, second);
    assert!(max_diff(&second, &v1.forward(&input, 1)) < 1e-5);
    let (rank_version, _) = infer_mlp(&request, "rank", &input, 1).unwrap();
    assert_eq!(rank_version, 1, "the second model is pinned too");

    // The drain waits for this request; ending it lets the swap finish with no stragglers.
    drop(request);
    let report = retrieve_swap.wait().unwrap();
    assert!(!report.drain_timed_out);
    assert_eq!(report.stragglers, 0);
    let rank_report = registry.load("rank", None).unwrap().wait().unwrap();
    assert_eq!(rank_report.version, Some(2));
}
