//! Signals to the processes a test starts, and stopping one for certain.
//!
//! `kill -STOP` returns once the signal is queued, not once the process has
//! stopped: the kernel wakes one thread, and only when that thread runs does
//! it ask the others to stop. Until then, on a busy machine, the rest of the
//! process goes on answering. A test that plays a hung process waits with
//! [`stop`] until every thread shows as stopped.

use std::process::Command;
use std::time::{Duration, Instant};

/// How long a process may take to stop after SIGSTOP before a test fails.
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// Sends signal `name` (`TERM`, `KILL`, `CONT`, …) to `pid` with `kill`,
/// and panics when it cannot be sent.
pub fn send(pid: u32, name: &str) {
    let sent = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status();
    assert!(sent.is_ok_and(|s| s.success()), "sending SIG{name} to {pid} failed");
}

/// Whether every thread of `pid` is stopped (or traced), as the kernel
/// shows it in `/proc/<pid>/task/*/stat`. False for a process that is gone.
pub fn is_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { return false };
        // The state follows the command name, which may hold spaces and
        // parentheses: it is the first field after the last ") ".
        let Some((_, rest)) = stat.rsplit_once(") ") else { return false };
        if !(rest.starts_with('T') || rest.starts_with('t')) {
            return false;
        }
        any = true;
    }
    any
}

/// Stops `pid` with SIGSTOP and waits until every one of its threads has
/// stopped, so that nothing of it runs from here on until it is continued.
/// Panics when it has not stopped within a bounded time.
pub fn stop(pid: u32) {
    send(pid, "STOP");
    let until = Instant::now() + STOP_WITHIN;
    while !is_stopped(pid) {
        assert!(Instant::now() < until, "process {pid} did not stop within {STOP_WITHIN:?} of SIGSTOP");
        std::thread::sleep(Duration::from_millis(2));
    }
}
