//! The repository watcher, like TF Serving's file-system polling.
//!
//! - At start, and when a model appears, it loads the model's newest
//!   complete version, falling back to older ones if the newest is refused,
//!   so a corrupt newest version does not keep a server from coming up.
//! - Afterwards it acts only on versions it has not seen before (or whose
//!   MANIFEST was rewritten): a new version newer than the serving one goes
//!   through the load transaction. A rollback therefore sticks until a new
//!   version is published.
//! - A refused version is reported (status, events, metrics) and not tried
//!   again until its MANIFEST changes — never retried in a loop.
//! - A kept previous version whose directory disappears is retired; the
//!   serving version keeps serving even if its directory disappears, until
//!   another version replaces it; a model whose directory disappears is
//!   unloaded.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, SystemTime};

use baton_core::error::LoadError;

use crate::app::App;

/// Polls a local repository and keeps the registry in step with it.
pub struct Watcher {
    app: Arc<App>,
    root: PathBuf,
    /// Versions seen, with their MANIFEST's modification time.
    seen: BTreeMap<(String, u64), Option<SystemTime>>,
    warned: BTreeSet<(String, u64)>,
    /// The models it loads and readiness waits for (`--model-control
    /// explicit`); `None`: every model.
    only: Option<BTreeSet<String>>,
}

fn manifest_mtime(dir: &Path) -> Option<SystemTime> {
    std::fs::metadata(dir.join(baton_core::manifest::MANIFEST)).and_then(|m| m.modified()).ok()
}

impl Watcher {
    /// A watcher of the repository at `root`, which the registry's source reads.
    pub fn new(app: Arc<App>, root: PathBuf) -> Watcher {
        Watcher { app, root, seen: BTreeMap::new(), warned: BTreeSet::new(), only: None }
    }

    /// Loads only `models` and makes readiness wait only for them; the
    /// others are left to the API.
    pub fn only(mut self, models: BTreeSet<String>) -> Watcher {
        self.only = Some(models);
        self
    }

    /// Scans until `stop` says so or its sender goes away.
    pub fn run(mut self, poll: Duration, stop: &Receiver<()>) {
        loop {
            match stop.recv_timeout(poll) {
                Err(RecvTimeoutError::Timeout) => self.scan(),
                _ => return,
            }
        }
    }

    /// One pass over the repository.
    pub fn scan(&mut self) {
        let source = Arc::clone(self.app.registry.source());
        let models = match source.models() {
            Ok(models) => models,
            Err(error) => {
                tracing::warn!(%error, "Could not list the model repository.");
                return;
            }
        };
        let wanted: Vec<String> =
            models.iter().filter(|m| self.only.as_ref().is_none_or(|only| only.contains(*m))).cloned().collect();
        let required: BTreeSet<String> =
            wanted.iter().filter(|m| source.spec(m).map(|s| s.required).unwrap_or(true)).cloned().collect();
        self.app.set_required(required);
        for model in &wanted {
            self.scan_model(model);
        }
        for status in self.app.registry.statuses() {
            if status.serving.is_some() && !models.contains(&status.name) && !status.busy {
                tracing::info!(model = %status.name, "The model left the repository; unloading it.");
                let _ = self.app.registry.unload(&status.name);
            }
        }
    }

    fn scan_model(&mut self, model: &str) {
        let registry = &self.app.registry;
        let Some(versions) = registry.source().versions(model).ok() else { return };
        let status = registry.status(model);
        if status.as_ref().is_some_and(|s| s.busy) {
            return; // Come back next pass; nothing is marked seen.
        }
        let serving = status.as_ref().and_then(|s| s.serving);
        let fresh: Vec<u64> = versions
            .iter()
            .copied()
            .filter(|v| {
                let mtime = manifest_mtime(&self.root.join(model).join(v.to_string()));
                self.seen.get(&(model.to_owned(), *v)) != Some(&mtime)
            })
            .collect();
        for v in &fresh {
            let mtime = manifest_mtime(&self.root.join(model).join(v.to_string()));
            self.seen.insert((model.to_owned(), *v), mtime);
        }
        match serving {
            None if !fresh.is_empty() => self.load_newest_good(model, &versions),
            Some(current) => {
                if let Some(&newest) = fresh.iter().max().filter(|v| **v > current) {
                    tracing::info!(model, version = newest, "A new version appeared in the repository; loading it.");
                    if let Err(error) = registry.load(model, Some(newest)) {
                        self.forget(model, newest, &error);
                    }
                }
                self.retire_removed(model, &versions, current);
            }
            None => {}
        }
    }

    /// Loads the newest version, then older ones, until one is accepted.
    fn load_newest_good(&mut self, model: &str, versions: &[u64]) {
        for &version in versions.iter().rev() {
            tracing::info!(model, version, "Loading the model from the repository.");
            match self.app.registry.load(model, Some(version)).and_then(|h| h.wait()) {
                Ok(_) => return,
                Err(error @ LoadError::InProgress { .. }) => return self.forget(model, version, &error),
                Err(error) => {
                    tracing::warn!(model, version, %error, "The version was refused; trying the one before it.");
                }
            }
        }
    }

    /// Makes a version look unseen, so the next pass tries it again.
    fn forget(&mut self, model: &str, version: u64, error: &LoadError) {
        tracing::debug!(model, version, %error, "Could not start a load; will try again on the next pass.");
        self.seen.remove(&(model.to_owned(), version));
    }

    fn retire_removed(&mut self, model: &str, versions: &[u64], current: u64) {
        let snapshot = self.app.registry.snapshot();
        let Some(route) = snapshot.model(model) else { return };
        for kept in route.previous.iter().map(|v| v.number()).filter(|v| !versions.contains(v)) {
            tracing::info!(model, version = kept, "A kept version left the repository; retiring it.");
            let _ = self.app.registry.retire(model, kept);
        }
        if !versions.contains(&current) && self.warned.insert((model.to_owned(), current)) {
            tracing::warn!(
                model,
                version = current,
                "The serving version left the repository; it keeps serving until another version replaces it."
            );
        }
    }
}
