//! What `baton init` reads of other processes: whether one is alive and
//! descends from it (from `/proc`), which processes are its children, and
//! reaping every child that has exited.

use rustix::process::{Pid, WaitOptions, WaitStatus};

/// How far up a chain of parents [`descends_from`] looks before it gives
/// up: deeper than any tree baton makes.
const MAX_DEPTH: usize = 64;

/// A process's state letter and parent, from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields after it start after its last ')'.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let parent = rest.next()?.parse().ok()?;
    Some((state, parent))
}

/// Whether `pid` is a process that runs (not a zombie, not gone) and has
/// `ancestor` above it in its chain of parents.
pub fn live_descendant(pid: u32, ancestor: u32) -> bool {
    let Some((state, mut parent)) = stat(pid) else { return false };
    if matches!(state, 'Z' | 'X' | 'x') || pid == ancestor {
        return false;
    }
    for _ in 0..MAX_DEPTH {
        if parent == ancestor {
            return true;
        }
        if parent <= 1 {
            return false;
        }
        let Some((_, up)) = stat(parent) else { return false };
        parent = up;
    }
    false
}

/// Whether `pid` is a process that runs (not a zombie, not gone) whose
/// parent is `parent`.
pub fn live_child(pid: u32, parent: u32) -> bool {
    stat(pid).is_some_and(|(state, up)| up == parent && !matches!(state, 'Z' | 'X' | 'x'))
}

/// The processes whose parent is `parent`, zombies included.
pub fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|(_, p)| p == parent))
        .collect()
}

/// One child that was reaped, and how it ended.
#[derive(Clone, Copy, Debug)]
pub struct Reaped {
    /// Its pid.
    pub pid: u32,
    /// Its exit status as a shell reports it: the code it exited with, or
    /// 128 + the number of the signal that ended it.
    pub code: u8,
}

/// Reaps every child that has exited, never blocking. `None` once this
/// process has no child left at all.
pub fn reap() -> Option<Vec<Reaped>> {
    let mut reaped = Vec::new();
    loop {
        match rustix::process::wait(WaitOptions::NOHANG) {
            Ok(Some((pid, status))) => {
                reaped.push(Reaped { pid: pid.as_raw_nonzero().get() as u32, code: code(status) })
            }
            Ok(None) => return Some(reaped),
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::CHILD) if reaped.is_empty() => return None,
            Err(_) => return Some(reaped),
        }
    }
}

/// The status a shell would report for a process that ended so.
fn code(status: WaitStatus) -> u8 {
    match (status.exit_status(), status.terminating_signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        (None, None) => 1,
    }
}

/// Sends `signal` to `pid`; a process already gone is no error worth
/// reporting.
pub fn signal(pid: u32, signal: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}
