//! Operators' decisions about what a model serves — a rollback, the load
//! of an older version, an unload, a pin — kept in a state file so that a
//! restart serves what the operator last chose rather than the newest
//! version (docs/api.md, "Decisions that survive a restart").
//!
//! [`Decisions`] holds the decisions in force and writes them to the file;
//! [`operate`] runs the management operations that make them; the
//! repository watcher restores them at start and supersedes them when a
//! newer version is published. A deployment concern, so it lives here and
//! not in the core.

pub mod file;
pub mod journal;
pub mod operate;
pub mod rollout;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use baton_core::registry::Registry;
use baton_core::registry::events::EventKind;
use baton_core::threads::sync::Lock;
pub use file::{Decision, Kind, RolloutRecord, StateError};
use serde_json::{Value, json};

/// What happens to a model's decision.
#[derive(Debug)]
pub enum Change {
    /// An operator made this decision.
    Recorded(Decision),
    /// An operator returned the model to the normal choice (an unpin, the
    /// load of the newest version).
    Removed,
    /// A version newer than the one the decision yields to was published.
    Superseded {
        /// That version.
        newest: u64,
    },
    /// It could not be restored at start.
    Dropped {
        /// Why.
        reason: String,
    },
}

impl Change {
    fn name(&self) -> &'static str {
        match self {
            Change::Recorded(_) => "recorded",
            Change::Removed => "removed",
            Change::Superseded { .. } => "superseded",
            Change::Dropped { .. } => "dropped",
        }
    }
}

/// The decisions in force, and the file that keeps them.
pub struct Decisions {
    path: PathBuf,
    models: Lock<BTreeMap<String, Decision>>,
    /// Serialises changes, so the file is always written from the latest
    /// state and no change is lost.
    writer: Lock<()>,
    /// Models an operation that records a decision is working on, and
    /// whether the repository watcher is the one working.
    working: Lock<BTreeMap<String, bool>>,
}

/// The right to run one decision-making operation on a model; released
/// on drop.
pub struct Working {
    decisions: Arc<Decisions>,
    model: String,
}

impl Drop for Working {
    fn drop(&mut self) {
        self.decisions.working.lock().remove(&self.model);
    }
}

/// Seconds since the Unix epoch, now.
pub fn now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Decisions {
    /// The decisions kept in the file at `path` (none when it does not
    /// exist yet). A file that exists but cannot be read or parsed is an
    /// error: serving the newest version instead would silently undo an
    /// operator's rollback.
    pub fn open(path: PathBuf) -> Result<Decisions, StateError> {
        let models = file::read(&path)?;
        Ok(Decisions { path, models: Lock::new(models), writer: Lock::new(()), working: Lock::new(BTreeMap::new()) })
    }

    /// The decision in force for `model`.
    pub fn get(&self, model: &str) -> Option<Decision> {
        self.models.lock().get(model).cloned()
    }

    /// Every decision in force.
    pub fn all(&self) -> BTreeMap<String, Decision> {
        self.models.lock().clone()
    }

    /// Claims `model` for one operator's operation; `None` while another
    /// runs.
    pub fn begin(self: &Arc<Self>, model: &str) -> Option<Working> {
        self.claim(model, false)
    }

    /// Claims `model` for the repository watcher's pass over it; `None`
    /// while another operation runs.
    pub fn begin_watching(self: &Arc<Self>, model: &str) -> Option<Working> {
        self.claim(model, true)
    }

    /// The models an operator's operation (not the watcher's pass) works
    /// on now: an upgrade waits until there are none.
    pub fn operations(&self) -> Vec<String> {
        self.working.lock().iter().filter(|(_, watcher)| !**watcher).map(|(model, _)| model.clone()).collect()
    }

    /// Whether the watcher holds `model` now: an operator's call waits for
    /// it rather than being refused.
    pub fn watcher_holds(&self, model: &str) -> bool {
        self.working.lock().get(model).copied().unwrap_or(false)
    }

    fn claim(self: &Arc<Self>, model: &str, watcher: bool) -> Option<Working> {
        let mut working = self.working.lock();
        if working.contains_key(model) {
            return None;
        }
        working.insert(model.to_owned(), watcher);
        Some(Working { decisions: Arc::clone(self), model: model.to_owned() })
    }

    /// Applies `change` to `model`'s decision: in memory at once (it is
    /// what serves), then in the file, then tells subscribers and the log.
    /// Blocking: call it off async workers. A change that changes nothing
    /// writes nothing. When the write fails the change still holds in
    /// memory, for this process's life, and the error says the file lags.
    pub fn apply(&self, registry: &Registry, model: &str, change: Change) -> Result<(), StateError> {
        let _serial = self.writer.lock();
        let (before, snapshot) = {
            let mut models = self.models.lock();
            let before = models.get(model).cloned();
            match &change {
                Change::Recorded(decision) => models.insert(model.to_owned(), decision.clone()),
                _ => models.remove(model),
            };
            (before, models.clone())
        };
        let about = match &change {
            Change::Recorded(decision) if before.as_ref() == Some(decision) => return Ok(()),
            Change::Recorded(decision) => decision.clone(),
            _ => match before {
                Some(before) => before,
                None => return Ok(()),
            },
        };
        if let Err(error) = file::write(&self.path, &snapshot) {
            tracing::error!(
                model,
                change = change.name(),
                decision = about.kind.as_str(),
                %error,
                "Could not write the state file; the decision holds until baton stops, but a restart would not know it."
            );
            return Err(error);
        }
        let message = describe(model, &about, &change);
        tracing::info!(
            model,
            change = change.name(),
            decision = about.kind.as_str(),
            version = about.version,
            yields_to = about.yields_to,
            file = %self.path.display(),
            "{message}"
        );
        let kind = EventKind::Decision {
            change: change.name().to_owned(),
            decision: about.kind.as_str().to_owned(),
            yields_to: about.yields_to,
            message,
        };
        registry.announce(model, about.version, kind);
        Ok(())
    }
}

/// A sentence saying what happened to a decision.
fn describe(model: &str, decision: &Decision, change: &Change) -> String {
    let what = match (decision.kind, decision.version) {
        (Kind::Unload, _) | (_, None) => "unloaded".to_owned(),
        (Kind::Pin, Some(v)) => format!("pinned to version {v}"),
        (Kind::Rollback, Some(v)) => format!("rolled back to version {v}"),
        (Kind::Load, Some(v)) => format!("held at version {v}"),
        (Kind::Rollout, Some(v)) => match &decision.rollout {
            Some(r) => format!("rolling out version {} beside version {v}", r.candidate),
            None => format!("rolling out beside version {v}"),
        },
    };
    match change {
        Change::Recorded(_) => format!("Model {model} is {what} {}.", holds(decision)),
        Change::Removed => format!("Model {model} is no longer {what}; it follows the newest version."),
        Change::Superseded { newest } => {
            format!("Model {model} was {what}; version {newest} is newer, so it takes over.")
        }
        Change::Dropped { reason } => format!("Model {model} was {what}, which cannot be restored: {reason}."),
    }
}

/// How long a decision holds, in words.
fn holds(decision: &Decision) -> String {
    match decision.yields_to {
        _ if decision.kind == Kind::Rollout => "until the rollout ends".to_owned(),
        Some(newest) if decision.kind != Kind::Pin => format!("until a version newer than {newest} is published"),
        _ => "until unpinned".to_owned(),
    }
}

/// A decision as status shows it: the file's fields and how long it holds.
pub fn view(decision: &Decision) -> Value {
    let mut value = serde_json::to_value(decision).unwrap_or_default();
    // The state file keeps a rollout's steps in basis points; people and
    // clients read percent, as everywhere else.
    if let Some(steps) = value.pointer_mut("/rollout/plan/steps").and_then(Value::as_array_mut) {
        for step in steps.iter_mut() {
            *step = json!(step.as_u64().map_or(0.0, |bp| bp as f64 / 100.0));
        }
    }
    if let Some(fields) = value.as_object_mut() {
        fields.insert("holds".into(), json!(holds(decision)));
    }
    value
}
