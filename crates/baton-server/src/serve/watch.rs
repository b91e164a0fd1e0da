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
//!
//! - An operator's decision kept in the state file ([`crate::decisions`])
//!   comes first: at start a rolled-back or older-loaded model loads the
//!   version chosen, an unloaded one stays unloaded (and readiness does not
//!   wait for it), a pinned one loads its pin. A version newer than the one
//!   a decision yields to supersedes it (pins excepted), and loads as
//!   above. A decision that cannot be restored (its version gone or
//!   refused) is dropped, and the newest good version loads.
//!
//! - A model whose every version is refused (its files, not a store or a
//!   memory budget of the moment: such a load is tried again after a
//!   growing wait), or that has no complete
//!   version, is recorded as one that cannot serve (readiness does not
//!   wait for it by default, see [`crate::readiness`]). A `model.toml`
//!   that does not parse stops the attempts at once (older versions share
//!   it); once it parses again, the versions it kept from loading are
//!   tried again without an operator's call.
//! - A version directory without a MANIFEST is reported once (log, event,
//!   status) with the `baton package` command that completes it, once it
//!   has lacked one for a few polls with nothing in it changing: a copy
//!   then `baton package` is not reported.
//!
//! Disappearing means the repository says "no such file" ([`Presence::Missing`])
//! on [`MISSING_POLLS`] polls in a row (`--missing-polls`). Anything else — a listing
//! that fails, `EIO`, `EACCES`, `ESTALE`, a symlink loop — is a repository
//! that cannot be read right now, not one that changed: an NFS server
//! restarting or a FUSE mount that hangs for a moment must not unload what
//! serves. Such an error is logged once when it begins and once when it
//! ends, and changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

use baton_core::files::source::{BareVersion, FetchError, Presence};
use baton_core::registry::error::LoadError;
use baton_core::registry::events::EventKind;

use crate::app::App;
use baton_core::registry::load::RolloutStart;

use super::retry::{EXCUSE_AFTER, FIRST_RETRY, MAX_RETRY, Retry, reaches_the_whole_source, refuses_the_files};
use crate::decisions::{Change, Decision, Kind, now};
use crate::readiness::{CannotServe, Unpackaged};

/// Polls in a row a model or a kept version must be found missing before
/// the watcher unloads or retires it, unless `--missing-polls` says
/// otherwise: long enough that a directory replaced by a rename, or an
/// answer a network file system gets wrong once, does not take a model out
/// of service; short enough that a removal takes effect within seconds at
/// the default poll interval.
pub const MISSING_POLLS: u32 = 3;

/// Polls in a row a version directory must be found without a MANIFEST
/// before it is reported: a `cp` then `baton package` that a poll falls
/// between is not an operator's mistake.
const UNPACKAGED_POLLS: u32 = 3;
/// How long nothing in such a directory must have changed before it is
/// reported: long enough for `baton package` to hash a large model's files
/// (a copy in progress keeps changing them).
const UNPACKAGED_QUIET: Duration = Duration::from_secs(30);

/// What the watcher looks at, for its counts and its log.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Subject {
    /// The repository's list of models.
    Repository,
    /// A model's `model.toml`.
    Model(String),
    /// A model's list of versions.
    Versions(String),
    /// A version's `MANIFEST`.
    Version(String, u64),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Repository => write!(f, "the list of models"),
            Subject::Model(m) => write!(f, "model {m}"),
            Subject::Versions(m) => write!(f, "the versions of model {m}"),
            Subject::Version(m, v) => write!(f, "version {v} of model {m}"),
        }
    }
}

/// Polls a local repository and keeps the registry in step with it.
pub struct Watcher {
    app: Arc<App>,
    missing_polls: u32,
    /// Versions seen, with their MANIFEST's stamp (see
    /// [`baton_core::files::source::Source::version_stamp`]).
    seen: BTreeMap<(String, u64), Option<String>>,
    warned: BTreeSet<(String, u64)>,
    /// Polls in a row each model or kept version was found missing.
    missing: BTreeMap<Subject, u32>,
    /// What could not be read when last looked at, and why.
    unreadable: BTreeMap<Subject, String>,
    /// The models it loads and readiness waits for (`--model-control
    /// explicit`); `None`: every model.
    only: Option<BTreeSet<String>>,
    /// Models it also loads, without readiness waiting for them: those an
    /// operator's decision names (`--model-control explicit`).
    restore: BTreeSet<String>,
    /// Models whose `model.toml` did not parse when last read.
    broken_spec: BTreeSet<String>,
    /// Whether it polls (else a fix needs an operator's load).
    polls: bool,
    /// Models whose last load failed for a reason of the moment, and when
    /// they are tried again.
    retry: BTreeMap<String, Retry>,
    /// Polls in a row each version directory was found without a MANIFEST.
    bare_polls: BTreeMap<(String, u64), u32>,
    /// The repository as the operator named it, for what the watcher logs.
    repository: String,
    /// `--model-control explicit` (with or without `--load-model`, or
    /// `--no-poll`): an empty repository is not held against readiness.
    explicit: bool,
}

/// What to do about something not in a listing.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Gone for long enough: unload or retire it.
    Gone,
    /// Keep it: present, unreadable, or not missing for long enough yet.
    Keep,
}

impl Watcher {
    /// A watcher of the registry's source, acting on what is missing
    /// `missing_polls` polls in a row (at least one).
    pub fn new(app: Arc<App>, missing_polls: u32) -> Watcher {
        Watcher {
            app,
            missing_polls: missing_polls.max(1),
            seen: BTreeMap::new(),
            warned: BTreeSet::new(),
            missing: BTreeMap::new(),
            unreadable: BTreeMap::new(),
            only: None,
            restore: BTreeSet::new(),
            broken_spec: BTreeSet::new(),
            polls: true,
            retry: BTreeMap::new(),
            bare_polls: BTreeMap::new(),
            repository: "(unnamed)".to_owned(),
            explicit: false,
        }
    }

    /// Names the repository in what the watcher tells an operator.
    pub fn repository(mut self, repository: String) -> Watcher {
        self.repository = repository;
        self
    }

    /// A repository that lists no model holds the server not ready (it
    /// would serve nothing), with one warning when that begins. Not in
    /// explicit mode (`--no-poll` and `--load-model '*'` included): there
    /// an empty repository is filled and loaded through the API, a sidecar
    /// agent's target for one.
    fn listed_models(&mut self, models: &[String]) {
        if self.explicit || self.only.is_some() {
            return;
        }
        if !models.is_empty() {
            if self.app.unservable().is_some() {
                tracing::info!(repository = %self.repository, models = models.len(), "The repository lists models again.");
            }
            return self.app.set_unservable(None);
        }
        // Neither says why: an empty listing comes as well from a mistyped
        // path, a store not answering at first start with an empty cache,
        // or directories baton may not enter. The reason, on the open
        // readiness endpoint, leaves the repository's location to the log.
        if self.app.unservable().is_none() {
            tracing::warn!(
                repository = %self.repository,
                "The repository lists no model directory (a directory holding a model.toml and numbered version \
                 directories). Check the path, for a store its endpoint and credentials, and the layout (a bare \
                 model.onnx is not a repository). Not ready until it lists one."
            );
        }
        self.app.set_unservable(Some(
            "the repository lists no model directory (a directory holding a model.toml): the server would serve \
             nothing; check the path, the store's endpoint and credentials, and the layout (the log names the \
             repository)"
                .to_owned(),
        ));
    }

    /// Says whether [`Watcher::run`] will follow the first scan, for the
    /// words that tell an operator how a fix is taken up.
    pub fn polling(mut self, polls: bool) -> Watcher {
        self.polls = polls;
        self
    }

    /// Says the server runs in explicit mode, `--load-model '*'` and
    /// `--no-poll` included: an empty repository is then not held against
    /// readiness, since models are put there and loaded through the API.
    pub fn explicit(mut self, explicit: bool) -> Watcher {
        self.explicit = explicit;
        self
    }

    /// Loads only `models` and makes readiness wait only for them; the
    /// others are left to the API.
    pub fn only(mut self, models: BTreeSet<String>) -> Watcher {
        self.only = Some(models);
        self
    }

    /// Also loads `models`, the ones an operator's decision keeps serving,
    /// without making readiness wait for them.
    pub fn restore(mut self, models: BTreeSet<String>) -> Watcher {
        self.restore = models;
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
            Err(error) => return self.cannot_read(Subject::Repository, error.to_string()),
        };
        self.can_read(&Subject::Repository);
        self.listed_models(&models);
        let named = |m: &String| self.only.as_ref().is_none_or(|only| only.contains(m));
        let wanted: Vec<String> = models.iter().filter(|m| named(m) || self.restore.contains(*m)).cloned().collect();
        // A model the operator unloaded is not waited for.
        let unloaded = |m: &String| self.app.decisions.get(m).is_some_and(|d| d.kind == Kind::Unload);
        let required: BTreeSet<String> = wanted
            .iter()
            .filter(|m| named(m) && !unloaded(m) && source.spec(m).map(|s| s.required).unwrap_or(true))
            .cloned()
            .collect();
        self.app.set_required(required);
        for model in &models {
            self.present(&Subject::Model(model.clone()));
        }
        for model in &wanted {
            self.scan_model(model);
        }
        self.app.find(|f| {
            f.cannot_serve.retain(|m, _| wanted.contains(m));
            f.unpackaged.retain(|m, _| wanted.contains(m));
        });
        self.broken_spec.retain(|m| wanted.contains(m));
        self.retry.retain(|m, _| wanted.contains(m));
        self.bare_polls.retain(|(m, _), _| wanted.contains(m));
        for status in self.app.registry.statuses() {
            if status.serving.is_none() || models.contains(&status.name) || status.busy {
                continue;
            }
            let subject = Subject::Model(status.name.clone());
            if self.judge(&subject, source.presence(&status.name, None)) == Verdict::Gone {
                tracing::info!(model = %status.name, "The model left the repository; unloading it.");
                let _ = self.app.registry.unload(&status.name);
            }
        }
        self.forget_unserved(&models);
    }

    fn scan_model(&mut self, model: &str) {
        let app = Arc::clone(&self.app);
        let registry = &app.registry;
        let versions = match registry.source().versions(model) {
            Ok(versions) => versions,
            Err(error) => return self.cannot_read(Subject::Versions(model.to_owned()), error.to_string()),
        };
        self.can_read(&Subject::Versions(model.to_owned()));
        self.note_unpackaged(model);
        self.check_spec(model);
        if self.retry.get(model).is_some_and(|r| Instant::now() < r.due) {
            return; // Its load failed for a reason of the moment; not yet.
        }
        let fresh: Vec<(u64, _)> = versions
            .iter()
            .map(|v| (*v, registry.source().version_stamp(model, *v)))
            .filter(|(v, mtime)| self.seen.get(&(model.to_owned(), *v)) != Some(mtime))
            .collect();
        // An operator's operation on the model holds it until its decision
        // is written. The claim is taken only once the repository has been
        // read, so that an operator's call rarely meets it.
        let working = self.app.decisions.begin_watching(model);
        let status = registry.status(model);
        if status.as_ref().is_some_and(|s| s.busy) || working.is_none() {
            return; // Come back next pass; nothing is marked seen.
        }
        // A rollout in progress is not cut across: versions published
        // meanwhile are taken up once it ends.
        if status.as_ref().and_then(|s| s.rollout.as_ref()).is_some_and(|r| r.phase.in_progress()) {
            return;
        }
        let serving = status.as_ref().and_then(|s| s.serving);
        if serving.is_some() {
            self.app.find(|f| f.cannot_serve.remove(model));
        } else if versions.is_empty() {
            let why = format!("model '{model}' has no complete version (a version directory needs its MANIFEST)");
            self.app.find(|f| f.cannot_serve.insert(model.to_owned(), CannotServe::no_version(why)));
        }
        let fresh: Vec<u64> = fresh
            .into_iter()
            .map(|(v, mtime)| {
                self.seen.insert((model.to_owned(), v), mtime);
                v
            })
            .collect();
        match serving {
            None if !fresh.is_empty() => self.start_model(model, &versions),
            Some(current) => {
                if let Some(&newest) = fresh.iter().max().filter(|v| **v > current) {
                    if let Some(decision) = self.in_force(model, versions.last().copied()) {
                        tracing::info!(
                            model,
                            version = newest,
                            decision = decision.kind.as_str(),
                            serving = current,
                            "A new version appeared in the repository; the operator's decision holds, so it is not loaded."
                        );
                    } else {
                        self.take_up(model, newest);
                    }
                }
                self.retire_removed(model, &versions, current);
            }
            None => {}
        }
    }

    /// Takes up a new version of a serving model: a rollout when its
    /// `model.toml` asks for one (`[rollout] auto`), else a load.
    fn take_up(&mut self, model: &str, newest: u64) {
        let registry = &self.app.registry;
        let auto = registry.source().spec(model).is_ok_and(|s| s.rollout.auto);
        // A stable version that lost its worker answers nothing to compare
        // with: the new version is loaded instead of rolled out.
        let stable_ended = registry.snapshot().model(model).is_some_and(|route| !route.stable.alive());
        if auto && stable_ended {
            tracing::warn!(
                model,
                version = newest,
                "A new version appeared while the stable version has no worker; loading it rather than rolling it out."
            );
        }
        let started = if auto && !stable_ended {
            tracing::info!(model, version = newest, "A new version appeared in the repository; rolling it out.");
            let start = RolloutStart { version: Some(newest), ..RolloutStart::default() };
            registry.start_rollout(model, start)
        } else {
            tracing::info!(model, version = newest, "A new version appeared in the repository; loading it.");
            registry.load(model, Some(newest))
        };
        match started {
            Err(error) => self.forget(model, newest, &error),
            // A version tried again after a failure of the moment: its
            // outcome decides whether it is tried again once more.
            Ok(handle) if self.retry.contains_key(model) => match handle.wait() {
                Ok(_) => self.retry_done(model),
                Err(error @ LoadError::InProgress { .. }) => self.forget(model, newest, &error),
                Err(error) if !refuses_the_files(&error) => {
                    self.retry_later(model, &[newest], &error);
                }
                Err(_) => self.retry_done(model),
            },
            Ok(_) => {}
        }
    }

    /// Takes a rollout recorded in the state file up where it was, once its
    /// stable version serves. One that cannot be (its candidate is gone or
    /// refused) leaves the stable version serving all, held until a version
    /// newer than the candidate is published.
    fn resume_rollout(&mut self, model: &str, decision: &Decision) {
        let (Some(record), Some(stable)) = (decision.rollout.as_deref().cloned(), decision.version) else { return };
        let candidate = record.candidate;
        tracing::info!(model, stable, candidate, step = record.step, "Taking up the rollout the state file records.");
        let start = RolloutStart {
            version: Some(candidate),
            plan: Some(record.plan),
            step: record.step,
            paused: record.paused,
            restored: true,
            ..RolloutStart::default()
        };
        if let Err(error) = self.app.registry.start_rollout(model, start).and_then(|h| h.wait()) {
            let reason = format!("the rollout of version {candidate} could not be taken up: {error}");
            tracing::warn!(model, candidate, %reason, "Version {stable} serves all traffic.");
            let held = Decision {
                kind: Kind::Load,
                version: Some(stable),
                at: now(),
                yields_to: Some(candidate),
                rollout: None,
            };
            self.change(model, Change::Recorded(held));
        }
    }

    /// The decision in force for `model` in a repository whose newest
    /// version is `newest`; one that a newer version supersedes is removed
    /// (the file, an event and the log say so) and none is in force.
    fn in_force(&self, model: &str, newest: Option<u64>) -> Option<Decision> {
        let decision = self.app.decisions.get(model)?;
        match newest.filter(|_| decision.superseded_by(newest)) {
            None => Some(decision),
            Some(newest) => {
                self.change(model, Change::Superseded { newest });
                None
            }
        }
    }

    /// Applies a change to a decision; a failed write is logged where it
    /// fails, and the change holds for this process's life.
    fn change(&self, model: &str, change: Change) {
        let _ = self.app.decisions.apply(&self.app.registry, model, change);
    }

    /// Brings a model that does not serve into service as the operator
    /// last chose, or with its newest good version.
    fn start_model(&mut self, model: &str, versions: &[u64]) {
        let decision = match self.in_force(model, versions.last().copied()) {
            None => return self.load_newest_good(model, versions),
            Some(Decision { kind: Kind::Unload, yields_to, .. }) => {
                tracing::info!(
                    model,
                    yields_to,
                    "The model stays unloaded, as the operator chose, until a newer version is published."
                );
                return;
            }
            Some(decision) => decision,
        };
        let (kind, version) = (decision.kind, decision.version.unwrap_or_default());
        let reason = if versions.contains(&version) {
            tracing::info!(model, version, decision = kind.as_str(), "Loading the version the operator chose.");
            match self.app.registry.load(model, Some(version)).and_then(|h| h.wait()) {
                Ok(_) if kind == Kind::Rollout => return self.resume_rollout(model, &decision),
                Ok(_) => return self.retry_done(model),
                Err(error @ LoadError::InProgress { .. }) => return self.forget(model, version, &error),
                // A store that did not answer does not drop the operator's choice.
                Err(error) if !refuses_the_files(&error) => {
                    let wait = self.retry_later(model, &[version], &error);
                    return self.excuse_if_due(model, wait, &error);
                }
                Err(error) => format!("version {version} was refused: {error}"),
            }
        } else {
            format!("version {version} is not in the repository")
        };
        tracing::warn!(model, version, %reason, "The operator's choice cannot be restored; loading the newest version.");
        self.change(model, Change::Dropped { reason });
        self.load_newest_good(model, versions);
    }

    /// Loads the newest version, then older ones, until one is accepted;
    /// records the model as one that cannot serve when every version's
    /// files were refused. An invalid `model.toml` ends the attempts: every
    /// version is read with it. A version that fails for a reason of the
    /// moment (see [`refuses_the_files`]) is tried again after a wait,
    /// while an older one serves meanwhile if one can; a model left with
    /// nothing serving is excused from readiness only after a few tries
    /// ([`EXCUSE_AFTER`]), or at once when the server does not poll.
    fn load_newest_good(&mut self, model: &str, versions: &[u64]) {
        let mut why = None;
        // Versions that failed for a reason of the moment, newest first,
        // and the first such failure: tried again later, while an older
        // version serves meanwhile if one can.
        let mut passing: Vec<u64> = Vec::new();
        let mut passing_error = None;
        for &version in versions.iter().rev() {
            tracing::info!(model, version, "Loading the model from the repository.");
            match self.app.registry.load(model, Some(version)).and_then(|h| h.wait()) {
                Ok(_) => {
                    self.app.find(|f| f.cannot_serve.remove(model));
                    match passing_error {
                        Some(error) => {
                            self.retry_later(model, &passing, &error);
                        }
                        None => self.retry_done(model),
                    }
                    return;
                }
                Err(error @ LoadError::InProgress { .. }) => {
                    for tried in &passing {
                        self.seen.remove(&(model.to_owned(), *tried));
                    }
                    return self.forget(model, version, &error);
                }
                Err(error) if !refuses_the_files(&error) => {
                    // A store or file system that does not answer fails
                    // every version alike: walking on would only wait on
                    // it once more per version.
                    let whole_source = reaches_the_whole_source(&error);
                    if !whole_source {
                        tracing::warn!(
                            model,
                            version,
                            %error,
                            "The version could not be loaded for a reason that may pass; trying the one before it meanwhile."
                        );
                    }
                    passing.push(version);
                    passing_error.get_or_insert(error);
                    if whole_source {
                        break;
                    }
                }
                Err(error @ LoadError::Config(_)) => {
                    // Read as valid by this pass's check, yet refused: a
                    // save in progress. The next valid read tries again.
                    self.broken_spec.insert(model.to_owned());
                    why = Some(CannotServe::refused(&error));
                    break;
                }
                Err(error) => {
                    tracing::warn!(model, version, %error, "The version was refused; trying the one before it.");
                    why = Some(CannotServe::refused(&error));
                }
            }
        }
        if let Some(error) = passing_error {
            let wait = self.retry_later(model, &passing, &error);
            return self.excuse_if_due(model, wait, &error);
        }
        self.retry_done(model);
        if let Some(why) = why {
            tracing::warn!(model, why = %why.message, "No version of the model could be loaded; it does not serve.");
            self.app.find(|f| f.cannot_serve.insert(model.to_owned(), why));
        }
    }

    /// For a model that serves nothing after a failure of the moment:
    /// readiness waits for it through its first tries, then excuses it
    /// while the tries go on; a server that does not poll never tries
    /// again, so it excuses it at once.
    fn excuse_if_due(&mut self, model: &str, wait: Duration, error: &LoadError) {
        if self.polls && wait < EXCUSE_AFTER {
            self.app.find(|f| f.cannot_serve.remove(model));
            return;
        }
        let mut why = CannotServe::refused(error);
        why.message = match self.polls {
            true => format!("{}; tried again every {} s at most", why.message, MAX_RETRY.as_secs()),
            false => format!("{}; the server does not poll: `baton load {model}` tries again", why.message),
        };
        tracing::warn!(model, why = %why.message, "The model does not serve yet; readiness no longer waits for it.");
        self.app.find(|f| f.cannot_serve.insert(model.to_owned(), why));
    }

    /// After a load failure of the moment: makes the versions tried look
    /// unseen and has the model tried again after a wait that doubles
    /// with each failure in a row, which it returns.
    fn retry_later(&mut self, model: &str, tried: &[u64], error: &LoadError) -> Duration {
        for version in tried {
            self.seen.remove(&(model.to_owned(), *version));
        }
        let wait = self.retry.get(model).map_or(FIRST_RETRY, |r| (r.wait * 2).min(MAX_RETRY));
        self.retry.insert(model.to_owned(), Retry { due: Instant::now() + wait, wait });
        tracing::warn!(
            model,
            %error,
            kind = error.kind(),
            retry_in_ms = wait.as_millis() as u64,
            "The model could not be loaded for a reason that may pass; it will be tried again."
        );
        wait
    }

    /// Ends the waits of a model whose load no longer fails for a reason
    /// of the moment.
    fn retry_done(&mut self, model: &str) {
        self.retry.remove(model);
    }

    /// Notes whether the model's `model.toml` parses. One that stops
    /// parsing is logged once, with how a fix is taken up; one that parses
    /// again makes the versions it kept from loading look unseen, so that
    /// this pass tries them again.
    fn check_spec(&mut self, model: &str) {
        match self.app.registry.source().spec(model) {
            Err(FetchError::Spec(error)) if self.broken_spec.insert(model.to_owned()) => {
                let next = if self.polls {
                    "Nothing of it loads until the file is fixed; the fix is taken up on the next poll.".to_owned()
                } else {
                    format!("Nothing of it loads until the file is fixed; then run `baton load {model}`.")
                };
                tracing::warn!(model, %error, "The model's model.toml is invalid. {next}");
            }
            Ok(_) if self.broken_spec.remove(model) => {
                let serving = self.app.registry.status(model).and_then(|s| s.serving);
                tracing::info!(model, "The model's model.toml is valid again; loading what it kept from loading.");
                self.seen.retain(|(m, v), _| m != model || serving.is_some_and(|c| *v <= c));
            }
            _ => {}
        }
    }

    /// Reports version directories without a MANIFEST: once each (log,
    /// event), and in the model's status while they last. One is reported
    /// once found so [`UNPACKAGED_POLLS`] polls in a row (or at the only
    /// pass, when not polling) with nothing in it changed for
    /// [`UNPACKAGED_QUIET`]: a version being copied in and packaged is not.
    fn note_unpackaged(&mut self, model: &str) {
        let found = self.app.registry.source().unpackaged(model);
        let known = self.app.findings(|f| f.unpackaged.get(model).cloned().unwrap_or_default());
        self.bare_polls.retain(|(m, v), _| m != model || found.iter().any(|b| b.version == *v));
        let now = SystemTime::now();
        let found: Vec<BareVersion> = found
            .into_iter()
            .filter(|bare| {
                let polls = self.bare_polls.entry((model.to_owned(), bare.version)).or_insert(0);
                *polls = polls.saturating_add(1);
                let quiet = bare.changed.is_none_or(|c| now.duration_since(c).unwrap_or_default() >= UNPACKAGED_QUIET);
                known.contains_key(&bare.version) || ((*polls >= UNPACKAGED_POLLS || !self.polls) && quiet)
            })
            .collect();
        if found.iter().map(|b| &b.version).eq(known.keys()) {
            return;
        }
        let mut now = BTreeMap::new();
        let mut new = Vec::new();
        for BareVersion { version, dir, .. } in found {
            if let Some(old) = known.get(&version) {
                now.insert(version, old.clone());
                continue;
            }
            let message = format!(
                "Version directory {dir} has no MANIFEST, so it is not loaded; \
                 run `baton package {dir}` once its files are complete."
            );
            new.push((version, dir.clone(), message.clone()));
            now.insert(version, Unpackaged { dir, message });
        }
        // The status says it before the log and the events do.
        self.app.find(|f| {
            if now.is_empty() {
                f.unpackaged.remove(model);
            } else {
                f.unpackaged.insert(model.to_owned(), now);
            }
        });
        for (version, dir, message) in new {
            tracing::warn!(model, version, "{message}");
            self.app.registry.announce(model, Some(version), EventKind::Unpackaged { dir, message });
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
        let source = Arc::clone(self.app.registry.source());
        for kept in route.previous.iter().map(|v| v.number()) {
            let subject = Subject::Version(model.to_owned(), kept);
            if versions.contains(&kept) {
                self.present(&subject);
            } else if self.judge(&subject, source.presence(model, Some(kept))) == Verdict::Gone {
                tracing::info!(model, version = kept, "A kept version left the repository; retiring it.");
                let _ = self.app.registry.retire(model, kept);
            }
        }
        if versions.contains(&current) {
            return;
        }
        let subject = Subject::Version(model.to_owned(), current);
        match source.presence(model, Some(current)) {
            Presence::Missing => {
                self.can_read(&subject);
                if self.warned.insert((model.to_owned(), current)) {
                    tracing::warn!(
                        model,
                        version = current,
                        "The serving version left the repository; it keeps serving until another version replaces it."
                    );
                }
            }
            Presence::Present => self.can_read(&subject),
            Presence::Unreadable(error) => self.cannot_read(subject, error),
        }
    }

    /// Counts a model or kept version absent from its listing: gone once
    /// the source has said it is missing `missing_polls` polls in a row.
    fn judge(&mut self, subject: &Subject, presence: Presence) -> Verdict {
        match presence {
            Presence::Missing => {
                self.can_read(subject);
                let polls = self.missing.entry(subject.clone()).or_insert(0);
                *polls += 1;
                let polls = *polls;
                if polls >= self.missing_polls {
                    self.missing.remove(subject);
                    return Verdict::Gone;
                }
                tracing::debug!(
                    what = %subject,
                    polls,
                    needed = self.missing_polls,
                    "Missing from the repository; waiting for more polls before acting on it."
                );
                Verdict::Keep
            }
            Presence::Present => {
                self.present(subject);
                Verdict::Keep
            }
            Presence::Unreadable(error) => {
                // A failed read breaks a run of polls that found it missing.
                self.missing.remove(subject);
                self.cannot_read(subject.clone(), error);
                Verdict::Keep
            }
        }
    }

    /// Something found in its listing: it is readable, and not missing.
    fn present(&mut self, subject: &Subject) {
        self.missing.remove(subject);
        self.can_read(subject);
    }

    /// Logs once, when `subject` starts failing to read.
    fn cannot_read(&mut self, subject: Subject, error: String) {
        if let std::collections::btree_map::Entry::Vacant(entry) = self.unreadable.entry(subject) {
            tracing::warn!(
                what = %entry.key(),
                %error,
                "The repository cannot be read; nothing is loaded, unloaded or retired for it until it can."
            );
            entry.insert(error);
        }
    }

    /// Logs once, when `subject` can be read again.
    fn can_read(&mut self, subject: &Subject) {
        if let Some(error) = self.unreadable.remove(subject) {
            tracing::info!(what = %subject, was = %error, "The repository can be read again.");
        }
    }

    /// Drops the counts and marks of what no longer matters: models neither
    /// listed nor served, versions no longer loaded.
    fn forget_unserved(&mut self, listed: &[String]) {
        let snapshot = self.app.registry.snapshot();
        let relevant = |subject: &Subject| match subject {
            Subject::Repository => true,
            Subject::Model(model) => snapshot.model(model).is_some(),
            Subject::Versions(model) => listed.contains(model),
            Subject::Version(model, version) => {
                snapshot.model(model).is_some_and(|route| route.versions().any(|v| v.number() == *version))
            }
        };
        self.missing.retain(|subject, _| relevant(subject));
        self.unreadable.retain(|subject, _| relevant(subject));
    }
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
