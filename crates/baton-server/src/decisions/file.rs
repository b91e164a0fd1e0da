//! The state file: its schema, reading it at start, and writing it
//! atomically (a temporary file in the same directory, fsync, rename, fsync
//! of the directory), so that a crash leaves either the old file or the new
//! one, never half of one. Blocking I/O: callers run it off async workers.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The format this baton writes and reads (`"version"` in the file).
pub const FORMAT: u32 = 1;

/// The file's name in the repository root when `--state-dir` is not given.
/// A dot-file: the repository scanner skips entries whose name starts with
/// a dot, so it is never taken for a model.
pub const IN_REPOSITORY: &str = ".baton-state.json";

/// The file's name under `--state-dir`.
pub const IN_STATE_DIR: &str = "state.json";

/// What an operator decided about a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Rolled back to the kept previous version.
    Rollback,
    /// Loaded a version older than the repository's newest.
    Load,
    /// Took the model out of service.
    Unload,
    /// Pinned a version: it serves until unpinned, whatever is published.
    Pin,
    /// Started a rollout: the version serves as stable, beside the
    /// rollout's candidate, until the rollout ends.
    Rollout,
}

impl Kind {
    /// The name, as in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Rollback => "rollback",
            Kind::Load => "load",
            Kind::Unload => "unload",
            Kind::Pin => "pin",
            Kind::Rollout => "rollout",
        }
    }
}

/// One model's decision in force.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// What was decided.
    pub kind: Kind,
    /// The version chosen; absent for an unload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// When, in seconds since the Unix epoch.
    pub at: u64,
    /// For all but a pin: the newest version in the repository when it was
    /// decided. A version newer than this one supersedes the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yields_to: Option<u64>,
    /// For a rollout: how far it had gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Box<RolloutRecord>>,
}

/// What a restart needs to take a rollout up where it was.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutRecord {
    /// The candidate.
    pub candidate: u64,
    /// The plan it runs by.
    pub plan: baton_core::rollout::plan::Plan,
    /// The step reached (0-based).
    pub step: usize,
    /// Why it was paused, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
}

impl Decision {
    /// Whether a repository whose newest version is `newest` has moved past
    /// this decision. A pin never yields.
    pub fn superseded_by(&self, newest: Option<u64>) -> bool {
        match (self.kind, self.yields_to, newest) {
            (Kind::Pin | Kind::Rollout, _, _) => false,
            (_, Some(until), Some(newest)) => newest > until,
            _ => false,
        }
    }

    /// Why a decision read from the file cannot be used, if it cannot.
    fn invalid(&self) -> Option<&'static str> {
        match (self.kind, self.version, self.yields_to) {
            (Kind::Unload, Some(_), _) => Some("an unload names no version"),
            (Kind::Rollback | Kind::Load | Kind::Pin, None, _) => Some("it names no version"),
            (Kind::Pin, _, Some(_)) => Some("a pin yields to no version"),
            (Kind::Rollback | Kind::Load | Kind::Unload, _, None) => Some("it has no yields_to"),
            (Kind::Rollout, None, _) => Some("it names no stable version"),
            _ if (self.kind == Kind::Rollout) != self.rollout.is_some() => {
                Some("a rollout, and only a rollout, records how far it had gone")
            }
            _ => None,
        }
    }
}

/// The whole file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    version: u32,
    #[serde(default)]
    models: BTreeMap<String, Decision>,
}

/// Why the state file could not be read or written.
#[derive(Debug)]
pub enum StateError {
    /// The file exists but is not a state file this baton reads.
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading or writing failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Invalid { path, reason } => write!(f, "{}: {reason}", path.display()),
            StateError::Io { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for StateError {}

/// Reads the decisions in the file at `path`; none when it does not exist.
pub fn read(path: &Path) -> Result<BTreeMap<String, Decision>, StateError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(error) => return Err(StateError::Io { path: path.to_owned(), error }),
    };
    let invalid = |reason: String| StateError::Invalid { path: path.to_owned(), reason };
    let file: StateFile = serde_json::from_str(&text).map_err(|e| invalid(format!("not a baton state file: {e}")))?;
    if file.version != FORMAT {
        return Err(invalid(format!("format version {} is not one this baton reads ({FORMAT})", file.version)));
    }
    for (model, decision) in &file.models {
        if let Some(reason) = decision.invalid() {
            return Err(invalid(format!("the decision for model '{model}' is not valid: {reason}")));
        }
    }
    Ok(file.models)
}

/// Writes `models` to `path` atomically and durably.
pub fn write(path: &Path, models: &BTreeMap<String, Decision>) -> Result<(), StateError> {
    let io = |error| StateError::Io { path: path.to_owned(), error };
    let mut text = serde_json::to_string_pretty(&StateFile { version: FORMAT, models: models.clone() })
        .map_err(|e| io(std::io::Error::other(e)))?;
    text.push('\n');
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state");
    // A dot-name, so the repository scanner skips it too.
    let temporary = dir.join(format!(".{}.{}.tmp", name.trim_start_matches('.'), std::process::id()));
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(kind: Kind, version: Option<u64>, yields_to: Option<u64>) -> Decision {
        Decision { kind, version, at: 1_700_000_000, yields_to, rollout: None }
    }

    #[test]
    fn a_written_file_reads_back_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(IN_REPOSITORY);
        assert!(read(&path).unwrap().is_empty(), "no file, no decisions");
        let models = BTreeMap::from([
            ("a".to_owned(), decision(Kind::Rollback, Some(1), Some(2))),
            ("b".to_owned(), decision(Kind::Unload, None, Some(3))),
            ("c".to_owned(), decision(Kind::Pin, Some(4), None)),
        ]);
        write(&path, &models).unwrap();
        assert_eq!(read(&path).unwrap(), models);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [IN_REPOSITORY], "only the file itself");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"version\": 1") && text.contains("\n  \"models\""), "pretty: {text}");
    }

    #[test]
    fn a_file_that_is_not_a_state_file_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        for (text, needle) in [
            ("{ not json", "not a baton state file"),
            (r#"{"version": 2, "models": {}}"#, "format version 2"),
            (r#"{"version": 1, "models": {"m": {"kind": "pin", "at": 1}}}"#, "names no version"),
            (r#"{"version": 1, "models": {"m": {"kind": "rollback", "version": 1, "at": 1}}}"#, "no yields_to"),
            (r#"{"version": 1, "models": {"m": {"kind": "sideways", "at": 1}}}"#, "not a baton state file"),
        ] {
            std::fs::write(&path, text).unwrap();
            let error = read(&path).unwrap_err().to_string();
            assert!(error.contains("state.json") && error.contains(needle), "{text}: {error}");
        }
    }

    #[test]
    fn only_a_newer_version_supersedes_and_never_a_pin() {
        let rollback = decision(Kind::Rollback, Some(1), Some(2));
        assert!(!rollback.superseded_by(Some(2)) && !rollback.superseded_by(None));
        assert!(rollback.superseded_by(Some(3)));
        assert!(!decision(Kind::Pin, Some(1), None).superseded_by(Some(9)));
    }
}
