//! A probe of the machine the drill runs on (`--stall-probe LATE`).
//!
//! A swap window's slow requests are the server's fault only if the
//! machine itself kept running. On a virtual machine it does not always:
//! a virtual CPU that its host does not run stops every thread on it, the
//! load generator's and the server's alike, and a request that waits for
//! it looks like a slow server. So a thread of the drill sleeps
//! [`PERIOD`] in a loop and records every wake that comes more than LATE
//! after it was due. It runs under `SCHED_FIFO` where the drill may set
//! that (root, or `CAP_SYS_NICE`): then no thread of the guest running in
//! user space can keep it from a CPU. What still can is the machine (a
//! virtual CPU its host does not run) and a kernel section that cannot be
//! preempted, which may be the server's own, say a page fault while a
//! model loads: with no swap running a late wake is the machine's, in a
//! swap window it is the machine's or the swap's. Without the priority it
//! runs at normal priority, the report says so, and its records also count
//! waits for a busy CPU.
//!
//! It costs a wake a millisecond, about 20 µs on a CPU each (the median
//! on the benchmark machine, `perf sched`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::record::Live;

/// How long the probe sleeps each time.
pub const PERIOD: Duration = Duration::from_millis(1);

/// One late wake: when the sleep was due to end and how late it ended, ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    /// When the sleep should have ended, ns since the load started.
    pub due: u64,
    /// How much later it ended, ns.
    pub late: u64,
}

/// What the probe saw.
#[derive(Debug, Default)]
pub struct Probe {
    /// Whether it ran under `SCHED_FIFO`.
    pub realtime: bool,
    /// Why not, when it did not.
    pub note: Option<String>,
    /// The lateness recorded: wakes later than this count.
    pub late: Duration,
    /// Sleeps made.
    pub sleeps: u64,
    /// The late wakes, in time order.
    pub stalls: Vec<Stall>,
}

/// Starts the probe; it stops when the load does.
pub fn spawn(late: Duration, live: Arc<Live>) -> std::io::Result<std::thread::JoinHandle<Probe>> {
    std::thread::Builder::new().name("drill-stall-probe".into()).spawn(move || {
        let realtime = baton_core::sys::set_current_thread_realtime();
        let _ = baton_core::sys::set_current_thread_exact_timers();
        let mut probe = Probe {
            realtime: realtime.is_ok(),
            note: realtime.err().map(|e| format!("not real-time ({e}); its late wakes include waits for a busy CPU")),
            late,
            ..Probe::default()
        };
        let late = late.as_nanos() as u64;
        while !live.stopped() {
            let asked = Instant::now();
            std::thread::sleep(PERIOD);
            let due = live.offset(asked + PERIOD);
            let woke = live.now();
            probe.sleeps += 1;
            let over = woke.saturating_sub(due);
            if over >= late {
                probe.stalls.push(Stall { due, late: over });
            }
        }
        probe
    })
}
