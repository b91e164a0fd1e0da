//! One copy of the weights after every update: a model updated again and
//! again with whole new versions (every weight new, `keep_previous = 0`)
//! leaves the process holding one version's weights plus its sessions'
//! overhead, after the first update as after the hundredth.
//!
//! A test binary of its own, with one test, so that the resident memory it
//! reads is this test's alone.

use baton_testkit::onnx::Mlp;
use baton_testkit::registry;
use baton_testkit::repo::{TestRepo, mlp_toml};

/// Over the 4 MiB below which a model file is read once rather than
/// staged and shared, so that updates go through the shared path.
const SIZES: [usize; 4] = [256, 4096, 1024, 1];

/// The bound on what the process holds beyond what it held before the
/// first load, in multiples of the model file: one version's weights, its
/// sessions, and the engine's arenas.
const BOUND: f64 = 1.3;

#[test]
fn after_1_10_and_100_whole_updates_the_process_holds_one_versions_weights() {
    // As `baton serve` does first thing: without it glibc raises its mmap
    // threshold once a large block is freed, and later versions' matrices
    // come from heaps that stay resident (3.1 times the file after 10
    // updates here, against 1.07 with it).
    baton_core::threads::sys::keep_large_allocations_mapped();
    let repo = TestRepo::new();
    let (a, b) = (Mlp::new(&SIZES, 1), Mlp::new(&SIZES, 2));
    let toml = "[policy]\nkeep_previous = 0\n[warmup]\nbatch_sizes = [1]\n[engine]\nsessions = 1\n";
    repo.add_model("m", &mlp_toml(&a, toml));
    let file = std::fs::metadata(repo.publish_mlp("m", 1, &a).join("model.onnx")).unwrap().len();
    repo.publish_mlp("m", 2, &b);
    let registry = registry(repo.root());
    let before = baton_core::threads::sys::trimmed_rss().unwrap();
    let mut held = Vec::new();
    for update in 0..=100u64 {
        let version = 1 + update % 2;
        registry.load("m", Some(version)).unwrap().wait().unwrap();
        // The version it replaced is freed by the memory keeper: wait for it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while (registry.unload_records().len() as u64) < update {
            assert!(std::time::Instant::now() < deadline, "update {update}: the replaced version was never freed");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if [1, 10, 100].contains(&update) {
            let grown = baton_core::threads::sys::trimmed_rss().unwrap().saturating_sub(before);
            held.push((update, grown as f64 / file as f64));
        }
    }
    eprintln!("held beyond the start, in files of {file} bytes, after updates: {held:?}");
    for (update, ratio) in &held {
        assert!(*ratio <= BOUND, "after {update} updates the process holds {ratio:.2}x the file: {held:?}");
    }
}
