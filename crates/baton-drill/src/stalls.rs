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
//! There is one such thread per CPU the drill may use, each kept to its
//! CPU: a virtual CPU can stop while the other runs, and a probe that goes
//! where the scheduler puts it sees only the stops of the CPU it is on
//! (docs/benchmarks-notebook.md, "Trims at serving priority", has the
//! drill that showed it). The probes' late wakes are merged into the times
//! when at least one CPU was stopped, which is what the report counts and
//! what it sets beside the slowest requests.
//!
//! Each probe wakes once a millisecond; what that costs a CPU is in
//! docs/drill.md.

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
#[derive(Clone, Debug, Default)]
pub struct Probe {
    /// Whether it ran under `SCHED_FIFO`.
    pub realtime: bool,
    /// Why not, when it did not.
    pub note: Option<String>,
    /// The lateness recorded: wakes later than this count.
    pub late: Duration,
    /// How many probes, one per CPU, saw this.
    pub cpus: usize,
    /// Sleeps made.
    pub sleeps: u64,
    /// The late wakes, in time order and not overlapping; merged from
    /// several probes, the times when at least one CPU was stopped.
    pub stalls: Vec<Stall>,
}

/// Starts one probe per CPU the drill may use; they stop when the load does.
pub fn spawn(late: Duration, live: Arc<Live>) -> std::io::Result<Probes> {
    let cpus = baton_core::threads::sys::allowed_cpus();
    // Where the CPUs cannot be read, one probe that goes where it is put.
    let cpus: Vec<Option<usize>> = if cpus.is_empty() { vec![None] } else { cpus.into_iter().map(Some).collect() };
    let threads = cpus
        .into_iter()
        .map(|cpu| {
            let live = Arc::clone(&live);
            std::thread::Builder::new().name("drill-stall-probe".into()).spawn(move || probe(cpu, late, &live))
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(Probes(threads))
}

/// The running probes.
#[derive(Debug)]
pub struct Probes(Vec<std::thread::JoinHandle<Probe>>);

impl Probes {
    /// Waits for every probe to stop and merges what they saw.
    pub fn join(self) -> Probe {
        merge(self.0.into_iter().map(|t| t.join().unwrap_or_default()).collect())
    }
}

/// One probe's loop, kept to `cpu` where given.
fn probe(cpu: Option<usize>, late: Duration, live: &Live) -> Probe {
    let pinned = cpu.map(baton_core::threads::sys::pin_current_thread).transpose();
    let realtime = baton_core::threads::sys::set_current_thread_realtime();
    let _ = baton_core::threads::sys::set_current_thread_exact_timers();
    let mut notes = Vec::new();
    if let Err(e) = &realtime {
        notes.push(format!("not real-time ({e}); its late wakes include waits for a busy CPU"));
    }
    if let (Err(e), Some(cpu)) = (&pinned, cpu) {
        notes.push(format!("not kept to CPU {cpu} ({e})"));
    }
    let mut probe = Probe {
        realtime: realtime.is_ok(),
        note: (!notes.is_empty()).then(|| notes.join("; ")),
        late,
        cpus: 1,
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
}

/// The probes' findings as one: real-time only if all were, their notes
/// and sleeps together, and their late wakes merged into the times when at
/// least one CPU was stopped (a stop of every CPU at once counts once).
fn merge(probes: Vec<Probe>) -> Probe {
    let mut spans: Vec<(u64, u64)> =
        probes.iter().flat_map(|p| p.stalls.iter().map(|s| (s.due, s.due + s.late))).collect();
    spans.sort_unstable();
    let mut stalls: Vec<Stall> = Vec::with_capacity(spans.len());
    for (from, to) in spans {
        match stalls.last_mut() {
            Some(last) if from <= last.due + last.late => last.late = last.late.max(to - last.due),
            _ => stalls.push(Stall { due: from, late: to - from }),
        }
    }
    // Probes that failed alike (no real-time priority for any) say so once.
    let mut notes: Vec<&str> = probes.iter().filter_map(|p| p.note.as_deref()).collect();
    notes.sort_unstable();
    notes.dedup();
    Probe {
        realtime: !probes.is_empty() && probes.iter().all(|p| p.realtime),
        note: (!notes.is_empty()).then(|| notes.join("; ")),
        late: probes.first().map_or(Duration::ZERO, |p| p.late),
        cpus: probes.iter().map(|p| p.cpus).sum(),
        sleeps: probes.iter().map(|p| p.sleeps).sum(),
        stalls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn one(stalls: Vec<Stall>) -> Probe {
        Probe { realtime: true, late: Duration::from_millis(2), cpus: 1, sleeps: 100, stalls, ..Probe::default() }
    }

    #[test]
    fn stops_seen_by_several_probes_merge_into_one_and_others_stay_apart() {
        let cpu0 = one(vec![Stall { due: 10 * MS, late: 5 * MS }, Stall { due: 40 * MS, late: 3 * MS }]);
        let cpu1 = one(vec![
            Stall { due: 11 * MS, late: 6 * MS }, // overlaps CPU 0's first: one stop from 10 to 17
            Stall { due: 25 * MS, late: 2 * MS }, // CPU 1 alone
            Stall { due: 43 * MS, late: 2 * MS }, // starts as CPU 0's second ends: joins it
        ]);
        let merged = merge(vec![cpu0, cpu1]);
        assert_eq!(
            merged.stalls,
            vec![
                Stall { due: 10 * MS, late: 7 * MS },
                Stall { due: 25 * MS, late: 2 * MS },
                Stall { due: 40 * MS, late: 5 * MS },
            ]
        );
        assert_eq!((merged.cpus, merged.sleeps, merged.realtime), (2, 200, true));
    }

    #[test]
    fn one_probe_without_priority_makes_the_whole_not_real_time() {
        let mut slow = one(Vec::new());
        slow.realtime = false;
        slow.note = Some("not real-time".into());
        let merged = merge(vec![one(Vec::new()), slow.clone(), slow]);
        assert!(!merged.realtime);
        assert_eq!(merged.note.as_deref(), Some("not real-time"), "the same note from two probes, once");
    }

    #[test]
    fn a_stop_inside_another_keeps_the_longer() {
        let merged =
            merge(vec![one(vec![Stall { due: 0, late: 20 * MS }]), one(vec![Stall { due: 5 * MS, late: 3 * MS }])]);
        assert_eq!(merged.stalls, vec![Stall { due: 0, late: 20 * MS }]);
    }
}
