//! Shutdown, shaped for rolling restarts:
//!
//! 1. On SIGTERM or SIGINT the server reports not ready at once and the
//!    repository watcher stops; with `--shutdown-delay` it keeps serving and
//!    accepting for that long, so load balancers that poll readiness stop
//!    sending traffic before the listeners close.
//! 2. Then it stops accepting, ends event and inference streams, and gives
//!    requests in flight up to `--shutdown-timeout`.
//! 3. Within the same timeout it waits for the watcher and for operations
//!    running on models (a load, a drain); past it, it exits without them.
//!    Nothing a load builds is published before its commit, so a load cut
//!    short leaves nothing behind.
//!
//! A second signal at any point exits at once with status 128 + the
//! signal's number, as a shell reports a process killed by it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;

use crate::app::App;

/// The SIGTERM and SIGINT handlers.
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Installs the handlers: from now on these signals no longer kill the
    /// process, they reach [`on_signals`].
    pub fn install() -> anyhow::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// The next signal: its name and number (15 and 2 on every Linux).
    async fn next(&mut self) -> (&'static str, i32) {
        tokio::select! {
            _ = self.term.recv() => ("SIGTERM", 15),
            _ = self.int.recv() => ("SIGINT", 2),
        }
    }
}

/// Runs the shutdown sequence on the first signal, or once an upgrade
/// has handed the service over (steps 1 and 2 above, up to
/// [`App::start_draining`]), then exits at once on a second signal.
/// `stop_watching` is dropped when it begins, which stops the watcher.
///
/// A signal and an upgrade's commit exclude each other: a signal that
/// comes first makes the upgrade running fail, and a commit that comes
/// first makes the next signal the first one (a manager's SIGTERM may
/// reach this process, the main one until the commit, as well as the
/// new one).
pub async fn on_signals(mut signals: Signals, app: Arc<App>, delay: Duration, stop_watching: impl Send) {
    let first = tokio::select! {
        signal = signals.next() => Some(signal),
        () = app.wait_handed_over() => None,
    };
    // False: the upgrade committed first, the service goes on.
    let stopping = first.is_some() && app.claim_stop();
    let mut signalled = first.is_some();
    // Not ready first, then say so: whoever reads the line can rely on it.
    app.report_not_ready();
    // A new process the old one gave up on leaves the service to the old one.
    if stopping && !app.awaiting_handover() {
        super::notify::notify("STOPPING=1");
    }
    drop(stop_watching);
    let cause = first.map_or("the upgrade's handover", |(name, _)| name);
    if delay.is_zero() {
        tracing::info!(signal = cause, "Shutting down: not ready from now on, finishing requests in flight.");
    } else {
        tracing::info!(
            signal = cause,
            delay_s = delay.as_secs_f64(),
            "Shutting down: not ready from now on, still serving and accepting until the shutdown delay is over."
        );
    }
    let deadline = Instant::now() + delay;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => break,
            signal = signals.next() => signalled = first_or_exit(signalled, signal),
        }
    }
    if !delay.is_zero() {
        tracing::info!("The shutdown delay is over: no longer accepting connections, finishing requests in flight.");
    }
    app.start_draining();
    loop {
        signalled = first_or_exit(signalled, signals.next().await);
    }
}

/// A signal while shutting down: exits at once when one came before,
/// else it is the first (the shutdown began with a handover).
fn first_or_exit(signalled: bool, signal: (&'static str, i32)) -> bool {
    if signalled {
        exit_at_once(signal);
    }
    tracing::info!(signal = signal.0, "A signal while shutting down after a handover: a second one exits at once.");
    true
}

/// The shutdown sequence of a server inside a test's process: as for a
/// first signal, when `stopped` resolves; there is no second signal.
pub async fn on_stop(stopped: impl Future<Output = ()>, app: Arc<App>, delay: Duration, stop_watching: impl Send) {
    stopped.await;
    app.report_not_ready();
    drop(stop_watching);
    tokio::time::sleep(delay).await;
    app.start_draining();
}

/// Blocks (`true`) or unblocks SIGTERM, SIGINT and SIGUSR2 on this
/// thread: blocked before any other thread starts, they stay pending
/// until unblocked, by then with handlers. Threads started meanwhile keep
/// them blocked; the kernel delivers them to this one. Children start
/// with no signal blocked (the standard library clears the mask).
pub fn hold_signals(hold: bool) {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
    let mut set = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGUSR2] {
        set.add(signal);
    }
    let how = if hold { SigmaskHow::SIG_BLOCK } else { SigmaskHow::SIG_UNBLOCK };
    if let Err(error) = pthread_sigmask(how, Some(&set), None) {
        tracing::warn!(%error, hold, "Could not change the signal mask.");
    }
}

/// Whether a SIGTERM or SIGINT waits, blocked by [`hold_signals`].
pub fn stop_pending() -> bool {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigpending fills the sigset_t it is given, which `set` is;
    // it is read only once filled, and sigismember only reads it.
    #[allow(unsafe_code)]
    unsafe {
        if libc::sigpending(set.as_mut_ptr()) != 0 {
            return false;
        }
        let set = set.assume_init();
        libc::sigismember(&set, libc::SIGTERM) == 1 || libc::sigismember(&set, libc::SIGINT) == 1
    }
}

fn exit_at_once((name, number): (&'static str, i32)) -> ! {
    tracing::warn!(signal = name, "A second signal: exiting at once, without finishing requests in flight.");
    std::process::exit(128 + number)
}

/// Serves until shutdown begins (or a server fails), then gives `servers`
/// (which stop accepting when the app starts draining) until `grace` to
/// finish their requests in flight, and the watcher and the operations on
/// models until the same deadline.
pub async fn drain(
    app: &App,
    servers: impl Future<Output = anyhow::Result<()>>,
    watcher: std::thread::JoinHandle<()>,
    grace: Duration,
) -> anyhow::Result<()> {
    let mut stopped = app.shutdown_signal();
    tokio::pin!(servers);
    let finished = tokio::select! {
        biased;
        result = &mut servers => Some(result),
        _ = stopped.wait_for(|stop| *stop) => None,
    };
    let deadline = Instant::now() + grace;
    let finished = match finished {
        Some(result) => Some(result),
        None => tokio::time::timeout_at(deadline, &mut servers).await.ok(),
    };
    match finished {
        Some(result) => result?,
        None => tracing::warn!(timeout_s = grace.as_secs(), "Shutdown timed out with requests still in flight."),
    }
    settle(app, watcher, deadline).await;
    Ok(())
}

/// Waits until the watcher has stopped and no model has an operation
/// running, or until `deadline`, whichever comes first.
async fn settle(app: &App, watcher: std::thread::JoinHandle<()>, deadline: Instant) {
    loop {
        let busy: Vec<String> = app.registry.statuses().into_iter().filter(|s| s.busy).map(|s| s.name).collect();
        if watcher.is_finished() && busy.is_empty() {
            let _ = watcher.join();
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                models = %busy.join(","),
                "Shutdown timed out with a model operation still running; exiting without it (nothing is published before its commit)."
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
