//! The agent's directories beside the target server's repository, and the
//! file moves of a switch and of a probe. Everything here blocks: call it
//! from `spawn_blocking`.
//!
//! ```text
//! <target>/<model>/<version>/              what the server loads (one version)
//! <target>/<model>.baton-probe/<version>/  a candidate the server loads on trial, during a prepare
//! <staging>/staged/<model>/<version>/      a verified candidate, in the target's layout
//! <staging>/kept/<model>/<version>/        the version a subset switch moved aside
//! ```
//!
//! The staging directory lies outside the target's repository, where the
//! server does not look (Triton started with `--load-model=*` takes every
//! directory of its repository for a model, hidden ones included), and on
//! the same file system, so that a move is a rename. By default it is
//! `<target>.baton-staging`, beside the repository. Both are checked when
//! the agent starts ([`Area::open`]).

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};

use baton_core::files::manifest::{self, MANIFEST, Verified, VerifyOptions};

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

/// What an earlier baton agent staged inside the target's repository.
const OLD_STAGING: &str = ".baton-agent";
/// The suffix of a probe's model name and directory.
const PROBE: &str = ".baton-probe";

/// The name under which a candidate of `model` is loaded on trial.
pub fn probe_name(model: &str) -> String {
    format!("{model}{PROBE}")
}

/// The default staging directory of `target`: `<target>.baton-staging`.
pub fn default_staging(target: &Path) -> PathBuf {
    let mut name = target.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "target".into());
    name.push(".baton-staging");
    target.with_file_name(name)
}

impl Area {
    /// The target repository `target`, staging in `staging` (by default
    /// [`default_staging`]). Nothing is checked or created: see
    /// [`Area::open`].
    pub fn new(target: PathBuf, staging: Option<PathBuf>) -> Area {
        let staging = staging.unwrap_or_else(|| default_staging(&target));
        Area { target, staging }
    }

    /// [`Area::new`], then creates the staging directory and refuses one
    /// inside the target's repository or on another file system; removes
    /// what an agent left in the repository (probes of a prepare it did not
    /// finish, the staging directory of earlier agents). Returns the area
    /// and the model names of the probes it removed.
    pub fn open(target: PathBuf, staging: Option<PathBuf>) -> Result<(Area, Vec<String>), String> {
        use std::os::unix::fs::MetadataExt;
        let area = Area::new(target, staging);
        let meta = std::fs::metadata(&area.target)
            .map_err(|e| format!("the target repository {}: {e}", area.target.display()))?;
        if !meta.is_dir() {
            return Err(format!("the target repository {} is not a directory", area.target.display()));
        }
        std::fs::create_dir_all(&area.staging)
            .map_err(|e| format!("creating the staging directory {}: {e}", area.staging.display()))?;
        let canonical = |p: &Path| std::fs::canonicalize(p).map_err(|e| format!("{}: {e}", p.display()));
        let (target, staging) = (canonical(&area.target)?, canonical(&area.staging)?);
        if staging.starts_with(&target) || target.starts_with(&staging) {
            return Err(format!(
                "the staging directory {} must lie outside the target repository {}, where the server does not look \
                 (give --staging-dir another directory on the same file system)",
                area.staging.display(),
                area.target.display()
            ));
        }
        let staging_dev = std::fs::metadata(&staging).map_err(|e| format!("{}: {e}", staging.display()))?.dev();
        if staging_dev != meta.dev() {
            return Err(format!(
                "the staging directory {} is on another file system than the target repository {}: a version \
                 could not be put into place by a rename (give --staging-dir a directory on the repository's \
                 file system, outside the repository)",
                area.staging.display(),
                area.target.display()
            ));
        }
        let probes = area
            .remove_leftovers()
            .map_err(|e| format!("cleaning the target repository {}: {e}", area.target.display()))?;
        Ok((area, probes))
    }

    /// Removes probes and the staging directory of earlier agents from the
    /// target's repository; returns the probes' model names.
    fn remove_leftovers(&self) -> std::io::Result<Vec<String>> {
        let mut probes = Vec::new();
        for entry in std::fs::read_dir(&self.target)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if (name.ends_with(PROBE) || name == OLD_STAGING) && entry.file_type()?.is_dir() {
                tracing::warn!(dir = %entry.path().display(), "Removing what an agent left in the target's repository.");
                remove(&entry.path())?;
                if name.ends_with(PROBE) {
                    probes.push(name);
                }
            }
        }
        Ok(probes)
    }

    /// The directory of a probe of `model` in the target's repository.
    pub fn probe_dir(&self, model: &str) -> PathBuf {
        self.target.join(probe_name(model))
    }

    /// The staged copy of `version`.
    pub fn staged_dir(&self, model: &str, version: u64) -> PathBuf {
        self.staged(model, version)
    }

    /// Moves staged `version` into the probe's directory, in place of
    /// whatever a probe left there; returns its new directory.
    pub fn lend(&self, model: &str, version: u64) -> std::io::Result<PathBuf> {
        let probe = self.probe_dir(model);
        remove(&probe)?;
        let dir = probe.join(version.to_string());
        rename(&self.staged(model, version), &dir)?;
        Ok(dir)
    }

    /// Undoes [`Area::lend`]: the version returns to staging and the
    /// probe's directory goes.
    pub fn take_from_probe(&self, model: &str, version: u64) -> std::io::Result<()> {
        let probe = self.probe_dir(model);
        let dir = probe.join(version.to_string());
        if dir.is_dir() {
            rename(&dir, &self.staged(model, version))?;
        }
        remove(&probe)
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
            layout.name_version(&partial, model, version).map_err(copy_error)?;
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
        let area = Area::new(target.path().to_owned(), Some(target.path().join("staging")));
        let opts = VerifyOptions::default();
        let v1 = version(source.path(), "m", 1, b"one");
        let v2 = version(source.path(), "m", 2, b"two");
        area.stage(&v1, &opts, TargetLayout::Mlserver, "m", 1).unwrap();
        assert_eq!(area.put_in_place("m", 1).unwrap(), Vec::<u64>::new());
        let placed = target.path().join("m/1");
        assert_eq!(std::fs::read(placed.join("model.onnx")).unwrap(), b"one");
        assert!(placed.join("model-settings.json").is_file() && placed.join(MANIFEST).is_file());

        // On trial under the probe's name, then back in staging.
        area.stage(&v1, &opts, TargetLayout::Mlserver, "m", 1).unwrap();
        let lent = area.lend("m", 1).unwrap();
        assert_eq!(lent, target.path().join("m.baton-probe/1"));
        assert!(lent.join("model.onnx").is_file() && !area.is_staged("m", 1));
        area.take_from_probe("m", 1).unwrap();
        assert!(area.is_staged("m", 1) && !target.path().join("m.baton-probe").exists());
        area.unstage("m", 1).unwrap();

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
        let area = Area::new(target.path().join("repo"), None);
        let v1 = version(source.path(), "m", 1, b"one");
        std::fs::write(v1.join("model.onnx"), b"onf").unwrap();
        let refused = area.stage(&v1, &VerifyOptions::default(), TargetLayout::Baton, "m", 1).unwrap_err();
        assert_eq!(refused.stage, "verify");
        assert!(refused.reason.contains("SHA-256"), "{refused}");
        assert!(!area.is_staged("m", 1));
    }

    #[test]
    fn staging_lies_outside_the_repository_and_leftovers_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("repo");
        std::fs::create_dir_all(target.join(".baton-agent/staged/m/2")).unwrap();
        std::fs::create_dir_all(target.join("m.baton-probe/3")).unwrap();
        std::fs::create_dir_all(target.join("m/2")).unwrap();
        let (area, probes) = Area::open(target.clone(), None).unwrap();
        assert_eq!(probes, ["m.baton-probe"]);
        assert_eq!(area.staging, root.path().join("repo.baton-staging"));
        assert!(area.staging.is_dir());
        assert!(!target.join(".baton-agent").exists() && !target.join("m.baton-probe").exists());
        assert!(target.join("m/2").is_dir(), "what the server serves stays");
        let inside = Area::open(target.clone(), Some(target.join("staging"))).unwrap_err();
        assert!(inside.contains("outside the target repository"), "{inside}");
        let around = Area::open(target.clone(), Some(root.path().to_owned())).unwrap_err();
        assert!(around.contains("outside the target repository"), "{around}");
        // /dev/shm is a file system of its own on Linux.
        if std::path::Path::new("/dev/shm").is_dir() {
            let other = tempfile::tempdir_in("/dev/shm").unwrap();
            let elsewhere = Area::open(target, Some(other.path().join("staging"))).unwrap_err();
            assert!(elsewhere.contains("another file system"), "{elsewhere}");
        }
    }
}
