//! The new process's side of the handover, from its first instruction to
//! the moment it serves:
//!
//! ```text
//! receive the sockets ──▶ check what a start checks ──Checked / Failed──▶
//!   (cold: wait for the old process to exit: its end of the channel closes)
//!   ──▶ load what should serve ──▶ keep what the old one keeps
//!   ──Ready──▶ wait for Taken ──▶ own the replica's lease, accept, tell systemd
//! ```
//!
//! Until the old process has said `Taken` it gives up at once, and exits,
//! when the old process stops it (SIGTERM) or goes away (the channel
//! closes), whether it is loading what serves, loading the versions kept
//! for rollback, or waiting for `Taken`: loads still running are left
//! behind, as nothing is published before a commit, and nothing of the
//! replica's (its lease, registration, coordinator keys) was touched.

use std::time::Duration;

use baton_worker::channel::Channel;

use super::FD_ENV;
use super::message::{Fleet, Kept, Message, PROTOCOL};
use super::old::Sockets;
use crate::app::App;

/// How often a wait looks at the channel and at the shutdown flag.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// Why the new process stopped before it took over.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// It was told to stop (SIGTERM, as the old process does when it gives
    /// up): a clean exit.
    #[error("stopped before it took over: the server it was to replace serves on")]
    Stopped,
    /// The old process closed the channel: it gave up, or died.
    #[error("the server this one was to replace went away before this one took over")]
    OldGone,
    /// A load of what must serve failed.
    #[error("a load failed: {0}")]
    LoadFailed(String),
}

/// The new process's side: the server it replaces.
pub struct Target {
    channel: Channel,
    /// The replica's place in a fleet, handed on.
    pub fleet: Fleet,
    /// The versions the old server keeps for rollback.
    kept: Kept,
    /// Whether the old server drains and exits before this one loads.
    pub cold: bool,
    /// The handover protocol the old server speaks (0: a release that
    /// sends no `Taken`).
    protocol: u32,
}

impl Target {
    /// The server this process replaces, when one started it: takes the
    /// channel and receives the listening sockets, named.
    pub fn from_env() -> anyhow::Result<Option<(Target, Sockets)>> {
        let Ok(fd) = std::env::var(FD_ENV) else { return Ok(None) };
        let fd = fd.parse().map_err(|_| anyhow::anyhow!("{FD_ENV} = '{fd}': not a descriptor"))?;
        // SAFETY: the server that started this process placed this socket
        // at this descriptor for it alone.
        #[allow(unsafe_code)]
        let channel = unsafe { Channel::inherited(fd) }?;
        let received = Message::receive(&channel)?;
        let Some((Message::Listeners { names, fleet, kept, cold, protocol }, fds)) = received else {
            anyhow::bail!("the old server sent something else than its listeners, or nothing");
        };
        anyhow::ensure!(names.len() == fds.len(), "{} listeners named, {} sent", names.len(), fds.len());
        if protocol > PROTOCOL {
            tracing::info!(
                theirs = protocol,
                ours = PROTOCOL,
                "The server this one replaces speaks a newer handover protocol; speaking this one's."
            );
        }
        Ok(Some((Target { channel, fleet, kept, cold, protocol }, names.into_iter().zip(fds).collect())))
    }

    /// Tells the old server whether what a start checks before it loads
    /// (flags, state file, token file, repository) passed, or why not.
    pub fn checked(&self, result: Result<(), String>) {
        match result {
            Ok(()) => self.send(&Message::Checked),
            Err(reason) => self.send(&Message::Failed { reason }),
        }
    }

    /// In a cold handover: waits until the old server has exited (its end
    /// of the channel closes), so that its memory is free before this
    /// process loads anything. Blocking; the old server bounds its drain.
    pub fn await_old_exit(&self) {
        // The old server sends nothing more: the wait ends when the
        // channel closes (or fails).
        while let Ok(Some(_)) = Message::receive(&self.channel) {}
    }

    /// Waits until `app` is ready (every model it must serve serves); says
    /// why not, to the old server too. Gives up at once when this process
    /// is told to stop, or the old server goes away (a warm handover).
    pub async fn await_ready(&self, app: &App) -> Result<(), NotReady> {
        let mut stop = app.shutdown_signal();
        loop {
            self.given_up(app)?;
            if app.ready() {
                return Ok(());
            }
            // A model that serves nothing, has nothing loading, and failed:
            // one that failed a version but serves another, or is still
            // loading one, may yet be ready.
            let failed = app.registry.statuses().into_iter().find_map(|s| {
                if s.serving.is_some() || s.busy {
                    return None;
                }
                let error = s.last_error?;
                Some(format!("model {} version {:?}: {}", s.name, error.version, error.message))
            });
            if let Some(failed) = failed {
                let not_ready = NotReady::LoadFailed(failed);
                self.send(&Message::Failed { reason: not_ready.to_string() });
                return Err(not_ready);
            }
            tokio::select! {
                _ = stop.changed() => {}
                () = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
    }

    /// Loads the versions the old server keeps for rollback, each through
    /// the whole load transaction, and keeps them behind the stable
    /// version, as the old server does. A model whose load is still
    /// draining (it serves already) is waited for. A version that cannot
    /// be loaded (its files are gone, say) is left out with a warning: the
    /// upgrade goes on, since what serves is unchanged. Gives up at once,
    /// as [`Target::await_ready`] does, when this process is told to stop
    /// or the old server goes away: the old server bounds the whole wait
    /// with its deadline, and stops this one when it passes.
    pub async fn keep(&self, app: &App) -> Result<(), NotReady> {
        let keeping = async {
            for (model, versions) in &self.kept {
                for &version in versions {
                    let kept = loop {
                        match app.registry.keep(model, version) {
                            Ok(handle) => break handle.finished().await.map(drop),
                            Err(error) if error.kind() == "load_in_progress" && !app.draining() => {
                                tokio::time::sleep(LOOK_EVERY).await;
                            }
                            Err(error) => break Err(error),
                        }
                    };
                    if let Err(error) = kept {
                        tracing::warn!(model, version, %error, "A version the old server kept could not be kept here.");
                    }
                }
            }
        };
        tokio::select! {
            () = keeping => Ok(()),
            given_up = self.until_given_up(app) => Err(given_up),
        }
    }

    /// Tells the old server this one is ready, and waits for its answer:
    /// `Taken`, once it has committed to hand over (it stops acting for
    /// the replica and drains). Only then may this process own the
    /// replica's lease, accept, and tell systemd it is the service's main
    /// process. A send that fails, a channel that closes, or a SIGTERM
    /// first means the old server gave up (its deadline passed meanwhile):
    /// this process then owns nothing and exits. A cold handover has
    /// nothing to wait for (the old server has exited), nor has one from a
    /// release that sends no `Taken`: the old server of that release
    /// counts `Ready` as the handover.
    pub async fn commit(&self, app: &App) -> Result<(), NotReady> {
        if self.cold {
            return Ok(());
        }
        let ready = Message::Ready { pid: std::process::id() };
        if let Err(error) = ready.send(&self.channel, &[]) {
            tracing::info!(%error, "Could not tell the server this one replaces that it is ready.");
            return Err(NotReady::OldGone);
        }
        if self.protocol == 0 {
            return Ok(());
        }
        loop {
            if app.draining() {
                return Err(NotReady::Stopped);
            }
            if self.channel.readable_within(Duration::ZERO).unwrap_or(true) {
                match Message::receive(&self.channel) {
                    Ok(Some((Message::Taken, _))) => return Ok(()),
                    // Nothing else is sent after Ready.
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return Err(NotReady::OldGone),
                }
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// Why this process is to give up now, if it is: it was told to stop,
    /// or (a warm handover, before `Ready`) the old server closed the
    /// channel, on which it sends nothing until then.
    fn given_up(&self, app: &App) -> Result<(), NotReady> {
        if app.draining() {
            return Err(NotReady::Stopped);
        }
        if !self.cold && self.channel.readable_within(Duration::ZERO).unwrap_or(true) {
            return Err(NotReady::OldGone);
        }
        Ok(())
    }

    /// Resolves once [`Target::given_up`] says why.
    async fn until_given_up(&self, app: &App) -> NotReady {
        loop {
            if let Err(why) = self.given_up(app) {
                return why;
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    fn send(&self, message: &Message) {
        if let Err(error) = message.send(&self.channel, &[]) {
            tracing::debug!(%error, "Could not tell the old server how the upgrade stands.");
        }
    }
}
