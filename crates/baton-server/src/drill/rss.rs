//! The server's resident set size over time: `VmRSS` from
//! `/proc/PID/status`, sampled on a thread of its own.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::record::Live;

/// RSS samples: (ns since the load started, bytes).
#[derive(Debug, Default)]
pub struct Samples {
    /// The samples, in time order.
    pub points: Vec<(u64, u64)>,
    /// Why sampling stopped early, if it did (e.g. the process exited).
    pub stopped: Option<String>,
}

/// The `VmRSS` of `pid`, in bytes.
pub fn read_rss(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_vm_rss(&text).with_context(|| format!("{path} has no VmRSS line"))
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line["VmRSS:".len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Samples `pid` every `interval` until the load stops.
pub fn spawn(pid: u32, interval: Duration, live: Arc<Live>) -> std::thread::JoinHandle<Samples> {
    std::thread::Builder::new()
        .name("drill-rss".into())
        .spawn(move || {
            let mut samples = Samples::default();
            let mut next = live.t0;
            loop {
                let at = live.now();
                match read_rss(pid) {
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
    fn parses_vm_rss() {
        let status = "Name:\tbaton\nVmPeak:\t  9000 kB\nVmRSS:\t   51234 kB\nThreads:\t9\n";
        assert_eq!(parse_vm_rss(status), Some(51234 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert!(read_rss(std::process::id()).unwrap() > 0);
    }
}
