//! Who coordinates a rollout whose coordinator is gone.
//!
//! A replica that may coordinate watches the coordinator keys beside the
//! records. When a rollout is in progress and nobody holds its key (it
//! was never taken, or its holder's lease ran out), the replica campaigns
//! once, after a random delay of up to [`SPREAD`] so that a fleet does
//! not campaign all at once, with one create-if-absent transaction. One
//! replica wins; the others wait for the key's next deletion, which their
//! watch delivers. Nothing polls.
//!
//! A key this replica holds under its lease (kept through a reconnect, or
//! handed over by the process an upgrade replaced) is taken over rather
//! than campaigned for: nobody else campaigns while it exists. A takeover
//! the store refuses is tried again after [`AFTER_FAILURE`], for as long
//! as the key is there, so that the rollout does not stall without a
//! coordinator.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::threads::sync::Lock;

use super::Participant;
use crate::coordinator::{self, Tenure};
use crate::node::Node;
use crate::store::{Kv, Store};

/// Campaigns for an orphaned rollout spread over this long.
const SPREAD: Duration = Duration::from_millis(300);
/// How long a replica whose coordination failed waits before it
/// campaigns again.
const AFTER_FAILURE: Duration = Duration::from_secs(1);

#[derive(Default)]
struct State {
    /// The coordinator keys there are: model → (created at, lease).
    holders: BTreeMap<String, (i64, i64)>,
    /// Models with a rollout in progress.
    in_progress: BTreeSet<String>,
    /// Orphaned rollouts, and when this replica campaigns for each.
    due: BTreeMap<String, Instant>,
    /// Rollouts this replica coordinates.
    coordinating: BTreeMap<String, tokio::task::AbortHandle>,
    /// When the keys this replica holds are taken over again, after a
    /// takeover failed.
    resume_at: Option<Instant>,
}

impl State {
    fn orphan(&self, model: &str) -> bool {
        self.in_progress.contains(model) && !self.holders.contains_key(model) && !self.coordinating.contains_key(model)
    }

    /// Schedules a campaign for `model` if it is orphaned, else cancels one.
    fn schedule(&mut self, model: &str, after: Duration) {
        if !self.orphan(model) {
            self.due.remove(model);
        } else if !self.due.contains_key(model) {
            let spread = SPREAD.mul_f64(f64::from(baton_core::rollout::assign::random_bucket()) / 10_000.0);
            self.due.insert(model.to_owned(), Instant::now() + after + spread);
        }
    }
}

/// One replica's part in choosing coordinators.
#[derive(Default)]
pub(crate) struct Election {
    state: Lock<State>,
}

impl Election {
    /// A rollout record of `model` was read: in progress or not.
    pub fn observe_record(&self, model: &str, in_progress: bool) {
        let mut state = self.state.lock();
        if in_progress {
            state.in_progress.insert(model.to_owned());
        } else {
            state.in_progress.remove(model);
        }
        state.schedule(model, Duration::ZERO);
    }

    /// The coordinator key of `model` was written (created at, lease) or
    /// deleted.
    pub fn observe_key(&self, model: &str, holder: Option<(i64, i64)>) {
        let mut state = self.state.lock();
        match holder {
            Some(holder) => state.holders.insert(model.to_owned(), holder),
            None => state.holders.remove(model),
        };
        state.schedule(model, Duration::ZERO);
    }

    /// Takes the coordinator keys read at a resync.
    pub fn reset(&self, keys: Vec<Kv>) {
        let mut state = self.state.lock();
        state.holders =
            keys.into_iter().map(|kv| (crate::keys::Keys::last(&kv.key).to_owned(), (kv.created, kv.lease))).collect();
        // A resync takes the held keys over afresh.
        state.resume_at = None;
        let models: Vec<String> = state.in_progress.iter().cloned().collect();
        for model in models {
            state.schedule(&model, Duration::ZERO);
        }
    }

    /// When the next campaign (or takeover tried again) is due; far away
    /// when none is.
    pub fn next_due(&self) -> Instant {
        let state = self.state.lock();
        let next = state.due.values().copied().chain(state.resume_at).min();
        next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
    }

    /// Takes over again the keys this replica holds, when a takeover
    /// failed and its time has come; campaigns for every orphaned rollout
    /// whose time has come, and coordinates those it wins.
    pub async fn campaign_due<N: Node>(&self, participant: &Arc<Participant<N>>, store: &Store, lease: i64) {
        let now = Instant::now();
        let resume = {
            let mut state = self.state.lock();
            let due = state.resume_at.is_some_and(|at| at <= now);
            if due {
                state.resume_at = None;
            }
            due
        };
        if resume {
            self.resume_held(participant, store, lease).await;
        }
        let due: Vec<String> = {
            let mut state = self.state.lock();
            let due: Vec<String> = state.due.iter().filter(|(_, at)| **at <= now).map(|(m, _)| m.clone()).collect();
            for model in &due {
                state.due.remove(model);
            }
            due.into_iter().filter(|m| state.orphan(m)).collect()
        };
        for model in due {
            match coordinator::campaign(store, &model, &participant.config.id, lease).await {
                Ok(Some(tenure)) => {
                    tracing::info!(model = %model, replica = %participant.config.id, "Coordinating a fleet rollout whose coordinator is gone.");
                    self.spawn(participant, store, &model, tenure);
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(model = %model, %error, "Could not campaign to coordinate.");
                    self.state.lock().schedule(&model, AFTER_FAILURE);
                }
            }
        }
    }

    /// Coordinates again the rollouts whose keys this replica holds under
    /// `lease` (kept alive across a reconnect, or handed over by the
    /// process this one replaced), each under a new epoch: the key is
    /// taken over first, so that a write of the earlier holder is refused.
    /// A takeover that fails is tried again after [`AFTER_FAILURE`].
    pub async fn resume_held<N: Node>(&self, participant: &Arc<Participant<N>>, store: &Store, lease: i64) {
        let held: Vec<(String, i64)> = {
            let state = self.state.lock();
            state
                .holders
                .iter()
                .filter(|(m, (_, l))| *l == lease && !state.coordinating.contains_key(*m))
                .map(|(m, (created, _))| (m.clone(), *created))
                .collect()
        };
        for (model, created) in held {
            match coordinator::take_over(store, &model, &participant.config.id, lease, created).await {
                Ok(Some(tenure)) => {
                    tracing::info!(model = %model, replica = %participant.config.id, epoch = tenure.revision, "Coordinating again a fleet rollout whose key this replica kept.");
                    self.spawn(participant, store, &model, tenure);
                }
                Ok(None) => tracing::debug!(model = %model, "The coordinator key this replica kept is gone."),
                Err(error) => {
                    tracing::warn!(
                        model = %model,
                        %error,
                        retry_ms = AFTER_FAILURE.as_millis() as u64,
                        "Could not take over the coordinator key this replica kept; trying again."
                    );
                    let mut state = self.state.lock();
                    state.resume_at.get_or_insert(Instant::now() + AFTER_FAILURE);
                }
            }
        }
    }

    /// Stops every rollout this replica coordinates (its session ended).
    pub fn stop_all(&self) {
        for (_, task) in std::mem::take(&mut self.state.lock().coordinating) {
            task.abort();
        }
    }

    fn spawn<N: Node>(&self, participant: &Arc<Participant<N>>, store: &Store, model: &str, tenure: Tenure) {
        let this = Arc::clone(participant);
        let (store, coordinated) = (store.clone(), model.to_owned());
        // Held while spawning, so the task cannot remove its entry before
        // it is there.
        let mut state = self.state.lock();
        let task = tokio::spawn(async move {
            let model = coordinated;
            let me = this.config.id.clone();
            let result = coordinator::coordinate(&store, &model, &me, tenure, &this.health).await;
            coordinator::resign(&store, &model, tenure).await;
            let mut state = this.election.state.lock();
            state.coordinating.remove(&model);
            if let Err(error) = result {
                tracing::warn!(model = %model, %error, "Stopped coordinating a fleet rollout.");
                state.schedule(&model, AFTER_FAILURE);
            }
        });
        state.coordinating.insert(model.to_owned(), task.abort_handle());
        state.due.remove(model);
    }
}
