//! One line a second on stderr while the load runs: elapsed time,
//! requests, errors, the p99 of the last second, the version answering and
//! what the swap driver is doing.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::record::Live;
use super::report::table::count;
use super::swap::Phase;

/// Prints progress until the load stops.
pub fn spawn(live: Arc<Live>, phase: Phase) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("drill-progress".into())
        .spawn(move || {
            let mut last_requests = 0;
            let mut tick = 1;
            while !live.stopped() {
                let at = live.t0 + Duration::from_secs(tick);
                while std::time::Instant::now() < at && !live.stopped() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if live.stopped() {
                    break;
                }
                let requests = live.requests.load(Ordering::Relaxed);
                let errors = live.errors.load(Ordering::Relaxed);
                let p99 = live.take_p99_us().map_or("-".into(), |us| format!("{:.2} ms", us as f64 / 1000.0));
                let version = live.latest_version().unwrap_or_else(|| "-".into());
                let doing = phase.lock().map(|p| p.clone()).unwrap_or_default();
                let line = format!(
                    "[{tick:>4}s] {} requests (+{}/s), {} errors, p99 {p99}, answering {version}{}",
                    count(requests),
                    count(requests - last_requests),
                    count(errors),
                    if doing.is_empty() { String::new() } else { format!(" | {doing}") }
                );
                let _ = writeln!(std::io::stderr().lock(), "{line}");
                last_requests = requests;
                tick += 1;
            }
        })
        .expect("starting the progress thread")
}
