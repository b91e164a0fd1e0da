//! Where versions come from. The fetch stage asks a [`Source`] for a local
//! directory holding a version's files; the local repository hands out its
//! own directories, and a remote source (HTTP, S3) would download into a
//! staging directory first. Everything after fetch works on local files.
//!
//! A source tells "not there" from "cannot be read": only the first is
//! [`FetchError::ModelNotFound`], [`FetchError::VersionNotFound`] or
//! [`Presence::Missing`]. A file system that fails for a moment (an NFS
//! server restarting, a FUSE mount busy) gives other errors, and whoever acts
//! on a model's disappearance (the repository watcher) must not take those
//! for a removal.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::files::manifest;
use crate::files::seal::Seal;
use crate::files::spec::ModelSpec;

/// Why a version could not be fetched.
#[derive(Debug, Error)]
pub enum FetchError {
    /// No such model in the source.
    #[error("model '{model}' not found in {place}")]
    ModelNotFound {
        /// The model.
        model: String,
        /// Where it was looked for.
        place: String,
    },
    /// No such version of the model.
    #[error("version {version} of model '{model}' not found in {place}")]
    VersionNotFound {
        /// The model.
        model: String,
        /// The version.
        version: u64,
        /// Where it was looked for.
        place: String,
    },
    /// `model.toml` is missing or invalid.
    #[error("invalid model.toml: {0}")]
    Spec(String),
    /// Reading the source failed.
    #[error("{0}")]
    Io(String),
    /// A remote store refused or failed a request, or what it holds
    /// disagrees with the version's MANIFEST before any byte is kept.
    #[error("{message}")]
    Store {
        /// Stable kind: `store_denied`, `store_not_found`,
        /// `store_unreachable`, `store_throttled`, `store_error`,
        /// `size_mismatch` or `cache_full`.
        kind: &'static str,
        /// What the store answered, and for what.
        message: String,
    },
}

impl FetchError {
    /// Stable kind string.
    pub fn kind(&self) -> &'static str {
        match self {
            FetchError::ModelNotFound { .. } => "model_not_found",
            FetchError::VersionNotFound { .. } => "version_not_found",
            FetchError::Spec(_) => "invalid_spec",
            FetchError::Io(_) => "io",
            FetchError::Store { kind, .. } => kind,
        }
    }
}

/// Whether a model or version is in a source, as far as the source can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Presence {
    /// It is there.
    Present,
    /// The source says it does not exist (for a file system: `ENOENT`).
    Missing,
    /// The source could not tell: reading failed otherwise (`EIO`,
    /// `EACCES`, `ESTALE`, `ELOOP`, …). Says what failed.
    Unreadable(String),
}

/// A version's files on the local file system, as a source hands them to
/// the verify stage.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// The version directory.
    pub dir: PathBuf,
    /// What the source hashed while it wrote the files, when it did.
    pub seal: Option<Seal>,
}

impl Fetched {
    /// Files the source did not write: every one is hashed when verified.
    pub fn unsealed(dir: PathBuf) -> Fetched {
        Fetched { dir, seal: None }
    }
}

/// What a remote source's store last answered, for status and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreAnswer {
    /// The store, as the operator named it (`s3://bucket/prefix`).
    pub url: String,
    /// Whether the last listing succeeded.
    pub ok: bool,
    /// `ok`, or the stable kind of the last failure (see [`FetchError::Store`]).
    pub kind: &'static str,
    /// The last failure's message; empty when `ok`.
    pub message: String,
    /// Listings that failed in a row.
    pub failures: u64,
    /// Listings made, all told.
    pub listings: u64,
    /// Bytes downloaded into the cache, all told.
    pub bytes_fetched: u64,
    /// Versions served from the cache without a download.
    pub cache_hits: u64,
}

/// A place that holds models and their versions.
pub trait Source: Send + Sync + 'static {
    /// Names of all models. A model whose `model.toml` cannot be read is
    /// left out; [`Source::presence`] tells whether it is gone.
    fn models(&self) -> Result<Vec<String>, FetchError>;
    /// Complete versions of a model (those whose manifest is complete),
    /// ascending. A version that cannot be read is left out;
    /// [`Source::presence`] tells whether it is gone.
    fn versions(&self, model: &str) -> Result<Vec<u64>, FetchError>;
    /// Whether a model (`version` `None`: its `model.toml`) or one of its
    /// versions (its `MANIFEST`) is there. Unlike the listings, this tells
    /// a removal ([`Presence::Missing`]) from a read that failed.
    fn presence(&self, model: &str, version: Option<u64>) -> Presence;
    /// The model's current `model.toml`.
    fn spec(&self, model: &str) -> Result<ModelSpec, FetchError>;
    /// A local directory holding the version's files.
    fn fetch(&self, model: &str, version: u64) -> Result<Fetched, FetchError>;
    /// What identifies the version's MANIFEST as last seen (a modification
    /// time, an entity tag): when it changes, the version was published
    /// again. `None` when it cannot be told.
    fn version_stamp(&self, model: &str, version: u64) -> Option<String>;
    /// Version directories of a model that hold no MANIFEST at all, with
    /// the directory as the operator names it and when anything in it last
    /// changed: they are not loaded until packaged (`baton package DIR`).
    /// A source that cannot tell says none.
    fn unpackaged(&self, _model: &str) -> Vec<BareVersion> {
        Vec::new()
    }
    /// For a remote source, what its store last answered.
    fn store_answer(&self) -> Option<StoreAnswer> {
        None
    }
}

/// A version directory without a MANIFEST (see [`Source::unpackaged`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BareVersion {
    /// The version number its name gives.
    pub version: u64,
    /// The directory, as the operator names it.
    pub dir: String,
    /// When the directory or anything in it last changed, when known: a
    /// copy or a `baton package` in progress keeps it recent.
    pub changed: Option<std::time::SystemTime>,
}

/// Entries looked at, at most, to find when a version directory last
/// changed: a directory of many small files is not walked at every poll.
const CHANGED_ENTRIES: usize = 4096;

/// When `dir` or anything under it last changed (modification time),
/// looking at no more than [`CHANGED_ENTRIES`] entries.
fn last_changed(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = std::fs::symlink_metadata(dir).and_then(|m| m.modified()).ok()?;
    let mut pending = vec![dir.to_path_buf()];
    let mut looked = 0;
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else { continue };
        for entry in entries.filter_map(Result::ok) {
            looked += 1;
            if looked > CHANGED_ENTRIES {
                return Some(newest);
            }
            let Ok(meta) = entry.metadata() else { continue };
            if let Ok(modified) = meta.modified() {
                newest = newest.max(modified);
            }
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    Some(newest)
}

/// A model repository on the local file system:
/// `root/<model>/model.toml` and `root/<model>/<version>/…`.
#[derive(Clone, Debug)]
pub struct LocalRepository {
    root: PathBuf,
}

impl LocalRepository {
    /// A repository rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalRepository { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn model_dir(&self, model: &str) -> Result<PathBuf, FetchError> {
        let not_found = || FetchError::ModelNotFound { model: model.into(), place: self.root.display().to_string() };
        if !valid_name(model) {
            return Err(not_found());
        }
        let dir = self.root.join(model);
        let toml = dir.join("model.toml");
        match std::fs::metadata(&toml) {
            Ok(meta) if meta.is_file() => Ok(dir),
            Ok(_) => Err(not_found()),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(not_found()),
            Err(e) => Err(FetchError::Io(format!("{}: {e}", toml.display()))),
        }
    }
}

/// Whether `model` can name a directory of the repository.
fn valid_name(model: &str) -> bool {
    !model.is_empty() && !model.starts_with('.') && !model.contains(['/', '\\'])
}

/// What a file's metadata says about its presence.
fn presence_of(path: &Path) -> Presence {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Presence::Present,
        Ok(_) => Presence::Unreadable(format!("{} is not a file", path.display())),
        Err(e) if e.kind() == ErrorKind::NotFound => Presence::Missing,
        Err(e) => Presence::Unreadable(format!("{}: {e}", path.display())),
    }
}

impl Source for LocalRepository {
    fn models(&self) -> Result<Vec<String>, FetchError> {
        let entries =
            std::fs::read_dir(&self.root).map_err(|e| FetchError::Io(format!("{}: {e}", self.root.display())))?;
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().join("model.toml").is_file())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        Ok(names)
    }

    fn versions(&self, model: &str) -> Result<Vec<u64>, FetchError> {
        let dir = self.model_dir(model)?;
        let entries = std::fs::read_dir(&dir).map_err(|e| FetchError::Io(format!("{}: {e}", dir.display())))?;
        let mut versions: Vec<u64> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let number: u64 = e.file_name().to_str()?.parse().ok()?;
                (e.path().is_dir() && manifest::is_complete(&e.path())).then_some(number)
            })
            .collect();
        versions.sort_unstable();
        Ok(versions)
    }

    fn unpackaged(&self, model: &str) -> Vec<BareVersion> {
        let Ok(entries) =
            self.model_dir(model).and_then(|d| std::fs::read_dir(d).map_err(|e| FetchError::Io(e.to_string())))
        else {
            return Vec::new();
        };
        let mut found: Vec<BareVersion> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let version: u64 = e.file_name().to_str()?.parse().ok()?;
                let path = e.path();
                let bare = path.is_dir() && presence_of(&path.join(manifest::MANIFEST)) == Presence::Missing;
                bare.then(|| BareVersion { version, dir: path.display().to_string(), changed: last_changed(&path) })
            })
            .collect();
        found.sort_unstable_by_key(|b| b.version);
        found
    }

    fn presence(&self, model: &str, version: Option<u64>) -> Presence {
        if !valid_name(model) {
            return Presence::Missing;
        }
        let dir = self.root.join(model);
        match version {
            None => presence_of(&dir.join("model.toml")),
            Some(v) => presence_of(&dir.join(v.to_string()).join(manifest::MANIFEST)),
        }
    }

    fn spec(&self, model: &str) -> Result<ModelSpec, FetchError> {
        let path = self.model_dir(model)?.join("model.toml");
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            ErrorKind::NotFound => {
                FetchError::ModelNotFound { model: model.into(), place: self.root.display().to_string() }
            }
            _ => FetchError::Io(format!("{}: {e}", path.display())),
        })?;
        ModelSpec::parse(&text).map_err(|e| FetchError::Spec(format!("{}: {e}", path.display())))
    }

    fn version_stamp(&self, model: &str, version: u64) -> Option<String> {
        if !valid_name(model) {
            return None;
        }
        let manifest = self.root.join(model).join(version.to_string()).join(manifest::MANIFEST);
        let modified = std::fs::metadata(manifest).and_then(|m| m.modified()).ok()?;
        let since = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
        Some(format!("{}.{:09}", since.as_secs(), since.subsec_nanos()))
    }

    fn fetch(&self, model: &str, version: u64) -> Result<Fetched, FetchError> {
        let dir = self.model_dir(model)?.join(version.to_string());
        let not_found =
            || FetchError::VersionNotFound { model: model.into(), version, place: self.root.display().to_string() };
        match std::fs::metadata(&dir) {
            Ok(meta) if meta.is_dir() => Ok(Fetched::unsealed(dir)),
            Ok(_) => Err(not_found()),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(not_found()),
            Err(e) => Err(FetchError::Io(format!("{}: {e}", dir.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn repo() -> (tempfile::TempDir, LocalRepository) {
        let root = tempfile::tempdir().unwrap();
        let model = root.path().join("m");
        std::fs::create_dir_all(model.join("1")).unwrap();
        std::fs::write(model.join("model.toml"), "").unwrap();
        std::fs::write(model.join("1/x"), "x").unwrap();
        manifest::write(&model.join("1")).unwrap();
        let repo = LocalRepository::new(root.path());
        (root, repo)
    }

    #[test]
    fn presence_tells_a_removal_from_a_failed_read() {
        let (root, repo) = repo();
        assert_eq!(repo.presence("m", None), Presence::Present);
        assert_eq!(repo.presence("m", Some(1)), Presence::Present);
        assert_eq!(repo.presence("m", Some(2)), Presence::Missing);
        assert_eq!(repo.presence("other", None), Presence::Missing);
        assert_eq!(repo.presence("../m", None), Presence::Missing);

        // A symlink loop in place of the model: ELOOP, which even root gets.
        let model = root.path().join("m");
        let aside = root.path().join(".aside");
        std::fs::rename(&model, &aside).unwrap();
        symlink("m", &model).unwrap();
        assert!(matches!(repo.presence("m", None), Presence::Unreadable(e) if e.contains("m/model.toml")));
        assert!(matches!(repo.presence("m", Some(1)), Presence::Unreadable(_)));
        assert_eq!(repo.versions("m").unwrap_err().kind(), "io", "a loop is not a missing model");
        assert_eq!(repo.spec("m").unwrap_err().kind(), "io");
        assert_eq!(repo.fetch("m", 1).unwrap_err().kind(), "io");
        assert!(repo.models().unwrap().is_empty(), "the listing leaves out what it cannot read");

        std::fs::remove_file(&model).unwrap();
        assert_eq!(repo.presence("m", None), Presence::Missing);
        assert_eq!(repo.versions("m").unwrap_err().kind(), "model_not_found");
        std::fs::rename(&aside, &model).unwrap();

        // A version replaced by a file: not a removal either.
        let version = model.join("1");
        std::fs::rename(&version, root.path().join(".v1")).unwrap();
        std::fs::write(&version, "not a directory").unwrap();
        assert!(matches!(repo.presence("m", Some(1)), Presence::Unreadable(_)));
        assert!(repo.versions("m").unwrap().is_empty());
        std::fs::remove_file(&version).unwrap();
        assert_eq!(repo.presence("m", Some(1)), Presence::Missing);
    }
}
