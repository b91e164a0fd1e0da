//! A repository's weights file is read once: the verify stage copies it into
//! a directory of baton's while hashing it, the engine maps the copy, and
//! the directory is gone once the load is done. What users do to the
//! repository's file afterwards cannot reach the live version. In a process
//! of its own, so that no other test's copies appear in its memory map.

use baton_core::registry::events::Stage;
use baton_onnx::mlp::mlp_safetensors;
use baton_onnx::safetensors::WEIGHTS_FILE;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::{infer_mlp, registry};

const SIZES: [usize; 4] = [16, 64, 64, 4];

/// What the names of baton's directories of copies begin with.
const COPIED: &str = "baton-copied-";

/// The lines of this process's memory map that name `needle`.
fn mapped(needle: &str) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().filter(|l| l.contains(needle)).map(str::to_owned).collect()
}

/// This process's directories of copies in the temporary directory.
fn copy_dirs() -> Vec<String> {
    let mine = format!("{}{}-", COPIED, std::process::id());
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(&mine))
        .collect()
}

/// The two tests look at the process's directories of copies: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Model `m`: version 1 whole, version 2 another model's weights only over
/// version 1's graph; returns the repository, version 2's directory and
/// the other model.
fn two_versions() -> (TestRepo, std::path::PathBuf, Mlp) {
    let repo = TestRepo::new();
    let (old, new) = (Mlp::new(&SIZES, 1), Mlp::new(&SIZES, 2));
    repo.add_model("m", &mlp_toml(&old, ""));
    repo.publish_mlp("m", 1, &old);
    let dir = repo.publish_weights("m", 2, &old, &mlp_safetensors(&new), &[]);
    (repo, dir, new)
}

#[test]
fn a_weights_file_is_copied_while_hashed_and_the_copy_is_mapped_out_of_users_reach() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (repo, dir, new) = two_versions();
    repo.publish_mlp("m", 3, &new);
    let in_repo = dir.join(WEIGHTS_FILE);
    let registry = registry(repo.root());
    let input = sample_input(SIZES[0], 3, 9);

    let report = registry.load("m", Some(2)).unwrap().wait().unwrap();
    assert!(report.stages.iter().any(|s| s.stage == Stage::Verify), "{report:?}");
    // Mapped from the verify stage's copy, not from the repository's file
    // nor from a copy staged at load.
    let copies: Vec<String> = mapped(COPIED).into_iter().filter(|l| l.contains(WEIGHTS_FILE)).collect();
    assert!(!copies.is_empty(), "the verified copy of the weights is not mapped");
    assert!(mapped(&in_repo.display().to_string()).is_empty(), "the repository's own file is mapped");
    let staged: Vec<String> = mapped("baton-staged-").into_iter().filter(|l| l.contains("weights.bin")).collect();
    assert!(staged.is_empty(), "a copy staged at load is mapped: {staged:?}");
    // The directory went with the load; the mapping keeps the bytes.
    assert!(copies.iter().all(|l| l.ends_with("(deleted)")), "{copies:?}");
    assert!(copy_dirs().is_empty(), "left behind: {:?}", copy_dirs());
    let before = infer_mlp(&registry.snapshot(), "m", &input, 3).unwrap();

    // A user truncates and rewrites the repository's file under the live
    // version: what serves is baton's copy, and serving goes on unchanged.
    std::fs::write(&in_repo, b"").unwrap();
    std::fs::write(&in_repo, vec![0xffu8; 4096]).unwrap();
    let after = infer_mlp(&registry.snapshot(), "m", &input, 3).unwrap();
    assert_eq!(before, after, "the live version answers as before");

    registry.load("m", Some(3)).unwrap().wait().unwrap();
    let whole = infer_mlp(&registry.snapshot(), "m", &input, 3).unwrap();
    assert_eq!((before.0, whole.0), (2, 3));
    assert_eq!(before.1, whole.1, "the mapped copy and the whole model answer bit for bit alike");
    // Unloaded, the version's copy goes from memory too.
    registry.unload("m").unwrap().wait().unwrap();
    baton_testkit::server::eventually("the copy's mapping to go", || mapped(COPIED).is_empty().then_some(()));
}

#[test]
fn a_copy_whose_digest_is_wrong_is_refused_at_verify_and_removed() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (repo, dir, _) = two_versions();
    // One byte flipped after the MANIFEST was written.
    let path = dir.join(WEIGHTS_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let registry = registry(repo.root());
    registry.load("m", Some(1)).unwrap().wait().unwrap();
    let error = registry.load("m", Some(2)).unwrap().wait().unwrap_err();
    assert_eq!((error.kind(), error.stage()), ("verify_failed", Some(Stage::Verify)), "{error}");
    assert!(error.to_string().contains(WEIGHTS_FILE) && error.to_string().contains("SHA-256"), "{error}");
    assert!(copy_dirs().is_empty(), "left behind: {:?}", copy_dirs());
    let input = sample_input(SIZES[0], 1, 9);
    assert_eq!(infer_mlp(&registry.snapshot(), "m", &input, 1).unwrap().0, 1, "version 1 still serves");
}
