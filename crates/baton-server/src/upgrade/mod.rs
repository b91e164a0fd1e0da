//! Replacing the running server with a new process of its own executable
//! while it serves: the handover, in one place.
//!
//! The running server (the old process) starts its executable again with
//! its own arguments and one end of a channel (a Unix socket pair) at a
//! fixed descriptor, named by `BATON_UPGRADE_FD`, and hands over its
//! listening sockets (`SCM_RIGHTS`), which it keeps accepting on. The new
//! process checks what any start checks, says so, loads what the state
//! file and the repository say should serve, as a restart would, and only
//! once ready starts accepting on the same sockets and says so. The old
//! process then shuts down as on SIGTERM. A cold upgrade turns the order
//! round: once the new process has checked its start, the old one drains
//! and exits first, and the new one loads after.
//!
//! The pieces, from start to exit:
//!
//! - [`upgrade`]: the operation, for the API and SIGUSR2. It runs in a task
//!   of its own, which a client that hangs up does not cancel.
//! - [`holds`]: what the old process holds while it hands over (model
//!   operations, rollouts, one upgrade at a time), and the guard that
//!   releases it on every path but a handover.
//! - [`old`]: the old side: start the new process, hand over, wait, or
//!   stop it (SIGTERM, channel shut, SIGKILL past a grace).
//! - [`message`]: what the two say over the channel.
//! - [`new`]: the new side: receive, check, wait for the old process
//!   (cold), wait until ready or told to stop, say so.
//!
//! In a fleet the new process is the same replica under the same lease;
//! it owns the lease, registers, acks and coordinates only once it serves
//! (docs/upgrade.md, "In a fleet").

mod error;
mod holds;
mod message;
pub mod new;
pub mod old;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use error::UpgradeError;
pub use message::{Fleet, Kept};
pub use new::{NotReady, Target};
pub use old::Source;

use crate::app::App;

/// The variable naming the channel's descriptor in the new process.
pub const FD_ENV: &str = "BATON_UPGRADE_FD";

/// The bounds of an upgrade's timeout, in seconds: at least a second, at
/// most a day.
pub const TIMEOUT_S: std::ops::RangeInclusive<u64> = 1..=86_400;

/// Replaces this server with a new process of its own executable, waiting
/// up to `within` for it to take over; this process then shuts down as on
/// SIGTERM. Returns the new process's pid. On failure nothing changes.
/// `within` covers the whole upgrade: the wait for operators' operations
/// already running and for the rollouts' barrier, then the new process's
/// start and loads.
///
/// The work runs in a task of its own: dropping the returned future (a
/// client that hung up) neither cancels the upgrade nor leaves its holds
/// set. Whatever the outcome, it is logged.
pub async fn upgrade(app: Arc<App>, within: Duration, cold: bool) -> Result<u32, UpgradeError> {
    let task = tokio::spawn(async move {
        let result = run(app, within, cold).await;
        if let Err(error) = &result {
            tracing::warn!(%error, kind = error.kind(), "The upgrade did not happen; this process serves on.");
        }
        result
    });
    task.await.unwrap_or_else(|e| Err(UpgradeError::Failed(format!("the upgrade's task ended: {e}"))))
}

/// The upgrade, start to end.
async fn run(app: Arc<App>, within: Duration, cold: bool) -> Result<u32, UpgradeError> {
    let deadline = Instant::now()
        .checked_add(within)
        .ok_or_else(|| UpgradeError::Failed(format!("a timeout of {within:?} is out of bounds")))?;
    let source = app.upgrade.get().cloned().ok_or(UpgradeError::Unavailable(
        "this server cannot replace itself: it is embedded in another program (upgrade that program instead), \
         or it could not keep copies of its listening sockets when it started (its log says why)",
    ))?;
    let holds = holds::Holds::take(Arc::clone(&app), deadline, within).await?;
    // Read only now that nothing moves: no operator's operation runs, and
    // the rollouts' hold is a barrier.
    let kept = kept(&app);
    // In a fleet the new process is the same replica, under the same
    // lease: the fleet sees no replica leave.
    let lease = app.cluster.get().and_then(|health| health.lease());
    let fleet = Fleet { replica_id: app.replica_id.get().cloned(), lease };
    tracing::info!(binary = %source.binary().display(), cold, "Starting a new process to take this one's place.");
    // The commit and a signal's stop exclude each other: whichever comes
    // first decides how this process ends.
    let committing = Arc::clone(&app);
    let commit = move || committing.claim_handover();
    let handed =
        tokio::task::spawn_blocking(move || source.hand_over(deadline, within, (fleet, kept, cold), &commit)).await;
    let pid = handed.unwrap_or_else(|e| Err(UpgradeError::Failed(format!("the handover panicked: {e}"))))?;
    // The commit: a service manager (systemd, `baton init`) hears of the
    // new main process now, before this one drains and exits, so that it
    // never sees its main process exit with no successor named. The new
    // process says it again once it serves.
    crate::serve::notify::notify(&format!("MAINPID={pid}"));
    holds.hand_over();
    if let Some(health) = app.cluster.get() {
        // The lease lives on in the new process; this one no longer acts
        // for the replica.
        health.hand_over_lease(lease);
    }
    tracing::info!(new_pid = pid, "A new process serves in this one's place; shutting down as on SIGTERM.");
    // Not a signal: a SIGTERM that reaches this process too (a manager's,
    // passed on before it heard of the new main process) is then the
    // first signal, not a second one that exits at once.
    app.hand_over();
    Ok(pid)
}

/// The versions each model keeps for rollback: what the new process
/// keeps too.
fn kept(app: &App) -> Kept {
    app.registry
        .statuses()
        .into_iter()
        .filter(|status| !status.previous.is_empty())
        .map(|status| (status.name, status.previous))
        .collect()
}

/// Installs the SIGUSR2 handler: from now on SIGUSR2 no longer kills
/// the process. None, with a warning, when it could not be installed.
pub fn install_signal() -> Option<tokio::signal::unix::Signal> {
    let installed = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2());
    installed
        .inspect_err(|_| tracing::warn!("Could not install the SIGUSR2 handler; upgrades go through the API alone."))
        .ok()
}

/// Upgrades on SIGUSR2 (`usr2`, from [`install_signal`]), as `POST
/// /baton/v1/upgrade` with no body does, for process managers: the
/// outcome is in the log.
pub async fn on_signal(app: Arc<App>, mut usr2: tokio::signal::unix::Signal) {
    while usr2.recv().await.is_some() {
        tracing::info!("SIGUSR2: replacing this server with its executable as on disk now.");
        tokio::spawn(upgrade(Arc::clone(&app), Duration::from_secs(600), false));
    }
}
