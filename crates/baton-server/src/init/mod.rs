//! `baton init ARGS...`: a supervisor that runs `baton ARGS` (its own
//! executable) as its main process, for a container's entry point.
//!
//! As PID 1 of a container (or, elsewhere, a child subreaper) it:
//!
//! - reaps every process that exits under it, its own children and the
//!   orphans the kernel hands it (after an upgrade, the old server);
//! - forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the
//!   current main process (PID 1 ignores a signal it has no handler for),
//!   and a SIGTERM or SIGINT passed on to every main process named after
//!   it, so that a stop during an upgrade reaches the new process too;
//! - names a notification socket of its own in the main process's
//!   `NOTIFY_SOCKET`, and follows `MAINPID=` there: after an upgrade the
//!   new process, started by the old one and adopted by init, is the main
//!   process, and the container lives on;
//! - exits with the main process's status (128 + a signal's number) when
//!   it exits without having named a successor, once its other processes
//!   have had `--stop-timeout` to exit after a SIGTERM.
//!
//! The main process runs in a process group of its own, so a terminal's
//! Ctrl-C reaches it once, through init, not twice (baton exits at once on
//! a second signal). Under a manager that itself set `NOTIFY_SOCKET`, init
//! passes on what the main process says there but its `MAINPID=`: for
//! that manager, init is the main process and stays it.

mod notify;
mod procs;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use rustix::process::Signal;
use tokio::signal::unix::{SignalKind, signal};

/// `baton init`'s arguments.
#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// How long the processes left once the main process has exited (its
    /// workers, an old server still draining) have to exit after SIGTERM
    /// before they are killed, e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = baton_drill::args::parse_duration, value_name = "DURATION")]
    pub stop_timeout: Duration,
    /// The form of init's own log on stderr: `text` or `json` (give the
    /// main process the same, e.g. `serve --log-format json`).
    #[arg(long, value_enum, default_value_t = crate::logging::LogFormat::Text)]
    pub log_format: crate::logging::LogFormat,
    /// The main process's arguments: `baton ARGS`, e.g. `serve --repo /models`.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    pub args: Vec<OsString>,
}

/// The signals passed on to the main process, with their names.
const FORWARDED: [(Signal, &str); 6] = [
    (Signal::TERM, "SIGTERM"),
    (Signal::INT, "SIGINT"),
    (Signal::HUP, "SIGHUP"),
    (Signal::QUIT, "SIGQUIT"),
    (Signal::USR1, "SIGUSR1"),
    (Signal::USR2, "SIGUSR2"),
];

/// The variable naming a notification socket.
const NOTIFY_ENV: &str = "NOTIFY_SOCKET";

/// Runs `baton init`: returns the main process's exit status.
pub fn run(args: InitArgs) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let result = runtime.context("starting the runtime").and_then(|runtime| runtime.block_on(supervise(args)));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            tracing::error!(error = %format!("{error:#}"), "baton init could not run its main process.");
            ExitCode::from(127)
        }
    }
}

/// What init listens to: the forwarded signals, SIGCHLD, and its socket.
struct Inputs {
    signals: tokio::sync::mpsc::Receiver<(Signal, &'static str)>,
    child: tokio::signal::unix::Signal,
    socket: notify::Socket,
}

impl Inputs {
    /// Installs every handler, before anything is started, so that no
    /// signal is missed.
    fn install() -> anyhow::Result<Inputs> {
        let (tx, signals) = tokio::sync::mpsc::channel(64);
        for (sig, name) in FORWARDED {
            let mut stream = signal(SignalKind::from_raw(sig.as_raw())).with_context(|| format!("handling {name}"))?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    // Signals coalesce anyway: a full queue drops one.
                    let _ = tx.try_send((sig, name));
                }
            });
        }
        let child = signal(SignalKind::child()).context("handling SIGCHLD")?;
        let socket = notify::Socket::bind().context("binding the notification socket")?;
        Ok(Inputs { signals, child, socket })
    }
}

/// The supervisor's state: who the main process is now.
struct Supervisor {
    me: u32,
    main: u32,
    /// A manager's socket above init, to pass notifications on to.
    outer: Option<String>,
    /// Notifications ignored since the last warning about them, and
    /// when that was: a stranger that floods the socket gets a warning a
    /// second, not one a datagram.
    ignored: (u64, Option<std::time::Instant>),
    /// The SIGTERM or SIGINT passed on, if one was: a main process named
    /// after it (the new process of an upgrade that committed as the
    /// signal came) is sent it too, or it would serve on.
    stopping: Option<(Signal, &'static str)>,
    /// A successor the main process named that had exited already.
    lost_successor: bool,
}

async fn supervise(args: InitArgs) -> anyhow::Result<u8> {
    let me = std::process::id();
    if me != 1 {
        // The new process of an upgrade outlives its parent, the old main
        // process: as a subreaper init adopts it, as PID 1 does.
        let pid = rustix::process::getpid();
        rustix::process::set_child_subreaper(Some(pid)).context("becoming a child subreaper")?;
    }
    let mut inputs = Inputs::install()?;
    let outer = std::env::var(NOTIFY_ENV).ok().filter(|s| !s.is_empty());
    let mut command = std::process::Command::new("/proc/self/exe");
    if let Some(name) = std::env::args_os().next() {
        command.arg0(name);
    }
    command.args(&args.args).env(NOTIFY_ENV, inputs.socket.name()).process_group(0);
    let child = command.spawn().context("starting the main process")?;
    let mut init =
        Supervisor { me, main: child.id(), outer, ignored: (0, None), stopping: None, lost_successor: false };
    // Reaped below, by pid, as every other child is.
    drop(child);
    tracing::info!(pid = init.main, socket = inputs.socket.name(), subreaper = me != 1, "Started the main process.");
    let code = loop {
        tokio::select! {
            Some((sig, name)) = inputs.signals.recv() => {
                tracing::info!(signal = name, pid = init.main, "Passing a signal on to the main process.");
                procs::signal(init.main, sig);
                if matches!(sig, Signal::TERM | Signal::INT) {
                    init.stopping = Some((sig, name));
                }
            }
            _ = inputs.child.recv() => {}
            datagram = inputs.socket.next() => match datagram {
                Ok(datagram) => init.heard(&datagram),
                Err(error) => tracing::warn!(%error, "Could not read the notification socket."),
            },
        }
        if let Some(code) = init.reap(&inputs.socket) {
            break code;
        }
    };
    stop_the_rest(&mut inputs, me, args.stop_timeout).await;
    tracing::info!(code, "baton init exits with its main process's status.");
    Ok(code)
}

impl Supervisor {
    /// Follows what a datagram says: a new main process, and anything to
    /// pass on to a manager above. Believed only from the main process,
    /// or from a live process that descends from init (the new process of
    /// an upgrade says it is ready once it serves); a `MAINPID=` only from
    /// the main process itself, and only for a live child of it (the new
    /// process of an upgrade is the old one's child).
    fn heard(&mut self, datagram: &notify::Datagram) {
        let from_main = datagram.sender == Some(self.main);
        let trusted = from_main || datagram.sender.is_some_and(|s| procs::live_descendant(s, self.me));
        if !trusted {
            self.ignore(
                datagram,
                "A notification came from a process that is neither the main process nor under baton init; ignored.",
            );
            return;
        }
        if let Some(pid) = notify::main_pid(&datagram.text)
            && pid != self.main
        {
            if !from_main {
                // The new process of an upgrade names itself once it
                // serves, maybe before the old one's word reaches init.
                tracing::debug!(sender = datagram.sender, pid, "A MAINPID= from other than the main process; ignored.");
            } else if procs::live_child(pid, self.main) {
                tracing::info!(
                    old_pid = self.main,
                    new_pid = pid,
                    sender = datagram.sender,
                    "The main process changed."
                );
                (self.main, self.lost_successor) = (pid, false);
                if let Some((sig, name)) = self.stopping {
                    tracing::info!(signal = name, pid, "Passing the stop on to the new main process too.");
                    procs::signal(pid, sig);
                }
            } else {
                // After an upgrade's commit the new process is adopted by
                // init once the old one exits: its parent is init then.
                let adopted = procs::live_child(pid, self.me);
                if adopted {
                    tracing::info!(old_pid = self.main, new_pid = pid, "The main process changed.");
                    (self.main, self.lost_successor) = (pid, false);
                    if let Some((sig, name)) = self.stopping {
                        tracing::info!(signal = name, pid, "Passing the stop on to the new main process too.");
                        procs::signal(pid, sig);
                    }
                } else {
                    tracing::warn!(
                        pid,
                        main_pid = self.main,
                        "The main process named as its successor a process that is not its live child; ignored."
                    );
                    self.lost_successor = true;
                }
            }
        }
        for line in datagram.text.lines().filter(|line| !line.starts_with("MAINPID=")) {
            tracing::debug!(sender = datagram.sender, said = line, "The main process notified.");
        }
        if let Some(outer) = &self.outer {
            let rest = notify::without_main_pid(&datagram.text);
            if !rest.is_empty() {
                crate::serve::notify::send_to(outer, &rest);
            }
        }
    }

    /// Counts a datagram ignored, and warns about it at most once a
    /// second.
    fn ignore(&mut self, datagram: &notify::Datagram, why: &'static str) {
        let (count, last) = &mut self.ignored;
        *count += 1;
        if last.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
            tracing::warn!(
                sender = datagram.sender,
                said = %datagram.text.chars().take(200).collect::<String>().escape_debug(),
                ignored = *count,
                "{why}"
            );
            (*count, *last) = (0, Some(std::time::Instant::now()));
        }
    }

    /// Reaps what has exited. When the main process is among them, reads
    /// every notification still queued (it may have named a successor
    /// before it exited), and returns its status if none took its place.
    fn reap(&mut self, socket: &notify::Socket) -> Option<u8> {
        let mut main_ended = None;
        for reaped in procs::reap().unwrap_or_default() {
            if reaped.pid == self.main {
                main_ended = Some(reaped.code);
            } else {
                tracing::info!(pid = reaped.pid, code = reaped.code, "Reaped a process that exited.");
            }
        }
        let code = main_ended?;
        for datagram in socket.queued() {
            self.heard(&datagram);
        }
        if procs::live_descendant(self.main, self.me) {
            tracing::info!(code, pid = self.main, "A former main process exited; its successor serves on.");
            return None;
        }
        if self.lost_successor && code == 0 {
            tracing::warn!(
                pid = self.main,
                "The main process exited after naming a successor that had exited: the service ended."
            );
            return Some(1);
        }
        tracing::info!(code, pid = self.main, "The main process exited.");
        Some(code)
    }
}

/// Once the main process has exited: SIGTERM to every process left under
/// init, and up to `within` for them to exit; SIGKILL past it, or on a
/// second SIGTERM or SIGINT.
async fn stop_the_rest(inputs: &mut Inputs, me: u32, within: Duration) {
    let left = procs::children(me);
    if left.is_empty() {
        return;
    }
    tracing::info!(pids = ?left, within_s = within.as_secs_f64(), "Stopping the processes left under baton init.");
    for &pid in &left {
        procs::signal(pid, Signal::TERM);
    }
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let Some(reaped) = procs::reap() else { return };
        for reaped in reaped {
            tracing::info!(pid = reaped.pid, code = reaped.code, "Reaped a process that exited.");
        }
        // The last one reaped: no SIGCHLD is left to wait for.
        if procs::children(me).is_empty() {
            return;
        }
        tokio::select! {
            // A SIGCHLD between the reap and this wait is not lost: the
            // stream keeps it.
            _ = inputs.child.recv() => continue,
            () = tokio::time::sleep_until(deadline) => {}
            Some((Signal::TERM | Signal::INT, name)) = inputs.signals.recv() => {
                tracing::info!(signal = name, "A second signal: killing what is left at once.");
            }
        }
        break;
    }
    let left = procs::children(me);
    tracing::warn!(pids = ?left, "Processes left under baton init did not exit in time; killing them.");
    for &pid in &left {
        procs::signal(pid, Signal::KILL);
    }
    // SIGKILL is not refused; a process stuck in the kernel is given a
    // moment more, not forever.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while procs::reap().is_some() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
