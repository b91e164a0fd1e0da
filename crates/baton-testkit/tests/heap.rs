//! Each version is built on a thread of its own, which stays parked while
//! the version lives, so that the allocator arena holding the version's
//! memory is never handed to the next load (see `baton_core::threads::heap`). The
//! thread must end once the version is freed, or a server that swaps all
//! day would pile up threads and arenas; and a load that fails must not
//! leave one behind.
//!
//! One test per file: it counts the threads of the test process.

use std::time::{Duration, Instant};

use baton_testkit::fake::{FAKE_TOML, FakeBackend};
use baton_testkit::registry_with;
use baton_testkit::repo::TestRepo;

fn build_threads() -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc on linux");
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "baton-build")
        .count()
}

fn wait_for_build_threads(n: usize, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while build_threads() != n {
        assert!(Instant::now() < deadline, "{after}: {} build threads, expected {n}", build_threads());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_build_thread_lives_exactly_as_long_as_its_version() {
    let repo = TestRepo::new();
    repo.add_model("m", &format!("{FAKE_TOML}[policy]\nkeep_previous = 1\n"));
    for v in 1..=3 {
        repo.write_files("m", v, &[("fake.txt", b"2")]);
        repo.seal("m", v);
    }
    repo.write_files("m", 4, &[("fake.txt", b"not a number")]);
    repo.seal("m", 4);
    let registry = registry_with(repo.root(), vec![std::sync::Arc::new(FakeBackend::new())]);
    assert_eq!(build_threads(), 0);

    registry.load("m", Some(1)).unwrap().wait().unwrap();
    wait_for_build_threads(1, "version 1 serving");
    registry.load("m", Some(2)).unwrap().wait().unwrap();
    wait_for_build_threads(2, "version 2 serving, version 1 kept");
    registry.load("m", Some(3)).unwrap().wait().unwrap();
    wait_for_build_threads(2, "version 3 serving, version 2 kept, version 1 freed");
    let live: Vec<u64> = registry.live_versions("m").iter().map(|v| v.version).collect();
    assert_eq!(live.len(), 2, "live versions {live:?}");

    let failed = registry.load("m", Some(4)).unwrap().wait();
    assert!(failed.is_err(), "a version whose file is not a number loaded");
    wait_for_build_threads(2, "version 4 refused");

    registry.unload("m").unwrap().wait().unwrap();
    wait_for_build_threads(0, "the model unloaded");
}
