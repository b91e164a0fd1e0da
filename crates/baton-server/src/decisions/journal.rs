//! Keeps what each rollout has reached in the state file.
//!
//! - While a rollout runs or is paused, the file holds a `rollout` decision:
//!   the stable version, the candidate, the plan, the step reached and why
//!   it is paused. A restart loads the stable version, then takes the
//!   rollout up at that step, paused if it was: a candidate never silently
//!   becomes a full swap.
//! - When it ends, the decision becomes what any operation leaves: a
//!   candidate promoted to the newest version returns the model to the
//!   normal choice; a candidate rolled back or aborted leaves the stable
//!   version held until a version newer than the candidate is published.
//!
//! Operators' operations write it before they answer; the controller's own
//! decisions are written as their events arrive ([`follow`]).

use std::sync::Arc;

use baton_core::registry::events::EventKind;
use baton_core::rollout::control::Phase;

use super::{Change, Decision, Kind, RolloutRecord, StateError, now};
use crate::app::App;
use crate::error::{Class, ServeError};
use crate::serving::blocking;

/// Writes `model`'s rollout, as it stands now, to the state file.
pub async fn record(app: &Arc<App>, model: &str) -> Result<(), ServeError> {
    let (shared, name) = (Arc::clone(app), model.to_owned());
    blocking(move || record_now(&shared, &name)).await.map_err(|e| {
        ServeError::new(
            Class::Internal,
            "state_write_failed",
            format!("the rollout's state could not be written to the state file ({e}); a restart would not keep it"),
        )
    })
}

/// [`record`], on the calling thread (blocking).
pub fn record_now(app: &App, model: &str) -> Result<(), StateError> {
    let Some(rollout) = app.registry.rollout(model) else { return Ok(()) };
    // What serves once the ending's store is made, which may not have
    // happened yet when its decision's event arrives.
    let serving = match rollout.phase {
        Phase::Promoted | Phase::Watching => Some(rollout.candidate),
        _ => Some(rollout.stable),
    };
    let change = match rollout.phase {
        Phase::Running | Phase::Paused => Change::Recorded(Decision {
            kind: Kind::Rollout,
            version: Some(rollout.stable),
            at: now(),
            yields_to: None,
            rollout: Some(Box::new(RolloutRecord {
                candidate: rollout.candidate,
                plan: rollout.plan.clone(),
                step: rollout.step,
                paused: rollout.paused.clone(),
            })),
        }),
        // A restart during the watch after promotion keeps the promoted
        // version, and does not watch again: the version it replaced is
        // not loaded any more to go back to.
        Phase::Promoted | Phase::Watching | Phase::RolledBack | Phase::Aborted => {
            // A decision an operator made after the rollout ended (a pin,
            // a load) is not this rollout's to change.
            let ended_s = rollout.decisions.last().map_or(0, |d| d.at_ms / 1000);
            if app.decisions.get(model).is_some_and(|d| d.kind != Kind::Rollout && d.at >= ended_s) {
                return Ok(());
            }
            let newest = app.registry.source().versions(model).ok().and_then(|v| v.last().copied());
            let newest = newest.max(Some(rollout.candidate));
            match (serving, newest) {
                (Some(v), Some(newest)) if v < newest => Change::Recorded(Decision {
                    kind: Kind::Load,
                    version: Some(v),
                    at: now(),
                    yields_to: Some(newest),
                    rollout: None,
                }),
                _ => Change::Removed,
            }
        }
    };
    app.decisions.apply(&app.registry, model, change)
}

/// Writes each rollout decision the controller makes as its event
/// arrives (the file is written on the blocking pool), until the events
/// end. A burst that overflows the event buffer is caught up by writing
/// every rollout in progress.
pub async fn follow(app: Arc<App>, mut events: baton_core::registry::events::EventReceiver) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let models: Vec<String> = match events.recv().await {
            Ok(event) if matches!(event.kind, EventKind::Rollout { .. }) => vec![event.model],
            Ok(_) => continue,
            // Caught up on the rollouts in progress. One that ended among
            // the missed events keeps its last record: a restart takes it
            // up again, and its guards judge it anew.
            Err(RecvError::Lagged(_)) => app
                .registry
                .statuses()
                .into_iter()
                .filter(|s| s.rollout.as_ref().is_some_and(|r| r.phase.in_progress()))
                .map(|s| s.name)
                .collect(),
            Err(RecvError::Closed) => return,
        };
        let shared = Arc::clone(&app);
        blocking(move || {
            for model in models {
                let _ = record_now(&shared, &model);
            }
        })
        .await;
    }
}
