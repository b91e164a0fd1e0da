//! Rollback: the previous version stays loaded, so going back is one
//! pointer store — no fetch, no load, no warmup — and the stages say so.

use std::sync::Arc;
use std::time::Duration;

use baton_core::registry::Operation;
use baton_core::registry::error::LoadError;
use baton_core::registry::events::{EventKind, Stage};
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::{infer_mlp, max_diff, registry, wait_for_event};

#[test]
fn rollback_is_a_pointer_store_to_the_kept_version() {
    let repo = TestRepo::new();
    let (v1, v2) = (Mlp::new(&[8, 16, 1], 1), Mlp::new(&[8, 16, 1], 2));
    repo.add_model("cls", &mlp_toml(&v1, ""));
    repo.publish_mlp("cls", 1, &v1);
    repo.publish_mlp("cls", 2, &v2);
    let registry = registry(repo.root());
    registry.load("cls", Some(1)).unwrap().wait().unwrap();
    registry.load("cls", Some(2)).unwrap().wait().unwrap();
    let status = registry.status("cls").unwrap();
    assert_eq!((status.serving, status.previous.clone()), (Some(2), vec![1]));

    let kept = Arc::clone(&registry.snapshot().model("cls").unwrap().previous[0]);
    let mut events = registry.subscribe();
    let report = registry.rollback("cls").unwrap().wait().unwrap();
    assert_eq!(report.operation, Operation::Rollback);
    assert_eq!((report.version, report.replaced), (Some(1), Some(2)));
    let stages: Vec<Stage> = report.stages.iter().map(|s| s.stage).collect();
    assert_eq!(stages, vec![Stage::Commit, Stage::Drain], "no fetch, load or warmup: nothing was reloaded");
    assert!(report.stage(Stage::Commit).is_some(), "the swap's duration is reported");
    let stable = Arc::clone(&registry.snapshot().model("cls").unwrap().stable);
    assert!(Arc::ptr_eq(&kept, &stable), "the very same loaded version serves again");
    drop((kept, stable));

    let input = sample_input(8, 1, 9);
    let (version, output) = infer_mlp(&registry.snapshot(), "cls", &input, 1).unwrap();
    assert_eq!(version, 1);
    assert!(max_diff(&output, &v1.forward(&input, 1)) < 1e-5);
    let status = registry.status("cls").unwrap();
    assert_eq!(status.last.unwrap().operation, Operation::Rollback);
    assert!(status.previous.is_empty());
    // The version rolled back from leaves memory.
    wait_for_event(&mut events, Duration::from_secs(60), |e| {
        e.version == Some(2) && matches!(e.kind, EventKind::Unloaded { .. })
    });

    let again = registry.rollback("cls").unwrap_err();
    assert!(matches!(again, LoadError::NoPrevious { .. }), "{again}");
    assert_eq!(again.kind(), "no_previous_version");
    assert!(matches!(registry.rollback("nope").unwrap_err(), LoadError::NotLoaded { .. }));
}

#[test]
fn keep_previous_bounds_the_versions_kept() {
    let repo = TestRepo::new();
    let mlp = Mlp::new(&[4, 4, 1], 1);
    repo.add_model("m", &mlp_toml(&mlp, "[policy]\nkeep_previous = 2"));
    for v in 1..=4 {
        repo.publish_mlp("m", v, &Mlp::new(&[4, 4, 1], v));
    }
    let registry = registry(repo.root());
    for v in 1..=4 {
        registry.load("m", Some(v)).unwrap().wait().unwrap();
    }
    let status = registry.status("m").unwrap();
    assert_eq!((status.serving, status.previous), (Some(4), vec![3, 2]));

    let stable = registry.retire("m", 4).unwrap_err();
    assert_eq!(stable.kind(), "not_retirable", "the serving version cannot be retired");
    let report = registry.retire("m", 3).unwrap().wait().unwrap();
    assert_eq!(report.operation, Operation::Retire);
    let status = registry.status("m").unwrap();
    assert_eq!((status.serving, status.previous), (Some(4), vec![2]));
    registry.load("m", Some(3)).unwrap().wait().unwrap();
    assert_eq!(registry.status("m").unwrap().previous, vec![4, 2]);

    registry.rollback("m").unwrap().wait().unwrap();
    registry.rollback("m").unwrap().wait().unwrap();
    assert_eq!(registry.status("m").unwrap().serving, Some(2));
    assert!(registry.status("m").unwrap().previous.is_empty());
}

#[test]
fn a_kept_version_loads_behind_the_stable_one_and_rolls_back_like_any_other() {
    let repo = TestRepo::new();
    let mlp = |v| Mlp::new(&[4, 4, 1], v);
    repo.add_model("m", &mlp_toml(&mlp(1), "[policy]\nkeep_previous = 2"));
    for v in 1..=4 {
        repo.publish_mlp("m", v, &mlp(v));
    }
    let registry = registry(repo.root());
    let refused = registry.keep("m", 3).unwrap_err();
    assert!(matches!(refused, LoadError::NotLoaded { .. }), "no stable version to keep beside: {refused}");
    registry.load("m", Some(4)).unwrap().wait().unwrap();
    // Kept newest first, as an upgrade hands them on.
    for v in [3, 2] {
        let report = registry.keep("m", v).unwrap().wait().unwrap();
        assert_eq!((report.operation, report.version), (Operation::Keep, Some(v)));
        assert!(report.stage(Stage::Warmup).is_some(), "the whole load transaction");
    }
    let status = registry.status("m").unwrap();
    assert_eq!((status.serving, status.previous), (Some(4), vec![3, 2]));
    // Beyond keep_previous, or one already there: nothing changes.
    registry.keep("m", 1).unwrap().wait().unwrap();
    registry.keep("m", 3).unwrap().wait().unwrap();
    assert_eq!(registry.status("m").unwrap().previous, vec![3, 2]);
    let report = registry.rollback("m").unwrap().wait().unwrap();
    assert_eq!((report.version, report.replaced), (Some(3), Some(4)));
    let input = sample_input(4, 1, 5);
    let (version, output) = infer_mlp(&registry.snapshot(), "m", &input, 1).unwrap();
    assert_eq!(version, 3);
    assert!(max_diff(&output, &mlp(3).forward(&input, 1)) < 1e-5);
}
