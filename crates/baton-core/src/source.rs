//! Where versions come from. The fetch stage asks a [`Source`] for a local
//! directory holding a version's files; the local repository hands out its
//! own directories, and a remote source (HTTP, S3) would download into a
//! staging directory first. Everything after fetch works on local files.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::manifest;
use crate::spec::ModelSpec;

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
}

impl FetchError {
    /// Stable kind string.
    pub fn kind(&self) -> &'static str {
        match self {
            FetchError::ModelNotFound { .. } => "model_not_found",
            FetchError::VersionNotFound { .. } => "version_not_found",
            FetchError::Spec(_) => "invalid_spec",
            FetchError::Io(_) => "io",
        }
    }
}

/// A place that holds models and their versions.
pub trait Source: Send + Sync + 'static {
    /// Names of all models.
    fn models(&self) -> Result<Vec<String>, FetchError>;
    /// Complete versions of a model (those whose manifest is complete), ascending.
    fn versions(&self, model: &str) -> Result<Vec<u64>, FetchError>;
    /// The model's current `model.toml`.
    fn spec(&self, model: &str) -> Result<ModelSpec, FetchError>;
    /// A local directory holding the version's files.
    fn fetch(&self, model: &str, version: u64) -> Result<PathBuf, FetchError>;
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
        let valid = !model.is_empty() && !model.starts_with('.') && !model.contains(['/', '\\']);
        let dir = self.root.join(model);
        if !valid || !dir.join("model.toml").is_file() {
            return Err(FetchError::ModelNotFound { model: model.into(), place: self.root.display().to_string() });
        }
        Ok(dir)
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

    fn spec(&self, model: &str) -> Result<ModelSpec, FetchError> {
        ModelSpec::read(&self.model_dir(model)?).map_err(FetchError::Spec)
    }

    fn fetch(&self, model: &str, version: u64) -> Result<PathBuf, FetchError> {
        let dir = self.model_dir(model)?.join(version.to_string());
        if !dir.is_dir() {
            return Err(FetchError::VersionNotFound {
                model: model.into(),
                version,
                place: self.root.display().to_string(),
            });
        }
        Ok(dir)
    }
}
