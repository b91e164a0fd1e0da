//! The errors of the registry's version management: why a load,
//! rollback or unload did not happen ([`LoadError`]), with a stable
//! `kind()` string for metric labels and response bodies.

use thiserror::Error;

use crate::files::manifest::VerifyError;
use crate::files::source::FetchError;
use crate::registry::budget::BudgetError;
use crate::registry::events::Stage;
use crate::registry::load::validate::ValidateError;
use crate::registry::load::warmup::WarmupError;
use crate::run::backend::BackendError;

/// Why a load, rollback or unload did not happen. Any error from a stage
/// before commit leaves the serving version untouched.
#[derive(Debug, Error)]
pub enum LoadError {
    /// Another load, rollback or unload of this model is running.
    #[error("a load is already in progress for model '{model}'")]
    InProgress {
        /// The model.
        model: String,
    },
    /// The repository has no such model.
    #[error("unknown model '{model}'")]
    UnknownModel {
        /// The model.
        model: String,
    },
    /// The repository has no complete version of the model.
    #[error("model '{model}' has no complete version (a version directory needs its MANIFEST)")]
    NoVersion {
        /// The model.
        model: String,
    },
    /// Rollback was asked for but no previous version is loaded.
    #[error("model '{model}' has no previous version loaded to roll back to")]
    NoPrevious {
        /// The model.
        model: String,
    },
    /// The version is not a kept previous version of the model.
    #[error("version {version} of model '{model}' is not a kept previous version")]
    NotRetirable {
        /// The model.
        model: String,
        /// The version.
        version: u64,
    },
    /// The model is not being served.
    #[error("model '{model}' is not loaded")]
    NotLoaded {
        /// The model.
        model: String,
    },
    /// A rollout of the model is in progress; the operation would cut
    /// across it.
    #[error("model '{model}' has a rollout of version {candidate} in progress; promote or abort it first")]
    RolloutInProgress {
        /// The model.
        model: String,
        /// The candidate being rolled out.
        candidate: u64,
    },
    /// No rollout of the model is in progress.
    #[error("model '{model}' has no rollout in progress")]
    NoRollout {
        /// The model.
        model: String,
    },
    /// The rollout cannot start as asked.
    #[error("model '{model}': {reason}")]
    RolloutRefused {
        /// The model.
        model: String,
        /// Why, in words.
        reason: String,
    },
    /// The registry is shutting down and takes no new work.
    #[error("the registry is shutting down")]
    ShuttingDown,
    /// The model's `model.toml` is invalid: nothing of the model loads
    /// until it is fixed. The message names the file, the line and column,
    /// and what was expected.
    #[error(
        "config failed: invalid {0}; fix the file: a server that polls the repository takes the fix up on its next poll, else load the model again"
    )]
    Config(String),
    /// The fetch stage failed.
    #[error("fetch failed: {0}")]
    Fetch(#[from] FetchError),
    /// The verify stage failed.
    #[error("verify failed: {0}")]
    Verify(#[from] VerifyError),
    /// The engine could not load the model.
    #[error("load failed: {0}")]
    Load(#[from] BackendError),
    /// Live versions and the candidate would hold more memory than a budget
    /// allows: refused at stage `load`, by estimate before the engine loads
    /// it or by measurement after.
    #[error("load refused: {0}")]
    MemoryBudget(#[from] BudgetError),
    /// The validate stage refused the model.
    #[error("validate failed: {0}")]
    Validate(#[from] ValidateError),
    /// The warmup stage failed.
    #[error("warmup failed: {0}")]
    Warmup(#[from] WarmupError),
    /// The version's engine ended by itself (its worker process exited)
    /// after it loaded and before the version was published: nothing was
    /// published, and the serving version is untouched.
    #[error("commit refused: the version's engine ended before it was published ({why})")]
    EngineEnded {
        /// What is known of how it ended.
        why: String,
    },
    /// Code in a stage panicked; the loader survived it.
    #[error("{stage} failed: internal error: {message}")]
    Panicked {
        /// The stage that panicked.
        stage: Stage,
        /// The panic message.
        message: String,
    },
}

impl LoadError {
    /// A failure to read the model's `model.toml`: one that does not parse
    /// is [`LoadError::Config`], anything else (not found, unreadable) a
    /// fetch failure.
    pub fn from_spec(error: FetchError) -> LoadError {
        match error {
            FetchError::Spec(message) => LoadError::Config(message),
            other => LoadError::Fetch(other),
        }
    }

    /// The stage that failed, for stage errors.
    pub fn stage(&self) -> Option<Stage> {
        match self {
            LoadError::Config(_) => Some(Stage::Config),
            LoadError::Fetch(_) => Some(Stage::Fetch),
            LoadError::Verify(_) => Some(Stage::Verify),
            LoadError::Load(_) | LoadError::MemoryBudget(_) => Some(Stage::Load),
            LoadError::Validate(_) => Some(Stage::Validate),
            LoadError::Warmup(_) => Some(Stage::Warmup),
            LoadError::EngineEnded { .. } => Some(Stage::Commit),
            LoadError::Panicked { stage, .. } => Some(*stage),
            _ => None,
        }
    }

    /// Stable kind string: the stage for stage failures (`verify_failed`),
    /// else what was refused (`load_in_progress`).
    pub fn kind(&self) -> &'static str {
        match self {
            LoadError::InProgress { .. } => "load_in_progress",
            LoadError::UnknownModel { .. } => "unknown_model",
            LoadError::NoVersion { .. } => "no_version",
            LoadError::NoPrevious { .. } => "no_previous_version",
            LoadError::NotLoaded { .. } => "not_loaded",
            LoadError::NotRetirable { .. } => "not_retirable",
            LoadError::RolloutInProgress { .. } => "rollout_in_progress",
            LoadError::NoRollout { .. } => "no_rollout",
            LoadError::RolloutRefused { .. } => "rollout_refused",
            LoadError::ShuttingDown => "shutting_down",
            LoadError::Config(_) => "config_failed",
            LoadError::Fetch(_) => "fetch_failed",
            LoadError::Verify(_) => "verify_failed",
            LoadError::Load(_) => "load_failed",
            LoadError::MemoryBudget(_) => "memory_budget_exceeded",
            LoadError::Validate(_) => "validate_failed",
            LoadError::Warmup(_) => "warmup_failed",
            LoadError::EngineEnded { .. } => "commit_failed",
            LoadError::Panicked { .. } => "internal",
        }
    }

    /// The finer reason inside a stage failure (`digest_mismatch`, `nan`).
    pub fn reason(&self) -> &'static str {
        match self {
            LoadError::Config(_) => "invalid_spec",
            LoadError::Fetch(e) => e.kind(),
            LoadError::Verify(e) => e.kind(),
            LoadError::Load(e) => e.kind,
            LoadError::Validate(e) => e.kind(),
            LoadError::Warmup(e) => e.kind(),
            LoadError::EngineEnded { .. } => "engine_ended",
            other => other.kind(),
        }
    }
}
