//! The agent's directories beside the target server's repository, and the
//! file moves of a switch. Everything here blocks: call it from
//! `spawn_blocking`.
//!
//! ```text
//! <target>/<model>/<version>/            what the server loads (one version)
//! <staging>/staged/<model>/<version>/    a verified candidate, in the target's layout
//! <staging>/kept/<model>/<version>/      the version a subset switch moved aside
//! ```
//!
//! The staging directory must be on the target repository's file system,
//! so that a move is a rename. By default it is `<target>/.baton-agent`:
//! baton and MLServer skip names that start with a dot.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};

use baton_core::manifest::{self, MANIFEST, Verified, VerifyOptions};

use super::layout::TargetLayout;
use crate::node::Refusal;

/// The target repository and the agent's staging directory beside it.
#[derive(Clone, Debug)]
pub struct Area {
    target: PathBuf,
    staging: PathBuf,
}

fn refusal(stage: &str, reason: impl std::fmt::Display) -> Refusal {
    Refusal { stage: stage.to_owned(), reason: reason.to_string() }
}

/// The versions in `dir`: its subdirectories named by a number.
fn versions_in(dir: &Path) -> std::io::Result<Vec<u64>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut versions = Vec::new();
    for entry in entries {
        let entry = entry?;
        if let Some(n) = entry.file_name().to_str().and_then(|n| n.parse().ok())
            && entry.file_type()?.is_dir()
        {
            versions.push(n);
        }
    }
    versions.sort_unstable();
    Ok(versions)
}

/// Makes the renames into and out of `dir` durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes a directory that may not exist.
fn remove(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Renames `from` to `to`, creating `to`'s parent.
fn rename(from: &Path, to: &Path) -> std::io::Result<()> {
    let parent = to.parent().ok_or_else(|| std::io::Error::other(format!("{} has no parent", to.display())))?;
    std::fs::create_dir_all(parent)?;
    std::fs::rename(from, to)?;
    sync_dir(parent)
}

/// Copies the files of `verified` into `dest` through the descriptors
/// that were hashed, with its MANIFEST, then verifies the copy.
fn copy_verified(verified: &Verified, dest: &Path) -> Result<(), Refusal> {
    let copy_error = |e: std::io::Error| refusal("fetch", format!("copying into {}: {e}", dest.display()));
    remove(dest).map_err(copy_error)?;
    for file in verified.files() {
        let out_path = dest.join(file.path());
        if let Some(parent) = out_path.parent() {
            std::fs::create_dir_all(parent).map_err(copy_error)?;
        }
        let mut input = file.file();
        input.seek(SeekFrom::Start(0)).map_err(copy_error)?;
        let mut out = File::create(&out_path).map_err(copy_error)?;
        std::io::copy(&mut input, &mut out).map_err(copy_error)?;
        out.sync_all().map_err(copy_error)?;
        file.unchanged().map_err(|e| refusal("verify", e))?;
    }
    std::fs::write(dest.join(MANIFEST), manifest::render(verified.manifest())).map_err(copy_error)?;
    manifest::verify(dest).map(drop).map_err(|e| refusal("verify", format!("the staged copy: {e}")))
}

impl Area {
    /// The target repository `target`, staging in `staging` (by default
    /// `<target>/.baton-agent`).
    pub fn new(target: PathBuf, staging: Option<PathBuf>) -> Area {
        let staging = staging.unwrap_or_else(|| target.join(".baton-agent"));
        Area { target, staging }
    }

    /// The target repository.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The model's directory in the target repository.
    pub fn model_dir(&self, model: &str) -> PathBuf {
        self.target.join(model)
    }

    fn placed(&self, model: &str, version: u64) -> PathBuf {
        self.model_dir(model).join(version.to_string())
    }

    fn staged(&self, model: &str, version: u64) -> PathBuf {
        self.staging.join("staged").join(model).join(version.to_string())
    }

    fn kept_dir(&self, model: &str) -> PathBuf {
        self.staging.join("kept").join(model)
    }

    /// Copies the version in `source` into the staging directory, in the
    /// target's layout. The source's files are verified against its
    /// MANIFEST first (with the model's own options), and copied through
    /// the very descriptors that were hashed; the copy is then verified
    /// again, before the layout's own files are added. A failed check is a
    /// `verify` refusal, a failed copy a `fetch` one.
    pub fn stage(
        &self,
        source: &Path,
        options: &VerifyOptions,
        layout: TargetLayout,
        model: &str,
        version: u64,
    ) -> Result<(), Refusal> {
        let verified = manifest::verify_with(source, options).map_err(|e| refusal("verify", e))?;
        let dest = self.staged(model, version);
        let partial = dest.with_extension("partial");
        let copied = copy_verified(&verified, &partial).and_then(|()| {
            let copy_error = |e: std::io::Error| refusal("fetch", format!("staging {}: {e}", partial.display()));
            layout.finish_version(&partial, model, version).map_err(copy_error)?;
            remove(&dest).map_err(copy_error)?;
            rename(&partial, &dest).map_err(copy_error)
        });
        if copied.is_err() {
            let _ = remove(&partial);
        }
        copied
    }

    /// Whether `version` is staged.
    pub fn is_staged(&self, model: &str, version: u64) -> bool {
        self.staged(model, version).is_dir()
    }

    /// Removes a staged version.
    pub fn unstage(&self, model: &str, version: u64) -> std::io::Result<()> {
        remove(&self.staged(model, version))
    }

    /// Puts staged `version` into place: every version in place moves aside
    /// first (to the kept directory, emptied beforehand), then the staged
    /// one is renamed in. Returns the versions moved aside.
    pub fn put_in_place(&self, model: &str, version: u64) -> std::io::Result<Vec<u64>> {
        let kept = self.kept_dir(model);
        remove(&kept)?;
        let aside = versions_in(&self.model_dir(model))?;
        for &old in &aside {
            rename(&self.placed(model, old), &kept.join(old.to_string()))?;
        }
        rename(&self.staged(model, version), &self.placed(model, version))?;
        Ok(aside)
    }

    /// Undoes [`Area::put_in_place`]: `version` leaves its place (back to
    /// staging when `restage`, else deleted) and the versions kept aside
    /// return. Returns them.
    pub fn take_back(&self, model: &str, version: u64, restage: bool) -> std::io::Result<Vec<u64>> {
        let placed = self.placed(model, version);
        if restage {
            rename(&placed, &self.staged(model, version))?;
        } else {
            remove(&placed)?;
        }
        let kept = self.kept_dir(model);
        let back = versions_in(&kept)?;
        for &old in &back {
            rename(&kept.join(old.to_string()), &self.placed(model, old))?;
        }
        Ok(back)
    }

    /// Deletes the versions kept aside.
    pub fn forget_kept(&self, model: &str) -> std::io::Result<()> {
        remove(&self.kept_dir(model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(root: &Path, model: &str, v: u64, bytes: &[u8]) -> PathBuf {
        let dir = root.join(model).join(v.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("model.onnx"), bytes).unwrap();
        manifest::write(&dir).unwrap();
        dir
    }

    #[test]
    fn a_version_is_staged_verified_placed_moved_aside_and_brought_back() {
        let source = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let area = Area::new(target.path().to_owned(), None);
        let opts = VerifyOptions::default();
        let v1 = version(source.path(), "m", 1, b"one");
        let v2 = version(source.path(), "m", 2, b"two");
        area.stage(&v1, &opts, TargetLayout::Mlserver, "m", 1).unwrap();
        assert_eq!(area.put_in_place("m", 1).unwrap(), Vec::<u64>::new());
        let placed = target.path().join("m/1");
        assert_eq!(std::fs::read(placed.join("model.onnx")).unwrap(), b"one");
        assert!(placed.join("model-settings.json").is_file() && placed.join(MANIFEST).is_file());

        area.stage(&v2, &opts, TargetLayout::Mlserver, "m", 2).unwrap();
        assert!(area.is_staged("m", 2) && !target.path().join("m/2").exists(), "staged, not in place");
        assert_eq!(area.put_in_place("m", 2).unwrap(), [1]);
        assert_eq!(versions_in(&target.path().join("m")).unwrap(), [2], "one version in place");
        assert_eq!(area.take_back("m", 2, true).unwrap(), [1]);
        assert_eq!(versions_in(&target.path().join("m")).unwrap(), [1]);
        assert!(area.is_staged("m", 2), "restaged");
        area.put_in_place("m", 2).unwrap();
        area.forget_kept("m").unwrap();
        assert_eq!(area.take_back("m", 2, false).unwrap(), Vec::<u64>::new(), "nothing kept once forgotten");
    }

    #[test]
    fn a_damaged_version_is_refused_at_verify_and_nothing_is_staged() {
        let source = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let area = Area::new(target.path().to_owned(), None);
        let v1 = version(source.path(), "m", 1, b"one");
        std::fs::write(v1.join("model.onnx"), b"onf").unwrap();
        let refused = area.stage(&v1, &VerifyOptions::default(), TargetLayout::Baton, "m", 1).unwrap_err();
        assert_eq!(refused.stage, "verify");
        assert!(refused.reason.contains("SHA-256"), "{refused}");
        assert!(!area.is_staged("m", 1));
    }
}
