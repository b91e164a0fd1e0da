//! The old process's side of the handover: it starts its own executable
//! again with its own arguments, gives it one end of the channel at a
//! fixed descriptor, sends its listening sockets, and waits, within the
//! upgrade's timeout, for the new process to say it checked its start
//! (a cold upgrade) or that it serves (a warm one).
//!
//! ```text
//! Launched ──Listeners──▶ waiting ──Checked (cold)──────────▶ handed over
//!                            │     ──Ready (warm)──Taken──▶ handed over
//!                            │
//!                            └─ Failed / closed / exited / timed out
//!                                 ──▶ stopped: SIGTERM, channel shut,
//!                                     wait, SIGKILL only past the grace
//! ```
//!
//! `Taken` is the commit: the old process sends it only for a `Ready`
//! read within its deadline, and the new process owns nothing of the
//! replica's (the lease, the accept loops, systemd's main pid) until it
//! reads it. A deadline that passes first shuts the channel instead, and
//! the new process exits owning nothing.
//!
//! The binary is the server's own executable path, as on disk now, never
//! one a request names: replacing the file at that path (as a package
//! manager does, by renaming the new one into place) is how a new version
//! is installed, and whoever can write there owns the server anyway.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton_worker::channel::Channel;

use super::message::{Fleet, Kept, Message, PROTOCOL};
use super::{FD_ENV, UpgradeError};

/// How long a new process that was told to stop has to exit before it is
/// killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Listening sockets, each with the listener it stands for.
pub type Sockets = Vec<(String, OwnedFd)>;

/// What the running server keeps to hand itself over: its listening
/// sockets, and how it was started.
#[derive(Debug)]
pub struct Source {
    listeners: Sockets,
    binary: PathBuf,
    args: Vec<OsString>,
    /// Channels of cold handovers, held open until this process exits:
    /// their closing tells the new process to load.
    held: std::sync::Mutex<Vec<Channel>>,
}

impl Source {
    /// This process's listeners (copies of them), and its own executable
    /// path and arguments as it was started.
    pub fn new(listeners: Sockets) -> std::io::Result<Source> {
        let binary = std::env::current_exe()?;
        // A binary replaced on disk reads "PATH (deleted)": the new one is at PATH.
        let binary = PathBuf::from(binary.to_string_lossy().trim_end_matches(" (deleted)").to_owned());
        let args = std::env::args_os().skip(1).collect();
        Ok(Source { listeners, binary, args, held: std::sync::Mutex::default() })
    }

    /// The executable an upgrade runs.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Starts this server's executable with its arguments, hands it the
    /// listeners, the replica's place in a fleet and the versions kept for
    /// rollback, and waits until `deadline` for it to take over: to serve,
    /// or, `cold`, to have checked its start (it then loads only once this
    /// process has exited, which it learns when the channel closes, so the
    /// channel is left open until this process ends). Blocking. Returns
    /// the new process's pid; on any failure the new process is stopped.
    /// `commit` is asked right before the commit (`Checked` read, cold, or
    /// `Taken` sent, warm): false (this server began shutting down) fails
    /// the upgrade instead.
    pub fn hand_over(
        &self,
        deadline: Instant,
        within: Duration,
        (fleet, kept, cold): (Fleet, Kept, bool),
        commit: &dyn Fn() -> bool,
    ) -> Result<u32, UpgradeError> {
        let stopping = || UpgradeError::Busy("the server began shutting down");
        let (ours, theirs) = channel_pair().map_err(UpgradeError::Channel)?;
        let mut launched = Launched::start(&self.binary, &self.args, theirs, ours)?;
        let names = self.listeners.iter().map(|(n, _)| n.clone()).collect();
        let fds: Vec<_> = self.listeners.iter().map(|(_, fd)| fd.as_fd()).collect();
        let message = Message::Listeners { names, fleet, kept, cold, protocol: PROTOCOL };
        if let Err(error) = launched.channel().and_then(|channel| message.send(channel, &fds)) {
            return Err(launched.exited().unwrap_or(UpgradeError::Channel(error)));
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match launched.channel().and_then(|channel| channel.readable_within(left)) {
                Ok(true) => {}
                Ok(false) => return Err(UpgradeError::TimedOut { within, stopped: launched.stop() }),
                Err(error) => return Err(UpgradeError::Channel(error)),
            }
            match launched.channel().and_then(Message::receive) {
                Ok(Some((Message::Checked, _))) if cold => {
                    if !commit() {
                        return Err(stopping());
                    }
                    let (pid, channel) = launched.handed_over();
                    self.held.lock().unwrap_or_else(|e| e.into_inner()).extend(channel);
                    return Ok(pid);
                }
                // Ready in a cold upgrade: the new binary predates cold
                // handovers, loaded beside this process, and serves.
                Ok(Some((Message::Ready { pid }, _))) => {
                    // The commit: from here on the new process acts.
                    if !commit() {
                        return Err(stopping());
                    }
                    if let Err(error) = launched.channel().and_then(|channel| Message::Taken.send(channel, &[])) {
                        return Err(launched.exited().unwrap_or(UpgradeError::Channel(error)));
                    }
                    launched.handed_over();
                    return Ok(pid);
                }
                Ok(Some((Message::Failed { reason }, _))) => return Err(UpgradeError::Failed(reason)),
                // Checked in a warm upgrade: it goes on loading.
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    let closed = UpgradeError::Failed("it closed the channel".into());
                    return Err(launched.exited().unwrap_or(closed));
                }
            }
        }
    }
}

/// The new process until it has taken over, and the old side of its
/// channel. Dropped before then, it stops the process: SIGTERM, then the
/// channel is shut (the new process reads that as "give up"), and SIGKILL only if it has not exited within [`STOP_GRACE`].
struct Launched {
    child: Option<Child>,
    /// Taken when it has taken over.
    channel: Option<Channel>,
}

impl Launched {
    /// Starts `binary` with `args`, its end of the channel (`theirs`)
    /// handed to it alone: the descriptor is placed in the child between
    /// fork and exec (as workers' are), so no other process this one
    /// starts meanwhile (a worker) inherits it.
    fn start(binary: &Path, args: &[OsString], theirs: OwnedFd, ours: Channel) -> Result<Launched, UpgradeError> {
        let mut command = Command::new(binary);
        let handed = baton_worker::channel::hand_to_child(&mut command, vec![theirs]).map_err(UpgradeError::Channel)?;
        command.args(args).env(FD_ENV, handed[0].to_string()).stdin(Stdio::null());
        let child = command.spawn();
        // The command holds this process's copy of the new process's end.
        drop(command);
        let child = child.map_err(|error| UpgradeError::Start { binary: binary.display().to_string(), error })?;
        Ok(Launched { child: Some(child), channel: Some(ours) })
    }

    /// It has taken over: it outlives this process, not stopped, not
    /// waited for. Its pid, and the channel.
    fn handed_over(mut self) -> (u32, Option<Channel>) {
        (self.child.take().map_or(0, |c| c.id()), self.channel.take())
    }

    /// The old side of the channel.
    fn channel(&self) -> std::io::Result<&Channel> {
        self.channel.as_ref().ok_or_else(|| std::io::Error::other("the channel was handed over"))
    }

    /// How it ended, when it ends by itself within [`STOP_GRACE`].
    fn exited(&mut self) -> Option<UpgradeError> {
        let child = self.child.as_mut()?;
        let status = wait_until(child, Instant::now() + STOP_GRACE)?;
        self.child = None;
        Some(UpgradeError::Exited { status })
    }

    /// Stops it: shuts the channel, sends SIGTERM, waits, kills past the
    /// grace. Says how it ended.
    fn stop(&mut self) -> String {
        let Some(mut child) = self.child.take() else { return "it had exited".into() };
        // SIGTERM first: a cold upgrade's new process, which holds it
        // blocked while it waits for the channel to close, then finds it
        // pending when it does, and does not take the close for this
        // process's exit.
        if let Ok(pid) = i32::try_from(child.id())
            && let Some(pid) = rustix::process::Pid::from_raw(pid)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if let Some(channel) = &self.channel {
            channel.shutdown();
        }
        if let Some(status) = wait_until(&mut child, Instant::now() + STOP_GRACE) {
            return format!("it exited on SIGTERM ({status})");
        }
        let _ = child.kill();
        let status = child.wait().map_or_else(|e| e.to_string(), |s| s.to_string());
        format!("it did not exit within {STOP_GRACE:?} of SIGTERM and was killed with SIGKILL ({status})")
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if self.child.is_some() {
            let how = self.stop();
            tracing::info!(how = %how, "Stopped the new process of an upgrade that did not happen.");
        }
    }
}

/// A channel: this process's end, and the new process's as a bare
/// descriptor, both closed on exec (the new one's is placed in the child
/// alone, see [`Launched::start`]). Made whatever numbers the sockets get:
/// a server started with a standard stream closed gets 0, 1 or 2.
fn channel_pair() -> std::io::Result<(Channel, OwnedFd)> {
    let (ours, theirs) = Channel::pair()?;
    Ok((ours, OwnedFd::from(theirs)))
}

/// Waits until `child` has exited or `deadline` passed: its exit status.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<String> {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status.to_string());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// Set in the child process the test below starts.
    const CLOSED: &str = "BATON_TEST_STANDARD_INPUT_CLOSED";

    /// A server started with its standard input closed gets descriptor 0
    /// for the next socket it opens, and the upgrade's channel to the new
    /// server may be made there: it must be taken (and not leaked, the
    /// upgrade failing). Run in a process of its own (this test binary
    /// again, with this test alone), whose standard input is closed first.
    #[test]
    fn the_channel_to_the_new_server_may_be_made_on_a_standard_stream_s_descriptor() {
        if std::env::var_os(CLOSED).is_some() {
            // SAFETY: this process runs this test alone, on this thread;
            // nothing else in it uses its standard input.
            #[allow(unsafe_code)]
            drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(0) });
            let (ours, theirs) = channel_pair().expect("a channel on descriptor 0");
            let ours = OwnedFd::from(ours);
            assert_eq!(ours.as_raw_fd(), 0, "the channel was not made on descriptor 0");
            rustix::net::send(&ours, b"handed over", rustix::net::SendFlags::empty()).unwrap();
            let mut buffer = [0; 32];
            let (got, _) = rustix::net::recv(&theirs, &mut buffer, rustix::net::RecvFlags::empty()).unwrap();
            assert_eq!(&buffer[..got], b"handed over");
            return;
        }
        let name = "upgrade::old::tests::the_channel_to_the_new_server_may_be_made_on_a_standard_stream_s_descriptor";
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads", "1", "--nocapture"])
            .env(CLOSED, "1")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&child.stderr);
        assert!(child.status.success(), "{}: {said}{}", child.status, String::from_utf8_lossy(&child.stdout));
        assert!(String::from_utf8_lossy(&child.stdout).contains("1 passed"), "the test did not run in the child");
    }
}
