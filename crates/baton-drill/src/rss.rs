//! The server's resident set size over time: `VmRSS` from
//! `/proc/PID/status` of the process and of every process it started,
//! sampled on a thread of its own.
//!
//! The processes followed can change while the drill runs: `--swap
//! upgrade` adds the process that replaces the server, and drops the old
//! one once it has exited, so that both count while both live.
//!
//! Children count because some servers run their models in worker
//! processes (MLServer's inference pool): the main process's RSS alone
//! would miss every model. Pages a forked child still shares with its
//! parent count once per process, so the sum overstates absolute memory;
//! what the drill reports is its growth.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;

use super::record::Live;

/// The processes whose memory is sampled (each with its descendants).
pub type Followed = Arc<Mutex<Vec<u32>>>;

/// RSS samples: (ns since the load started, bytes).
#[derive(Debug, Default)]
pub struct Samples {
    /// Every process followed, in the order they were first followed.
    pub pids: Vec<u32>,
    /// The samples, in time order.
    pub points: Vec<(u64, u64)>,
    /// Why sampling stopped early, if it did (e.g. the process exited).
    pub stopped: Option<String>,
}

/// The `VmRSS` of `pid` plus that of all its descendants, in bytes.
pub fn read_rss(pid: u32) -> anyhow::Result<u64> {
    read_rss_of(&[pid])
}

/// The `VmRSS` of every process in `pids` and of their descendants, each
/// process counted once; an error when none of `pids` can be read.
pub fn read_rss_of(pids: &[u32]) -> anyhow::Result<u64> {
    let mut all: Vec<u32> = Vec::new();
    let mut last_error = None;
    for &pid in pids {
        match process_rss(pid) {
            Ok(_) => {
                all.push(pid);
                all.extend(descendants(pid));
            }
            Err(e) => last_error = Some(e),
        }
    }
    if all.is_empty() {
        return Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no process to follow")));
    }
    all.sort_unstable();
    all.dedup();
    // A process may exit between listing and reading: it no longer counts.
    Ok(all.into_iter().filter_map(|pid| process_rss(pid).ok()).sum())
}

/// When process `pid` started, in clock ticks since the machine booted
/// (field 22 of `/proc/PID/stat`): the same number in every pid
/// namespace, so a pid a server reports from inside a container can be
/// told from the host's process of that number. `None` off Linux or for a
/// process that cannot be read.
pub fn start_time(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&text)
}

/// Field 22 of a `/proc/PID/stat` line. The command (field 2) may hold
/// spaces and parentheses, so fields are counted after its last `)`.
fn parse_start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn process_rss(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_vm_rss(&text).with_context(|| format!("{path} has no VmRSS line"))
}

/// Every process below `pid`, from `/proc/PID/task/TID/children` (each
/// thread lists the children it started).
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else { continue };
        for task in tasks.flatten() {
            let Ok(text) = std::fs::read_to_string(task.path().join("children")) else { continue };
            for child in text.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                if !found.contains(&child) {
                    found.push(child);
                    queue.push(child);
                }
            }
        }
    }
    found
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line["VmRSS:".len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Samples the followed processes every `interval` until the load stops,
/// or until none of them can be read.
pub fn spawn(followed: Followed, interval: Duration, live: Arc<Live>) -> std::thread::JoinHandle<Samples> {
    std::thread::Builder::new()
        .name("drill-rss".into())
        .spawn(move || {
            let mut samples = Samples::default();
            let mut next = live.t0;
            loop {
                let at = live.now();
                let pids = followed.lock().unwrap_or_else(|e| e.into_inner()).clone();
                for &pid in &pids {
                    if !samples.pids.contains(&pid) {
                        samples.pids.push(pid);
                    }
                }
                match read_rss_of(&pids) {
                    Ok(bytes) => samples.points.push((at, bytes)),
                    Err(e) => {
                        samples.stopped = Some(format!("{e:#}"));
                        break;
                    }
                }
                if live.stopped() {
                    break;
                }
                next += interval;
                let now = std::time::Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
            samples
        })
        .expect("starting the RSS sampler thread")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_counted_after_the_command() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 9 0 0 0 0 0 0 0 20 0 1 0 123456 1000 10";
        assert_eq!(parse_start_time(stat), Some(123_456));
        assert_eq!(parse_start_time("42 (x) S 1"), None);
        assert!(start_time(std::process::id()).is_some_and(|t| t > 0));
    }

    #[test]
    fn parses_vm_rss() {
        let status = "Name:\tbaton\nVmPeak:\t  9000 kB\nVmRSS:\t   51234 kB\nThreads:\t9\n";
        assert_eq!(parse_vm_rss(status), Some(51234 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert!(read_rss(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn counts_child_processes() {
        // A shell that starts a child and waits: neither allocates while measured.
        let mut shell = std::process::Command::new("sh").args(["-c", "sleep 30 & wait"]).spawn().expect("starting sh");
        let pid = shell.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut found = descendants(pid);
        while found.is_empty() && std::time::Instant::now() < deadline {
            std::thread::yield_now();
            found = descendants(pid);
        }
        let (alone, with_child) = (process_rss(pid), read_rss(pid));
        for child in &found {
            let _ = std::process::Command::new("kill").arg(child.to_string()).status();
        }
        let _ = shell.kill();
        let _ = shell.wait();
        assert_eq!(found.len(), 1, "sh should have one child, found {found:?}");
        assert!(with_child.unwrap() > alone.unwrap(), "the child's memory is not counted");
    }
}
