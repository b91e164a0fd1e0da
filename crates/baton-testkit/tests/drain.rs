//! Deferred release: a replaced version stays alive while a request
//! holds it, is freed when that request ends, and the memory that came back
//! is measured. A drain that times out reports its stragglers.

use std::time::Duration;

use baton_core::registry::events::{EventKind, State};
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::{infer_mlp, registry, wait_for_event};

const LIMIT: Duration = Duration::from_secs(120);
// About 3 MiB of weights, so the memory coming back stands out from noise.
const SIZES: [usize; 4] = [256, 1024, 512, 1];

fn unloaded(e: &baton_core::registry::events::Event, version: u64) -> bool {
    e.version == Some(version) && matches!(e.kind, EventKind::Unloaded { .. })
}

#[test]
fn an_old_version_lives_while_a_request_holds_it_and_is_freed_after() {
    let repo = TestRepo::new();
    let (v1, v2) = (Mlp::new(&SIZES, 1), Mlp::new(&SIZES, 2));
    repo.add_model("embed", &mlp_toml(&v1, "[policy]\nkeep_previous = 0\n[warmup]\nbatch_sizes = [1]"));
    repo.publish_mlp("embed", 1, &v1);
    let registry = registry(repo.root());
    registry.load("embed", None).unwrap().wait().unwrap();
    let input = sample_input(256, 1, 5);

    let request = registry.snapshot();
    let mut events = registry.subscribe();
    repo.publish_mlp("embed", 2, &v2);
    let swap = registry.load("embed", None).unwrap();
    wait_for_event(&mut events, LIMIT, |e| matches!(e.kind, EventKind::Transition { to: State::Draining, .. }));

    let live: Vec<u64> = registry.live_versions("embed").iter().map(|v| v.version).collect();
    assert_eq!(live, vec![1, 2], "version 1 is out of the routing table but still pinned");
    assert_eq!(registry.status("embed").unwrap().serving, Some(2));
    assert_eq!(infer_mlp(&request, "embed", &input, 1).unwrap().0, 1);

    drop(request);
    let report = swap.wait().unwrap();
    assert_eq!((report.stragglers, report.drain_timed_out), (0, false));
    let event = wait_for_event(&mut events, LIMIT, |e| unloaded(e, 1));
    let EventKind::Unloaded { held, returned, residual, unaccounted, .. } = event.kind else { unreachable!() };
    assert!(held > 0, "the load measured no memory");
    assert!(returned > 0, "freeing version 1 gave nothing back (held {held})");
    // The first free has no previous one: its residual is what it did not
    // give back of version 1's footprint — the larger of the two loads'
    // measurements when both versions' files are the same size.
    let files =
        |v| baton_core::files::manifest::verify(&repo.version_dir("embed", v)).unwrap().manifest().total_bytes();
    let footprint = if files(1) == files(2) { held.max(report.bytes_held) } else { held };
    assert_eq!(residual, footprint as i64 - returned as i64);
    assert!(unaccounted > 0, "the process itself holds memory");
    let live: Vec<u64> = registry.live_versions("embed").iter().map(|v| v.version).collect();
    assert_eq!(live, vec![2]);
    let record = registry.unload_records().into_iter().find(|r| r.version == 1).expect("an unload record");
    assert_eq!((record.held, record.returned), (held, returned));
}

#[test]
fn a_drain_that_times_out_reports_stragglers_and_still_frees_later() {
    let repo = TestRepo::new();
    let (v1, v2) = (Mlp::new(&[16, 8, 1], 1), Mlp::new(&[16, 8, 1], 2));
    repo.add_model("ctr", &mlp_toml(&v1, "[policy]\nkeep_previous = 0\ndrain_timeout_ms = 50"));
    repo.publish_mlp("ctr", 1, &v1);
    let registry = registry(repo.root());
    registry.load("ctr", None).unwrap().wait().unwrap();

    let stuck_request = registry.snapshot();
    let mut events = registry.subscribe();
    repo.publish_mlp("ctr", 2, &v2);
    let report = registry.load("ctr", None).unwrap().wait().unwrap();
    assert!(report.drain_timed_out);
    assert_eq!(report.stragglers, 1);
    wait_for_event(&mut events, LIMIT, |e| matches!(e.kind, EventKind::DrainTimedOut { stragglers: 1 }));
    assert_eq!(registry.status("ctr").unwrap().state, State::Ready);
    assert!(registry.live_versions("ctr").iter().any(|v| v.version == 1), "still pinned, so still alive");

    drop(stuck_request);
    wait_for_event(&mut events, LIMIT, |e| unloaded(e, 1));
    assert!(registry.live_versions("ctr").iter().all(|v| v.version != 1));
}
