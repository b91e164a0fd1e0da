//! The holds an upgrade puts on the old process from its start until it
//! ends, and the guard that releases them on every path that does not
//! hand over: a failure, an early return, a panic.
//!
//! - **Upgrading**: one upgrade at a time; a second is refused (409).
//! - **Model operations**: load, unload, rollback, pin, retire and a
//!   rollout's operations are refused (409 `upgrade_in_progress`), so
//!   that no operator's decision lands after the new process read the
//!   state file. One that had passed the access check already either
//!   sees the hold when it claims its model, and is refused the same way,
//!   or had claimed it: the upgrade waits until every such operation has
//!   ended (its decision written, its answer on its way) before it reads
//!   anything or starts the new process.
//! - **Rollouts**: no rollout decision is applied here. The registry's
//!   hold is a barrier: it returns once no decision is in flight, and a
//!   decision checks it again before it applies. So once the holds are
//!   taken, what the state file and the registry say stands still, and
//!   the versions kept for rollback are read only then.
//!
//! Both waits count against the upgrade's timeout. When it runs out
//! first, the upgrade is refused (409) and nothing was started; the holds
//! are released once the rollouts' barrier, which cannot be interrupted,
//! has returned (at most the metric source's timeout later).
//!
//! When the new process has taken over, the holds stay for the rest of
//! this process's life: it only drains and exits.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::UpgradeError;
use crate::app::App;

/// How often the wait for operators' operations looks again.
const LOOK_EVERY: Duration = Duration::from_millis(10);

/// Every hold of one upgrade, released on drop unless handed over.
pub(super) struct Holds {
    app: Arc<App>,
    handed_over: bool,
}

impl Holds {
    /// Takes the holds, in this order: upgrading, model operations (and
    /// waits for those already running), rollouts (and waits for the
    /// decision in flight), all before `deadline`, the end of `within`.
    pub async fn take(app: Arc<App>, deadline: Instant, within: Duration) -> Result<Holds, UpgradeError> {
        if app.draining() {
            return Err(UpgradeError::Busy("the server is shutting down"));
        }
        if !app.begin_upgrade() {
            return Err(UpgradeError::Busy("an upgrade is already running"));
        }
        // From here on, dropping the guard undoes what was taken.
        let holds = Holds { app, handed_over: false };
        holds.app.operations_held().store(true, Ordering::SeqCst);
        holds.operations_ended(deadline, within).await?;
        // The barrier blocks, for as long as a rollout decision's reading
        // of its metrics takes: off the async workers.
        let app = Arc::clone(&holds.app);
        let mut barrier = tokio::task::spawn_blocking(move || app.registry.hold_rollouts(true));
        if tokio::time::timeout_at(deadline.into(), &mut barrier).await.is_err() {
            // Released once the barrier has returned, so that the hold it
            // sets is not set again after the release.
            tokio::spawn(async move {
                let _ = barrier.await;
                drop(holds);
            });
            return Err(UpgradeError::Pending {
                within,
                what: "a rollout's decision was still reading its metrics".into(),
            });
        }
        Ok(holds)
    }

    /// Waits until no operator's operation runs (each claims its model
    /// before it acts, and checks the hold once it has), or refuses when
    /// `deadline` passes first.
    async fn operations_ended(&self, deadline: Instant, within: Duration) -> Result<(), UpgradeError> {
        loop {
            let running = self.app.decisions.operations();
            if running.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let models = running.iter().map(|m| format!("'{m}'")).collect::<Vec<_>>().join(", ");
                return Err(UpgradeError::Pending { within, what: format!("an operator's operation on {models} ran") });
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// The new process serves (or, cold, has the sockets and checked its
    /// start): the holds stay until this process exits.
    pub fn hand_over(mut self) {
        self.handed_over = true;
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        if self.handed_over {
            return;
        }
        self.app.registry.hold_rollouts(false);
        self.app.operations_held().store(false, Ordering::SeqCst);
        self.app.end_upgrade();
        tracing::info!("Released the upgrade's holds: model operations and rollouts go on.");
    }
}
