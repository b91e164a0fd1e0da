//! The swap driver: after the warm-up, makes each swap in turn, notes when
//! it was triggered and when its action returned, and waits for the new
//! version to answer before the next one, so swap windows never overlap.

pub mod action;
pub mod shell;
pub mod upgrade;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use action::Action;

use super::args::DrillArgs;
use super::record::Live;

/// One swap as the driver saw it. Times are ns since the load started.
#[derive(Clone, Debug)]
pub struct SwapRecord {
    /// 1-based.
    pub index: usize,
    /// When the schedule wanted it.
    pub scheduled: u64,
    /// When the action started.
    pub trigger: u64,
    /// When the action returned.
    pub done: u64,
    /// Whether the action succeeded.
    pub ok: bool,
    /// What the action said, or what went wrong.
    pub detail: String,
    /// The version this swap should bring, when known.
    pub version: Option<String>,
    /// An upgrade's handover.
    pub handover: Option<upgrade::Handover>,
}

/// When the swaps happen.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// How many swaps.
    pub count: usize,
    /// Steady load before the first.
    pub warmup: Duration,
    /// Between triggers.
    pub interval: Duration,
    /// Steady time kept between a window's end and the next trigger.
    pub gap: Duration,
    /// W: how long after a commit its window lasts.
    pub window: Duration,
    /// Steady load after the last window.
    pub tail: Duration,
    /// The longest wait for a new version to answer.
    pub timeout: Duration,
}

impl Schedule {
    /// The schedule the options describe.
    pub fn from_args(args: &DrillArgs) -> Schedule {
        Schedule {
            count: args.swaps,
            warmup: args.warmup,
            interval: args.swap_interval,
            gap: args.swap_gap,
            window: args.window,
            tail: args.tail,
            timeout: args.swap_timeout,
        }
    }
}

/// What the driver is doing, for the progress line.
pub type Phase = Arc<Mutex<String>>;

/// Says what the driver is doing now.
pub fn set(phase: &Phase, text: String) {
    *phase.lock().unwrap_or_else(|e| e.into_inner()) = text;
}

/// Sleeps until `at_ns`; false if the load stopped first.
pub fn wait_until(live: &Live, at_ns: u64) -> bool {
    loop {
        if live.stopped() {
            return false;
        }
        let now = live.now();
        if now >= at_ns {
            return true;
        }
        std::thread::sleep(Duration::from_nanos(at_ns - now).min(Duration::from_millis(10)));
    }
}

/// Runs the swaps on a thread; once the last window and the tail are
/// over, stops the load. With no swaps it leaves the load to its bounds.
pub fn spawn(
    action: Action,
    schedule: Schedule,
    versions: Vec<String>,
    live: Arc<Live>,
    phase: Phase,
) -> std::thread::JoinHandle<Vec<SwapRecord>> {
    std::thread::Builder::new()
        .name("drill-swaps".into())
        .spawn(move || drive(&action, &schedule, &versions, &live, &phase))
        .expect("starting the swap thread")
}

fn drive(action: &Action, schedule: &Schedule, versions: &[String], live: &Live, phase: &Phase) -> Vec<SwapRecord> {
    let mut records = Vec::new();
    if schedule.count == 0 {
        return records;
    }
    set(phase, "warm-up".into());
    let window = schedule.window.as_nanos() as u64;
    let gap = schedule.gap.as_nanos() as u64;
    // The end of the previous swap's window; none before the first.
    let mut window_end = None;
    for index in 0..schedule.count {
        let scheduled = (schedule.warmup + schedule.interval * index as u32).as_nanos() as u64;
        let earliest = window_end.map_or(0, |end| end + gap);
        if !wait_until(live, scheduled.max(earliest)) {
            return records;
        }
        let listed = (!versions.is_empty()).then(|| versions[index % versions.len()].as_str());
        let n = index + 1;
        set(
            phase,
            format!("swap {n}/{}: triggered{}", schedule.count, listed.map(|v| format!(" → {v}")).unwrap_or_default()),
        );
        let trigger = live.now();
        let outcome = action.run(index, listed);
        let done = live.now();
        let version = listed.map(str::to_owned).or(outcome.version.clone());
        let mut commit = done;
        if let (true, Some(v)) = (outcome.ok, &version) {
            set(phase, format!("swap {n}/{}: waiting for {v} to answer", schedule.count));
            let limit = trigger + schedule.timeout.as_nanos() as u64;
            while !live.serving_since(v, trigger) && live.now() < limit && !live.stopped() {
                std::thread::sleep(Duration::from_millis(1));
            }
            commit = commit.max(live.now());
        }
        window_end = Some(commit + window);
        set(phase, format!("swap {n}/{}: {}", schedule.count, if outcome.ok { "done" } else { "FAILED" }));
        records.push(SwapRecord {
            index: n,
            scheduled,
            trigger,
            done,
            ok: outcome.ok,
            detail: outcome.detail,
            version,
            handover: outcome.handover,
        });
    }
    set(phase, "tail".into());
    if wait_until(live, window_end.unwrap_or(0) + schedule.tail.as_nanos() as u64) {
        live.stop.store(true, Ordering::Relaxed);
    }
    records
}
