//! The memory budget of loads: a load that live versions and the candidate
//! would take beyond the model's budget (`[policy] memory_budget`) or the
//! server's is refused at stage `load`, by estimate before the engine loads
//! it or by measurement after, with kind `memory_budget_exceeded` and the
//! numbers in the message; the version that served keeps serving. A load
//! within the budget goes through.
//!
//! One test: RSS is per process, and the measured refusals need no other
//! load of this process growing it meanwhile.

use std::sync::Arc;
use std::time::Duration;

use baton_core::registry::budget::{Basis, Scope};
use baton_core::registry::error::LoadError;
use baton_core::registry::events::{EventKind, Stage};
use baton_core::registry::{Registry, RegistryConfig};
use baton_testkit::fake::{FAKE_TOML, FakeBackend};
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::{infer_mlp, registry, registry_configured, wait_for_event};

const MIB: u64 = 1 << 20;

/// Publishes a fake version holding `ballast_mib` MiB while loaded.
fn publish_fake(repo: &TestRepo, model: &str, version: u64, ballast_mib: u64) {
    let ballast = ballast_mib.to_string();
    repo.write_files(model, version, &[("fake.txt", b"2"), ("ballast", ballast.as_bytes())]);
    repo.seal(model, version);
}

/// The budget error of a refused load, after checking what every refused
/// load must say.
fn refused(registry: &Registry, model: &str, version: u64) -> baton_core::registry::budget::BudgetError {
    let mut events = registry.subscribe();
    let error = registry.load(model, Some(version)).unwrap().wait().unwrap_err();
    assert_eq!(error.kind(), "memory_budget_exceeded", "{error}");
    assert_eq!(error.stage(), Some(Stage::Load), "refused at stage load: {error}");
    let failed = wait_for_event(&mut events, Duration::from_secs(60), |e| matches!(e.kind, EventKind::Failed { .. }));
    let EventKind::Failed { stage, kind, message } = failed.kind else { unreachable!() };
    assert_eq!((stage, kind.as_str()), (Stage::Load, "memory_budget_exceeded"));
    assert_eq!(message, error.to_string());
    let status = registry.status(model).unwrap();
    assert_eq!(status.last_error.map(|f| f.kind), Some("memory_budget_exceeded"));
    let LoadError::MemoryBudget(budget) = error else { panic!("not a budget error: {error}") };
    budget
}

#[test]
fn loads_beyond_a_budget_are_refused_with_the_numbers_and_the_old_version_serves() {
    baton_core::threads::sys::keep_large_allocations_mapped();
    let repo = TestRepo::new();

    // By estimate: the candidate's files alone do not fit the model's budget.
    let sizes = [64, 512, 512, 2];
    let (v1, v2) = (Mlp::new(&sizes, 1), Mlp::new(&sizes, 2));
    repo.add_model("m", &mlp_toml(&v1, ""));
    repo.publish_mlp("m", 1, &v1);
    repo.publish_mlp("m", 2, &v2);
    let registry = registry(repo.root());
    registry.load("m", Some(1)).unwrap().wait().unwrap();
    repo.add_model("m", &mlp_toml(&v1, "[policy]\nmemory_budget = \"1MiB\""));
    let budget = refused(&registry, "m", 2);
    assert_eq!((budget.scope, budget.budget, budget.basis), (Scope::Model, MIB, Basis::Footprint));
    assert!(budget.candidate > MIB, "the estimate is at least the files: {}", budget.candidate);
    let text = LoadError::MemoryBudget(budget).to_string();
    assert!(text.contains("1.0 MiB") && text.contains("[policy] memory_budget"), "{text}");
    let input = sample_input(64, 1, 3);
    let (version, output) = infer_mlp(&registry.snapshot(), "m", &input, 1).unwrap();
    assert_eq!(version, 1, "the old version keeps serving");
    assert!(baton_testkit::max_diff(&output, &v1.forward(&input, 1)) < 1e-5);
    repo.add_model("m", &mlp_toml(&v1, "[policy]\nmemory_budget = \"4GiB\""));
    registry.load("m", Some(2)).unwrap().wait().expect("a load within the budget goes through");
    assert_eq!(infer_mlp(&registry.snapshot(), "m", &input, 1).unwrap().0, 2);

    // By measurement: the files are tiny, what the engine holds is not.
    repo.add_model("f", &format!("{FAKE_TOML}[policy]\nmemory_budget = \"48MiB\"\n"));
    publish_fake(&repo, "f", 1, 16);
    publish_fake(&repo, "f", 2, 40);
    publish_fake(&repo, "f", 3, 4);
    registry.load("f", Some(1)).unwrap().wait().unwrap();
    let held = registry.live_versions("f")[0].bytes_held;
    assert!(held >= 15 * MIB, "version 1 holds its ballast: {held}");
    let budget = refused(&registry, "f", 2);
    assert_eq!((budget.scope, budget.basis, budget.in_use), (Scope::Model, Basis::Measured, held));
    assert!(budget.candidate >= 39 * MIB, "measured {}", budget.candidate);
    assert_eq!(registry.status("f").unwrap().serving, Some(1));
    let live: Vec<u64> = registry.live_versions("f").iter().map(|v| v.version).collect();
    assert_eq!(live, vec![1], "the refused candidate was dropped");
    registry.load("f", Some(3)).unwrap().wait().expect("16 + 4 MiB fit in 48");
    assert_eq!(registry.status("f").unwrap().serving, Some(3));
    // Everything this registry loaded is freed before the next one
    // measures, so that no free lands in its measurements.
    for model in ["m", "f"] {
        registry.unload(model).unwrap().wait().unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let all_freed = |records: &[baton_core::registry::UnloadRecord]| {
        [("m", 1), ("m", 2), ("f", 1), ("f", 3)]
            .iter()
            .all(|&(model, version)| records.iter().any(|r| r.model == model && r.version == version))
    };
    while !all_freed(&registry.unload_records()) {
        assert!(std::time::Instant::now() < deadline, "the first registry's versions were never freed");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(registry);

    // The server's budget counts every model's versions.
    repo.add_model("g", FAKE_TOML);
    publish_fake(&repo, "g", 1, 16);
    repo.add_model("h", FAKE_TOML);
    publish_fake(&repo, "h", 1, 24);
    publish_fake(&repo, "h", 2, 4);
    let config = RegistryConfig { memory_budget: Some(32 * MIB), ..RegistryConfig::default() };
    let server = registry_configured(repo.root(), vec![Arc::new(FakeBackend::new())], config);
    server.load("g", Some(1)).unwrap().wait().unwrap();
    let budget = refused(&server, "h", 1);
    assert_eq!((budget.scope, budget.basis), (Scope::Server, Basis::Measured));
    // What g's version was measured to hold counts (the measurement itself
    // is RSS growth, which memory freed elsewhere in the process meanwhile
    // can make smaller than its ballast).
    let g_held = server.live_versions("g")[0].bytes_held;
    assert!(g_held > 0, "model g's version was measured");
    assert_eq!(budget.in_use, g_held, "model g's version counts");
    assert!(server.status("h").unwrap().serving.is_none());
    server.load("h", Some(2)).unwrap().wait().expect("16 + 4 MiB fit in 32");
}
