//! Loading threads that step off the CPU while other threads wait for one:
//! opt-in, and Linux only.
//!
//! `SCHED_IDLE` does not stop a loader the kernel has already picked from
//! keeping its core until the next scheduler tick, with a serving thread
//! queued beside it. While a thread builds or frees a version it can hold an
//! [`Armed`] timer that interrupts it with a signal every quantum of its CPU
//! time; when more threads are runnable than there are CPUs it sleeps for a
//! pause, off the run queue, and while requests are being served it keeps
//! to a share of one CPU.
//!
//! It is off by default ([`StepAside::OFF`]; `baton serve
//! --loader-step-aside` turns it on). The signal lands at any instruction,
//! inside ONNX Runtime too, and `nanosleep`, `poll` and timed futex waits
//! return `EINTR` under a signal whatever `SA_RESTART` says: code that does
//! not retry them can misbehave. What it buys and costs, and when to turn
//! it on: docs/hot-swap.md, "Stepping aside"; measurements in
//! docs/benchmarks-notebook.md §2 and §3.
//!
//! The machinery (a POSIX timer per thread, a real-time signal) exists on
//! Linux only; elsewhere arming does nothing and a warning says so.

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as imp;
#[cfg(not(target_os = "linux"))]
mod portable;
#[cfg(not(target_os = "linux"))]
use portable as imp;

use std::time::Duration;

pub use imp::{Armed, Hold, armed_here, hold, note_request, paused_here};

/// When a loading thread steps aside, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepAside {
    /// CPU time the thread may use before it looks whether others wait;
    /// also how often it is interrupted to look. Zero turns stepping aside off.
    pub quantum: Duration,
    /// How long it sleeps when others wait.
    pub pause: Duration,
    /// The share of one CPU, in percent, the thread keeps while requests
    /// are being served ([`note_request`] within [`SERVING_RECENT`]):
    /// after each quantum of CPU it sleeps long enough to use no more.
    /// 100 does not limit it.
    pub serving_share: u8,
}

impl StepAside {
    /// The settings `--loader-step-aside` turns on: look every 250 µs of CPU
    /// time, step aside for 200 µs, and keep to half a CPU while requests
    /// are served. Why these values: docs/hot-swap.md, "Stepping aside".
    pub const STANDARD: StepAside =
        StepAside { quantum: Duration::from_micros(250), pause: Duration::from_micros(200), serving_share: 50 };

    /// The shortest quantum [`StepAside::arm`] uses. A relative sleep that a
    /// signal interrupts is restarted for the time left and counted to its
    /// latest end (its timer slack after the requested one), so a thread
    /// interrupted more often than that never finishes a sleep. Armed
    /// threads also get a timer slack of 1 ns, so their sleeps end when asked.
    pub const MIN_QUANTUM: Duration = Duration::from_micros(100);

    /// Never step aside: the default.
    pub const OFF: StepAside = StepAside { quantum: Duration::ZERO, pause: Duration::ZERO, serving_share: 100 };

    /// Whether this policy steps aside at all.
    pub fn is_on(&self) -> bool {
        !self.quantum.is_zero() && !self.pause.is_zero()
    }

    /// Starts stepping aside on the calling thread until the returned guard
    /// is dropped. Arm it only around work: the timer interrupts the thread
    /// every quantum, working or blocked. Where the timer or the signal is
    /// not available (any system but Linux among them), a warning says so
    /// once and the guard does nothing.
    ///
    /// A quantum shorter than [`StepAside::MIN_QUANTUM`] is raised to it.
    /// Arming a thread that is already armed does nothing: the outer guard
    /// keeps the thread armed until it is dropped.
    pub fn arm(self) -> Armed {
        if !self.is_on() || armed_here() {
            return Armed::none();
        }
        imp::arm(self)
    }
}

impl Default for StepAside {
    fn default() -> Self {
        StepAside::OFF
    }
}

/// How often loading threads have stepped aside, since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Times it stepped aside: others waited, or requests were being
    /// served and it had used its share.
    pub steps: u64,
    /// Wall time spent stepped aside, to the return to a CPU.
    pub paused: Duration,
    /// Times it would have stepped aside but had used up what it may spend
    /// stepped aside ([`MAX_PAUSED_PER_CPU`]) and kept running.
    pub declined: u64,
}

/// The process-wide counts; all zero while stepping aside is off.
pub fn counts() -> Counts {
    imp::counts()
}

/// Time stepped aside, counted to the return to the CPU, that an armed
/// thread may spend per unit of CPU time it has used since it was armed:
/// a `SCHED_IDLE` thread that leaves a full machine may wait long to get a
/// CPU back, and without a cap a load could starve for as long as the
/// machine stays full.
pub const MAX_PAUSED_PER_CPU: u64 = 10;

/// How recent the last request must be for the server to count as serving.
pub const SERVING_RECENT: Duration = Duration::from_millis(100);

/// The sleep after each `quantum` of CPU that leaves a thread `share` percent
/// of a CPU; none for 100 or more, and none for 0, which would never run.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn share_pause(quantum: Duration, share: u8) -> u64 {
    match share {
        0 | 100.. => 0,
        share => nanos(quantum) * u64::from(100 - share) / u64::from(share),
    }
}

#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn nanos(span: Duration) -> u64 {
    u64::try_from(span.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_is_the_default_and_arms_nothing() {
        assert_eq!(StepAside::default(), StepAside::OFF);
        assert!(!StepAside::OFF.is_on());
        assert!(StepAside::STANDARD.is_on());
        assert!(!StepAside::OFF.arm().is_active());
        assert!(!StepAside { quantum: Duration::from_micros(100), pause: Duration::ZERO, serving_share: 100 }.is_on());
    }

    #[test]
    fn the_serving_share_sets_the_sleep_after_each_quantum() {
        let quantum = Duration::from_micros(250);
        assert_eq!(share_pause(quantum, 100), 0);
        assert_eq!(share_pause(quantum, 50), 250_000);
        assert_eq!(share_pause(quantum, 25), 750_000);
        assert_eq!(share_pause(quantum, 10), 2_250_000);
    }
}
