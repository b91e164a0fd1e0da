//! The residual metric against what really happened to memory: a
//! version that leaks its memory on every free shows up as residual of
//! that size per swap, and versions that give everything back add up to
//! (almost) nothing, swap after swap.
//!
//! One test per file: RSS is per process, and tests of one file share it.

use std::time::Duration;

use baton_core::registry::UnloadRecord;
use baton_testkit::fake::{FAKE_TOML, FakeBackend};
use baton_testkit::registry_with;
use baton_testkit::repo::TestRepo;

const MIB: i64 = 1 << 20;
const BALLAST_MIB: i64 = 24;
const SWAPS: u64 = 6;

/// Loads versions 1..=SWAPS+1 of a model in turn (keep_previous = 0, so
/// each load frees the one before) and returns the unload records.
fn swap_through(leak: bool) -> Vec<UnloadRecord> {
    // As `baton serve` does first: large blocks go back to the kernel when freed.
    baton_core::threads::sys::keep_large_allocations_mapped();
    let repo = TestRepo::new();
    repo.add_model("m", &format!("{FAKE_TOML}[policy]\nkeep_previous = 0\n"));
    let ballast = BALLAST_MIB.to_string();
    for v in 1..=SWAPS + 1 {
        let mut files: Vec<(&str, &[u8])> = vec![("fake.txt", b"2"), ("ballast", ballast.as_bytes())];
        if leak {
            files.push(("leak", b""));
        }
        repo.write_files("m", v, &files);
        repo.seal("m", v);
    }
    let registry = registry_with(repo.root(), vec![std::sync::Arc::new(FakeBackend::new())]);
    for v in 1..=SWAPS + 1 {
        registry.load("m", Some(v)).unwrap().wait().unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let records = registry.unload_records();
        if records.len() as u64 == SWAPS {
            return records;
        }
        assert!(std::time::Instant::now() < deadline, "only {} of {SWAPS} frees recorded", records.len());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn residual_counts_a_leak_per_swap_and_nothing_when_memory_comes_back() {
    let clean = swap_through(false);
    for r in &clean {
        assert!(r.held >= (BALLAST_MIB as u64 - 1) << 20, "version {} held {} B", r.version, r.held);
    }
    let clean_sum: i64 = clean.iter().map(|r| r.residual).sum();
    assert!(clean_sum.abs() < 4 * MIB, "nothing leaked, yet {SWAPS} frees left {clean_sum} B behind");

    let leaky = swap_through(true);
    let leaked: i64 = leaky.iter().map(|r| r.residual).sum();
    let expected = SWAPS as i64 * BALLAST_MIB * MIB;
    assert!(
        (leaked - expected).abs() < 4 * MIB,
        "{SWAPS} frees each leaked {BALLAST_MIB} MiB, residual says {leaked} B (expected about {expected})"
    );
    for r in &leaky {
        assert!(r.residual > (BALLAST_MIB - 2) * MIB, "free of version {}: residual {} B", r.version, r.residual);
    }
    let grew = leaky.last().unwrap().unaccounted as i64 - leaky.first().unwrap().unaccounted as i64;
    let between = (SWAPS as i64 - 1) * BALLAST_MIB * MIB;
    assert!((grew - between).abs() < 4 * MIB, "unaccounted memory grew {grew} B over the frees");
}
