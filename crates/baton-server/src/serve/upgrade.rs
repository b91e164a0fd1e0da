//! Replacing the running server with a new binary while it serves.
//!
//! The running server (the old process) starts the new binary with its own
//! arguments and a channel (a Unix socket pair) whose end the new process
//! finds in `BATON_UPGRADE_FD`. Over it the old process hands over its
//! listening sockets (`SCM_RIGHTS`), which it keeps accepting on. The new
//! process loads what the state file and the repository say should serve,
//! as a restart would, through the whole load transaction; only once it is
//! ready does it start accepting on the same sockets, and say so. The old
//! process then shuts down as on SIGTERM: not ready, stops accepting,
//! finishes its requests in flight, exits. A new process that exits, says
//! it failed, or is not ready within the timeout changes nothing: it is
//! stopped, and the old one serves on.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton_worker::channel::Channel;
use serde::{Deserialize, Serialize};

use crate::app::App;

/// The variable naming the channel's descriptor in the new process.
pub const FD_ENV: &str = "BATON_UPGRADE_FD";

/// Messages on the channel.
#[derive(Debug, Serialize, Deserialize)]
enum Message {
    /// Old to new: the listening sockets, named, their descriptors attached
    /// in order, and the replica's place in a fleet.
    Listeners {
        names: Vec<String>,
        #[serde(default)]
        fleet: Fleet,
        #[serde(default)]
        kept: Kept,
        /// A cold handover: the old process drains and exits first, and
        /// the new one loads only then.
        #[serde(default)]
        cold: bool,
    },
    /// New to old: it serves.
    Ready { pid: u32 },
    /// New to old: it could not become ready, and exits.
    Failed { reason: String },
}

/// What a replica of a fleet hands on: its ID, resolved once (the new
/// process is the same replica, whatever its environment would make of
/// it), and its live lease, under which its registration, acks and
/// coordinator keys stay where they are through the handover.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Fleet {
    /// The replica's ID.
    pub replica_id: Option<String>,
    /// The lease it acts under now.
    pub lease: Option<i64>,
}

/// The versions each model keeps for rollback, newest first.
pub type Kept = std::collections::BTreeMap<String, Vec<u64>>;

/// Why an upgrade did not happen; the old process serves on.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The new binary could not be started.
    #[error("starting {binary}: {error}")]
    Start { binary: String, error: std::io::Error },
    /// The new process ended before it was ready.
    #[error("the new process exited before it was ready ({status})")]
    Exited { status: String },
    /// The new process said why it could not become ready.
    #[error("the new process could not become ready: {0}")]
    Failed(String),
    /// The new process was not ready in time; it was stopped.
    #[error("the new process was not ready within {0:?}; it was stopped")]
    TimedOut(Duration),
    /// An upgrade is already running, or the server is shutting down.
    #[error("{0}")]
    Busy(&'static str),
    /// Handing the sockets over failed.
    #[error("handing over to the new process: {0}")]
    Channel(std::io::Error),
}

impl UpgradeError {
    /// A stable kind string for responses.
    pub fn kind(&self) -> &'static str {
        match self {
            UpgradeError::Busy(_) => "upgrade_in_progress",
            _ => "upgrade_failed",
        }
    }
}

/// What the running server keeps to hand itself over: its listening
/// sockets, and how it was started.
#[derive(Debug)]
pub struct Source {
    listeners: Sockets,
    binary: PathBuf,
    args: Vec<OsString>,
    /// Channels of cold handovers, held open until this process exits.
    held: std::sync::Mutex<Vec<Channel>>,
}

impl Source {
    /// This process's listeners (copies of them), and its own binary and
    /// arguments as it was started.
    pub fn new(listeners: Sockets) -> std::io::Result<Source> {
        let binary = std::env::current_exe()?;
        // A binary replaced on disk reads "PATH (deleted)": the new one is at PATH.
        let binary = PathBuf::from(binary.to_string_lossy().trim_end_matches(" (deleted)").to_owned());
        let args = std::env::args_os().skip(1).collect();
        Ok(Source { listeners, binary, args, held: std::sync::Mutex::default() })
    }

    /// Starts `binary` (this server's own path by default) with this
    /// server's arguments, hands it the listeners, the replica's place in
    /// a fleet and the versions kept for rollback, and waits up to `within`
    /// for it to be ready. Blocking. Returns its pid.
    ///
    /// `cold`: returns once the sockets are handed over, without waiting;
    /// the new process loads only after this one has exited, which it
    /// learns when the channel closes, so the channel is left open until
    /// this process ends.
    pub fn hand_over(
        &self,
        binary: Option<PathBuf>,
        within: Duration,
        fleet: Fleet,
        kept: Kept,
        cold: bool,
    ) -> Result<u32, UpgradeError> {
        let binary = binary.unwrap_or_else(|| self.binary.clone());
        let (ours, theirs) = Channel::pair().map_err(UpgradeError::Channel)?;
        // Handed over in the child alone: no process started meanwhile (a
        // worker) inherits the new process's end.
        let mut command = Command::new(&binary);
        let fd =
            baton_worker::channel::hand_to_child(&mut command, vec![theirs.into()]).map_err(UpgradeError::Channel)?;
        command.args(&self.args).env(FD_ENV, fd[0].to_string()).stdin(Stdio::null());
        let child = command.spawn();
        // The command holds this process's copy of the new process's end.
        drop(command);
        let child = child.map_err(|error| UpgradeError::Start { binary: binary.display().to_string(), error })?;
        let mut child = Stopped(Some(child));
        let names = self.listeners.iter().map(|(n, _)| n.clone()).collect();
        let fds: Vec<_> = self.listeners.iter().map(|(_, fd)| fd.as_fd()).collect();
        let message = Message::Listeners { names, fleet, kept, cold };
        let message = serde_json::to_vec(&message).map_err(|e| UpgradeError::Failed(e.to_string()))?;
        if let Err(error) = ours.send(&message, &fds) {
            return Err(child.exited().unwrap_or(UpgradeError::Channel(error)));
        }
        if cold {
            let pid = child.0.take().map_or(0, |c| c.id());
            // Closed when this process exits: the new one's signal to load.
            self.held.lock().unwrap_or_else(|e| e.into_inner()).push(ours);
            return Ok(pid);
        }
        let deadline = Instant::now() + within;
        let mut buffer = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match ours.readable_within(left) {
                Ok(true) => {}
                Ok(false) => return Err(UpgradeError::TimedOut(within)),
                Err(error) => return Err(UpgradeError::Channel(error)),
            }
            match ours.recv(&mut buffer) {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    return Err(child.exited().unwrap_or(UpgradeError::Failed("it closed the channel".into())));
                }
            }
            match serde_json::from_slice::<Message>(&buffer) {
                Ok(Message::Ready { pid }) => {
                    // It outlives this process: not stopped, not waited for.
                    drop(child.0.take());
                    return Ok(pid);
                }
                Ok(Message::Failed { reason }) => return Err(UpgradeError::Failed(reason)),
                Ok(Message::Listeners { .. }) | Err(_) => {}
            }
        }
    }
}

/// The new process until it is ready: stopped (SIGTERM, then SIGKILL) and
/// reaped when the upgrade fails.
struct Stopped(Option<Child>);

impl Stopped {
    /// How it ended, when it has.
    fn exited(&mut self) -> Option<UpgradeError> {
        let child = self.0.as_mut()?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.0 = None;
                return Some(UpgradeError::Exited { status: status.to_string() });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else { return };
        if let Ok(pid) = i32::try_from(child.id())
            && let Some(pid) = rustix::process::Pid::from_raw(pid)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Listening sockets, each with the listener it stands for.
pub type Sockets = Vec<(String, OwnedFd)>;

/// The new process's side: the server it replaces.
pub struct Target {
    channel: Channel,
    /// The replica's place in a fleet, handed on.
    pub fleet: Fleet,
    /// The versions the old server keeps for rollback.
    kept: Kept,
    /// Whether the old server drains and exits before this one loads.
    pub cold: bool,
}

impl Target {
    /// The server this process replaces, when one started it: takes the
    /// channel and receives the listening sockets, named.
    pub fn from_env() -> anyhow::Result<Option<(Target, Sockets)>> {
        let Ok(fd) = std::env::var(FD_ENV) else { return Ok(None) };
        let fd = fd.parse().map_err(|_| anyhow::anyhow!("{FD_ENV} = '{fd}': not a descriptor"))?;
        // SAFETY: the server that started this process left this socket
        // open for it alone.
        #[allow(unsafe_code)]
        let channel = unsafe { Channel::inherited(fd) }?;
        let mut buffer = Vec::new();
        let fds = channel.recv(&mut buffer)?.ok_or_else(|| anyhow::anyhow!("the old server closed the channel"))?;
        let Message::Listeners { names, fleet, kept, cold } = serde_json::from_slice(&buffer)? else {
            anyhow::bail!("the old server sent something else than its listeners");
        };
        anyhow::ensure!(names.len() == fds.len(), "{} listeners named, {} sent", names.len(), fds.len());
        Ok(Some((Target { channel, fleet, kept, cold }, names.into_iter().zip(fds).collect())))
    }

    /// In a cold handover: waits until the old server has exited (its end
    /// of the channel closes), so that its memory is free before this
    /// process loads anything. Blocking; the old server bounds its drain.
    pub fn await_old_exit(&self) {
        // The old server sends nothing more; a message is read past, and
        // the wait ends when the channel closes (or fails).
        let mut buffer = Vec::new();
        while let Ok(Some(_)) = self.channel.recv(&mut buffer) {}
    }

    /// Waits until `app` is ready (every model it must serve serves); says
    /// why not, to the old server too. The old server bounds the wait: it
    /// stops this process when it gives up. Ends when the old server goes
    /// away.
    pub async fn await_ready(&self, app: &App) -> anyhow::Result<()> {
        loop {
            if app.ready() {
                return Ok(());
            }
            if !self.cold && self.channel.readable_within(Duration::ZERO).unwrap_or(true) {
                anyhow::bail!("taking over from the running server: it went away before this one was ready");
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
                let why = format!("a load failed: {failed}");
                self.send(&Message::Failed { reason: why.clone() });
                anyhow::bail!("taking over from the running server: {why}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Loads the versions the old server keeps for rollback, each through
    /// the whole load transaction, and keeps them behind the stable
    /// version, as the old server does. A version that cannot be loaded
    /// (its files are gone, say) is left out with a warning: the upgrade
    /// goes on, since what serves is unchanged.
    pub async fn keep(&self, app: &App) {
        for (model, versions) in &self.kept {
            for &version in versions {
                let kept = match app.registry.keep(model, version) {
                    Ok(handle) => handle.finished().await.map(drop),
                    Err(error) => Err(error),
                };
                if let Err(error) = kept {
                    tracing::warn!(model, version, %error, "A version the old server kept could not be kept here.");
                }
            }
        }
    }

    /// Tells the old server this one serves.
    pub fn ready(&self) {
        self.send(&Message::Ready { pid: std::process::id() });
    }

    fn send(&self, message: &Message) {
        if let Ok(bytes) = serde_json::to_vec(message) {
            let _ = self.channel.send(&bytes, &[]);
        }
    }
}

/// Upgrades on SIGUSR2, as `POST /baton/v1/upgrade` with no body does,
/// for process managers: the outcome is in the log.
pub async fn on_signal(app: std::sync::Arc<App>) {
    let Ok(mut usr2) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2()) else {
        tracing::warn!("Could not install the SIGUSR2 handler; upgrades go through the API alone.");
        return;
    };
    while usr2.recv().await.is_some() {
        tracing::info!("SIGUSR2: replacing this server with the binary on disk.");
        let app = std::sync::Arc::clone(&app);
        tokio::spawn(async move {
            let _ = app.upgrade(None, Duration::from_secs(600), false).await;
        });
    }
}
