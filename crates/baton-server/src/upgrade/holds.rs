//! The holds an upgrade puts on the old process from its start until it
//! ends, and the guard that releases them on every path that does not
//! hand over: a failure, an early return, a panic.
//!
//! - **Upgrading**: one upgrade at a time; a second is refused (409).
//! - **Model operations**: load, unload, rollback, pin, retire and a
//!   rollout's operations are refused (409 `upgrade_in_progress`), so
//!   that no operator's decision lands after the new process read the
//!   state file.
//! - **Rollouts**: no rollout decision is applied here. The registry's
//!   hold is a barrier: it returns once no decision is in flight, and a
//!   decision checks it again before it applies. So once the holds are
//!   taken, what the state file and the registry say stands still, and
//!   the versions kept for rollback are read only then.
//!
//! When the new process has taken over, the holds stay for the rest of
//! this process's life: it only drains and exits.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::UpgradeError;
use crate::app::App;

/// Every hold of one upgrade, released on drop unless handed over.
pub(super) struct Holds {
    app: Arc<App>,
    handed_over: bool,
}

impl Holds {
    /// Takes the holds, in this order: upgrading, model operations,
    /// rollouts. Blocking (the rollouts' barrier waits for a decision in
    /// flight, which may wait for a metric source): call it off the async
    /// workers.
    pub fn take(app: Arc<App>) -> Result<Holds, UpgradeError> {
        if app.draining() {
            return Err(UpgradeError::Busy("the server is shutting down"));
        }
        if !app.begin_upgrade() {
            return Err(UpgradeError::Busy("an upgrade is already running"));
        }
        // From here on, dropping the guard undoes what was taken.
        let holds = Holds { app, handed_over: false };
        holds.app.operations_held().store(true, Ordering::SeqCst);
        holds.app.registry.hold_rollouts(true);
        Ok(holds)
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
