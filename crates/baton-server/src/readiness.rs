//! What `/v2/health/ready` waits for, and what the repository watcher found
//! it cannot serve: models it tried and gave up on, and version directories
//! that lack a MANIFEST. Why the default is what it is: docs/api.md.

use std::collections::BTreeMap;

use baton_core::registry::error::LoadError;
use baton_core::registry::events::Stage;

/// How readiness treats a model the repository holds but the server could
/// not bring into service (`baton serve --readiness`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Readiness {
    /// Ready once every model that can serve does: a model whose every
    /// version was refused (or that has no complete version) is not waited
    /// for, as long as the server serves at least one model.
    #[default]
    Servable,
    /// Ready only once every model serves.
    All,
}

/// A version directory without a MANIFEST, which the watcher cannot load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unpackaged {
    /// The directory, as the repository names it.
    pub dir: String,
    /// What to do about it, for people.
    pub message: String,
}

/// Why a model was given up on: its files were refused in a way that
/// trying again cannot change (see the watcher).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CannotServe {
    /// Stable kind, as load failures name it (`config_failed`,
    /// `verify_failed`, or `no_version` when no version is complete).
    pub kind: &'static str,
    /// The load stage that refused it, when one did.
    pub stage: Option<Stage>,
    /// What happened, for people: it may name repository paths and what a
    /// store answered, so only privileged callers are shown it.
    pub message: String,
}

impl CannotServe {
    /// A refusal by a load stage.
    pub fn refused(error: &LoadError) -> CannotServe {
        CannotServe { kind: error.kind(), stage: error.stage(), message: error.to_string() }
    }

    /// A model with no complete version.
    pub fn no_version(message: String) -> CannotServe {
        CannotServe { kind: "no_version", stage: None, message }
    }

    /// As JSON: `kind` and `stage` for anyone, `message` for a privileged
    /// caller (one the management scope would let in).
    pub fn view(&self, privileged: bool) -> serde_json::Value {
        let mut view = serde_json::json!({ "kind": self.kind, "stage": self.stage.map(Stage::as_str) });
        if privileged {
            view["message"] = self.message.clone().into();
        }
        view
    }
}

/// What the repository watcher found about models it could not serve.
#[derive(Debug, Default)]
pub struct Findings {
    /// Models tried and given up on until the repository changes (or a
    /// load of them succeeds), and why.
    pub cannot_serve: BTreeMap<String, CannotServe>,
    /// Version directories without a MANIFEST, by model and version.
    pub unpackaged: BTreeMap<String, BTreeMap<u64, Unpackaged>>,
}

impl Findings {
    /// The status of one model's findings, as JSON: `unpackaged` and
    /// `cannot_serve` (`null` when it is not given up on; its message for a
    /// `privileged` caller only).
    pub fn of(&self, model: &str, privileged: bool) -> serde_json::Value {
        let unpackaged: Vec<serde_json::Value> = self
            .unpackaged
            .get(model)
            .into_iter()
            .flatten()
            .map(|(v, u)| serde_json::json!({ "version": v, "dir": u.dir, "message": u.message }))
            .collect();
        serde_json::json!({ "unpackaged": unpackaged, "cannot_serve": self.cannot_serve.get(model).map(|c| c.view(privileged)) })
    }

    /// Whether there is anything to say about `model`.
    pub fn knows(&self, model: &str) -> bool {
        self.cannot_serve.contains_key(model) || self.unpackaged.get(model).is_some_and(|u| !u.is_empty())
    }
}
