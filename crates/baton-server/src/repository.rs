//! The repository index both front ends answer: every model and version
//! baton knows, on disk or in memory, with its state and, for the ones not
//! ready, the reason.

use std::collections::BTreeSet;

use baton_core::registry::events::State as ModelState;

use crate::app::App;
use crate::error::{Class, ServeError};

/// One model version in the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexRow {
    /// Model name.
    pub name: String,
    /// Version number.
    pub version: u64,
    /// `READY`, `LOADING`, `UNLOADING`, `UNAVAILABLE` or `FAILED`.
    pub state: &'static str,
    /// Why it is not ready: the running state, or the failure with its stage.
    pub reason: String,
}

/// The index; with `ready_only`, only the ready versions.
pub fn index(app: &App, ready_only: bool) -> Result<Vec<IndexRow>, ServeError> {
    let source = app.registry.source();
    let mut names: BTreeSet<String> = source
        .models()
        .map_err(|e| ServeError::new(Class::Internal, "repository_unreadable", e.to_string()))?
        .into_iter()
        .collect();
    names.extend(app.registry.statuses().into_iter().map(|s| s.name));
    let snapshot = app.registry.snapshot();
    let mut rows = Vec::new();
    for name in names {
        let status = app.registry.status(&name);
        let route = snapshot.model(&name);
        let mut versions: BTreeSet<u64> = source.versions(&name).unwrap_or_default().into_iter().collect();
        if let Some(route) = route {
            versions.extend(route.versions().map(|v| v.number()));
        }
        if let Some(s) = &status {
            versions.extend(s.failed_versions.keys().copied());
            versions.extend(s.working_on);
        }
        for version in versions {
            let loaded = route.is_some_and(|r| r.versions().any(|v| v.number() == version));
            let working = status.as_ref().filter(|s| s.working_on == Some(version));
            let failed = status.as_ref().and_then(|s| s.failed_versions.get(&version));
            let (state, reason) = if loaded {
                ("READY", String::new())
            } else if let Some(s) = working {
                let state = if s.state == ModelState::Draining { "UNLOADING" } else { "LOADING" };
                (state, s.state.as_str().to_owned())
            } else if let Some(f) = failed {
                ("FAILED", f.message.clone())
            } else {
                ("UNAVAILABLE", "not loaded".to_owned())
            };
            if !ready_only || state == "READY" {
                rows.push(IndexRow { name: name.clone(), version, state, reason });
            }
        }
    }
    Ok(rows)
}
