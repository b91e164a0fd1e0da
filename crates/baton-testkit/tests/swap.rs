//! Swaps under concurrent load: versions 1 → 2 → … are committed while many
//! threads infer in a loop. No request fails, every response names the
//! version that served it, and its outputs are exactly that version's.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::{infer_mlp, max_diff, registry};

const SIZES: [usize; 4] = [32, 64, 32, 4];
const VERSIONS: u64 = 6;
const THREADS: usize = 6;

#[test]
fn swaps_under_load_lose_no_request_and_never_mix_versions() {
    let repo = TestRepo::new();
    let mlps: BTreeMap<u64, Mlp> = (1..=VERSIONS).map(|v| (v, Mlp::new(&SIZES, 100 + v))).collect();
    repo.add_model("ranker", &mlp_toml(&mlps[&1], "[warmup]\nbatch_sizes = [1, 4]"));
    repo.publish_mlp("ranker", 1, &mlps[&1]);
    let registry = registry(repo.root());
    registry.load("ranker", Some(1)).unwrap().wait().unwrap();

    let batch = 2;
    let input = sample_input(SIZES[0], batch, 7);
    let expected: BTreeMap<u64, Vec<f32>> = mlps.iter().map(|(v, m)| (*v, m.forward(&input, batch))).collect();
    // Versions must be told apart by their outputs for the check to mean anything.
    for (v, out) in &expected {
        for (w, other) in &expected {
            assert!(v == w || max_diff(out, other) > 1e-3, "versions {v} and {w} give the same outputs");
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let first_seen: Arc<Mutex<BTreeMap<u64, Vec<f32>>>> = Arc::default();
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (registry, stop, input, expected, first_seen) =
                (registry.clone(), stop.clone(), input.clone(), expected.clone(), first_seen.clone());
            std::thread::spawn(move || {
                let mut answered = 0usize;
                let mut last_version = 0;
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) && answered < 2_000_000 {
                    let snapshot = registry.snapshot();
                    let (version, output) = infer_mlp(&snapshot, "ranker", &input, batch)
                        .unwrap_or_else(|e| panic!("request {answered} failed: {e}"));
                    assert!(version >= last_version, "went back from version {last_version} to {version}");
                    last_version = version;
                    let diff = max_diff(&output, &expected[&version]);
                    assert!(diff < 1e-5, "version {version} answered with outputs off by {diff}");
                    let mut first = first_seen.lock().unwrap();
                    let reference = first.entry(version).or_insert_with(|| output.clone());
                    assert_eq!(reference, &output, "two responses of version {version} differ");
                    drop(first);
                    if seen.last() != Some(&version) {
                        seen.push(version);
                    }
                    answered += 1;
                }
                (answered, seen)
            })
        })
        .collect();

    for version in 2..=VERSIONS {
        repo.publish_mlp("ranker", version, &mlps[&version]);
        let report = registry.load("ranker", None).unwrap().wait().unwrap();
        assert_eq!(report.version, Some(version));
        assert_eq!(report.replaced, Some(version - 1));
    }
    // Let every worker answer at least once from the last version.
    let last = registry.snapshot();
    assert_eq!(last.model("ranker").unwrap().stable.number(), VERSIONS);
    stop.store(true, Ordering::Relaxed);

    let mut total = 0;
    for worker in workers {
        let (answered, seen) = worker.join().expect("a worker panicked");
        assert!(answered > 0);
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "versions seen out of order: {seen:?}");
        total += answered;
    }
    assert!(total >= THREADS, "{total} requests");
    let first = first_seen.lock().unwrap();
    assert!(first.contains_key(&1), "no request was answered by version 1");
}
