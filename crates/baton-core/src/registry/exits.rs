//! Versions whose engine ended by itself: a worker process that was
//! killed, aborted or ran out of memory. Its requests fail at once (the
//! engine says it is no longer alive), and the model is not ready. A
//! thread at serving priority, one per model at a time, then acts on the
//! role the version played:
//!
//! - the stable version, with a kept previous version alive: a rollback,
//!   one pointer store, as an operator's;
//! - the stable version without one: the same version loaded again through
//!   the whole transaction, with backoff between failed attempts
//!   (0.5 s, doubling up to 30 s, eight attempts), until it serves;
//! - a kept previous version: retired;
//! - a rollout's candidate: the rollout is aborted;
//! - a rollout's twin of the stable version: the twin leaves the route
//!   (the stable version runs the paired copies from then on), and the
//!   rollout goes on;
//! - the stable version while a rollout runs: the rollout ends first
//!   (aborted; during the watch after a promotion, rolled back to the
//!   version the promotion replaced), then the version is acted on in the
//!   role it has after that (loaded again, say);
//! - a version not in the route yet, whose load is still running: acted on
//!   once the load is over, in the role it has then (a load whose version
//!   ended before its commit fails instead, and publishes nothing).
//!
//! An `exited` event says what happened and what was done. Models are
//! acted on apart: one model's restarts, backing off for up to a minute,
//! hold up no other model's.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use super::{Ending, Inner, Job, Registry};
use crate::registry::error::LoadError;
use crate::registry::events::EventKind;
use crate::rollout::control::{By, Phase, TwinStatus};
use crate::run::version::Version;

/// How long to wait before trying again when another operation holds the model.
const BUSY_RETRY: Duration = Duration::from_millis(100);

/// The first pause before a failed restart is tried again; it doubles.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// The longest pause between restarts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Attempts to load an exited stable version again before giving up.
const RESTARTS: u32 = 8;

/// A version whose engine ended by itself.
pub(crate) struct Exit {
    pub(crate) model: String,
    pub(crate) number: u64,
    pub(crate) version: Weak<Version>,
    pub(crate) why: String,
}

/// Starts the thread that takes exits; versions built from now on report
/// theirs to it. It hands each to a thread of its own (which inherits its
/// serving priority); exits of one model are acted on one at a time.
pub(super) fn start(inner: &Arc<Inner>, jobs: crate::threads::sync::Sender<Job>) {
    let (tx, rx) = mpsc::channel::<Exit>();
    if inner.exits.set(tx).is_err() {
        return;
    }
    let weak = Arc::downgrade(inner);
    let started = std::thread::Builder::new().name("baton-exits".into()).spawn(move || {
        let mut turns: HashMap<String, Arc<Mutex<()>>> = HashMap::new();
        for exit in rx {
            let Some(inner) = weak.upgrade() else { break };
            let registry = Registry { inner, jobs: jobs.clone() };
            let turn = Arc::clone(turns.entry(exit.model.clone()).or_default());
            let acted = std::thread::Builder::new().name("baton-exit".into()).spawn(move || {
                let _turn = turn.lock().unwrap_or_else(PoisonError::into_inner);
                registry.act_on_exit(&exit);
            });
            if let Err(error) = acted {
                tracing::error!(%error, "Could not start a thread to act on a worker's exit.");
            }
        }
    });
    if let Err(error) = started {
        tracing::error!(%error, "Could not start the thread that acts on worker exits.");
    }
}

/// Asks `version` to report its engine's exit.
pub(crate) fn watch(inner: &Inner, version: &Arc<Version>) {
    let Some(exits) = inner.exits.get() else { return };
    let (exits, weak) = (exits.clone(), Arc::downgrade(version));
    let (model, number) = (version.model().to_owned(), version.number());
    version.on_exit(Box::new(move |why| {
        let _ = exits.send(Exit { model, number, version: weak, why });
    }));
}

/// What an exited version is to be acted on as: its `R`ole, or nothing
/// yet while an operation on its model runs (a load that may still publish
/// it), or nothing at all.
#[derive(Debug, PartialEq, Eq)]
enum Part<R> {
    Role(R),
    Wait,
    None,
}

/// The part of a version, from whether an operation on its model runs
/// (`busy`) and its role in the route (`role`). Whether an operation runs
/// is read first: a load that publishes the version and ends between the
/// two reads is then still seen running, and the version looked at again,
/// rather than left published, ended, with nothing done.
fn part<R>(busy: impl FnOnce() -> bool, role: impl FnOnce() -> Option<R>) -> Part<R> {
    let busy = busy();
    match role() {
        Some(role) => Part::Role(role),
        None if busy => Part::Wait,
        None => Part::None,
    }
}

/// The part a version plays in its model's route.
enum Role {
    Stable { previous_alive: bool, rollout: bool },
    Previous,
    Candidate,
    Twin,
}

impl Registry {
    fn act_on_exit(&self, exit: &Exit) {
        let (model, number) = (exit.model.as_str(), exit.number);
        let Some(version) = exit.version.upgrade() else { return };
        tracing::warn!(model, version = number, reason = %exit.why, "A version's worker process ended by itself.");
        self.count_worker(model, |c| c.exits += 1);
        let action = self.act(model, &version, &exit.why);
        drop(version);
        tracing::info!(model, version = number, action, "The server acted on the worker's exit.");
        self.inner.emit(model, Some(number), EventKind::Exited { reason: exit.why.clone(), action: action.into() });
    }

    /// Acts on the exit of `version`, which ended for `why`; says what was
    /// done.
    fn act(&self, model: &str, version: &Arc<Version>, why: &str) -> &'static str {
        let mut restarts = 0;
        let mut backoff = FIRST_BACKOFF;
        // What ending a rollout did, when the exited version then has no
        // part left to act on.
        let mut ended = None;
        loop {
            let role = match part(|| self.busy(model), || self.role(model, version)) {
                Part::Role(role) => role,
                // A version whose load has not published it yet: acted on
                // once the load is over (its commit refuses a version whose
                // engine ended, and then this one has no part).
                Part::Wait => {
                    std::thread::sleep(BUSY_RETRY);
                    continue;
                }
                Part::None => return ended.unwrap_or("none"),
            };
            // `again`: the action changes the version's role, which is
            // then acted on in turn.
            let (action, again, result) = match role {
                // A rollout leans on its stable version, and no version
                // loads while one runs: it ends first. In the watch after a
                // promotion, that goes back to the version replaced, which
                // serves at once; before, the candidate leaves (it has not
                // passed its guards: a crash is no reason to promote it).
                Role::Stable { rollout: true, .. } => {
                    let watching = self.inner.rollouts.lock().get(model).is_some_and(|p| p.phase == Phase::Watching);
                    ended = Some(if watching { "rolled_back" } else { "aborted" });
                    ("aborting", true, self.end_rollout(model, Ending::Abort, By::Server).and_then(|h| h.wait()))
                }
                Role::Stable { previous_alive: true, rollout: false } => {
                    ("rolled_back", false, self.rollback(model).and_then(|handle| handle.wait()))
                }
                Role::Stable { .. } => match self.load(model, Some(version.number())) {
                    // Refused before it started: not an attempt.
                    Err(refused @ (LoadError::InProgress { .. } | LoadError::RolloutInProgress { .. })) => {
                        ("restarting", false, Err(refused))
                    }
                    started => {
                        restarts += 1;
                        self.count_worker(model, |c| c.restarts += 1);
                        ("restarting", false, started.and_then(|handle| handle.wait()))
                    }
                },
                Role::Previous => {
                    ("retired", false, self.retire(model, version.number()).and_then(|handle| handle.wait()))
                }
                Role::Candidate => {
                    ("aborted", false, self.end_rollout(model, Ending::Abort, By::Server).and_then(|h| h.wait()))
                }
                Role::Twin => {
                    self.end_twin(model, version, why);
                    return "twin_ended";
                }
            };
            match result {
                Ok(_) if again => {}
                Ok(_) => return action,
                // Another operation holds the model, or a rollout started
                // meanwhile (ended on the next turn): not a failed attempt.
                Err(LoadError::InProgress { .. } | LoadError::RolloutInProgress { .. }) => {
                    std::thread::sleep(BUSY_RETRY);
                }
                Err(error) if action == "restarting" => {
                    tracing::warn!(model, attempt = restarts, %error, "Loading an exited version again failed.");
                    if restarts >= RESTARTS {
                        return "gave_up";
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(error) => {
                    tracing::warn!(model, action, %error, "Acting on a worker's exit failed; trying again.");
                    std::thread::sleep(BUSY_RETRY);
                }
            }
        }
    }

    /// Takes a rollout's twin whose engine ended out of the route, by one
    /// store: the stable version runs the paired copies from then on, as
    /// in a rollout without a twin. Status says why the twin is gone.
    fn end_twin(&self, model: &str, twin: &Arc<Version>, why: &str) {
        self.inner.publish(|models| {
            let rollout = models.get_mut(model).and_then(|route| route.rollout.as_mut());
            if let Some(rollout) = rollout.filter(|r| r.twin.as_ref().is_some_and(|t| Arc::ptr_eq(t, twin))) {
                rollout.twin = None;
            }
        });
        if let Some(progress) = self.inner.rollouts.lock().get_mut(model) {
            let reason = format!("the twin ended ({why}); the stable version runs the paired copies");
            progress.twin = TwinStatus { loaded: false, bytes_held: None, reason: Some(reason) };
        }
    }

    /// Whether an operation on `model` is running.
    fn busy(&self, model: &str) -> bool {
        self.inner.models.lock().get(model).is_some_and(|entry| entry.busy)
    }

    /// Counts in `model`'s worker counts for its status.
    fn count_worker(&self, model: &str, count: impl FnOnce(&mut super::WorkerCounts)) {
        count(&mut self.inner.models.lock().entry(model.to_owned()).or_default().workers);
    }

    fn role(&self, model: &str, version: &Arc<Version>) -> Option<Role> {
        let snapshot = self.snapshot();
        let route = snapshot.model(model)?;
        if Arc::ptr_eq(&route.stable, version) {
            let previous_alive = route.previous.first().is_some_and(|p| p.alive());
            return Some(Role::Stable { previous_alive, rollout: route.rollout.is_some() });
        }
        if route.previous.iter().any(|p| Arc::ptr_eq(p, version)) {
            return Some(Role::Previous);
        }
        let rollout = route.rollout.as_ref()?;
        if Arc::ptr_eq(&rollout.candidate, version) {
            return Some(Role::Candidate);
        }
        rollout.twin.as_ref().filter(|twin| Arc::ptr_eq(twin, version)).map(|_| Role::Twin)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A load that publishes the exited version and ends while its part is
    /// read: the route read before the publish shows no role, and the
    /// model reads as idle after the load ended. The version must then be
    /// looked at again, not left published with nothing done.
    #[test]
    fn a_load_that_publishes_the_version_while_its_part_is_read_is_waited_for() {
        let busy = Cell::new(true);
        let read = || {
            // The route is read before the publish; the load then ends.
            let role: Option<()> = None;
            busy.set(false);
            role
        };
        assert_eq!(part(|| busy.get(), read), Part::Wait);
        assert_eq!(part(|| false, || None::<()>), Part::None);
        assert_eq!(part(|| true, || Some(())), Part::Role(()));
    }
}
