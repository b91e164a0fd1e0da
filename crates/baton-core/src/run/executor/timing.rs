//! The latency a rollout's guard samples: how long an engine's run took,
//! on and off the CPU, wherever it ran, without its waits for a CPU.
//!
//! A run is timed on the thread that waits for it (a session thread, an
//! inline caller, the shadow runner): its wall time, less that thread's
//! wait for a CPU while runnable as the kernel counts it
//! (`/proc/thread-self/schedstat`). What is left is the thread's CPU time
//! plus every moment it was blocked on the run: on the engine's own
//! threads, a sleep, a page read from disk, a lock, another device. For a
//! run that never blocks it equals the thread's CPU time, the sample of
//! earlier releases, so a busy machine's preemptions still do not count.
//!
//! A call into a worker process replaces the time the thread spent waiting
//! for the answer with the worker's own timing of its run, taken the same
//! way on the worker's thread and sent with the answer ([`ran_elsewhere`]):
//! the hop's copies on this side count as CPU time, the run as the worker
//! timed it, and neither side's waits for a CPU (a wake-up, a yield while
//! looking for the answer) count.
//!
//! The worker's report comes from another process and is bounded both
//! ways: it counts for at most the wall time this thread waited for it
//! (the wait begins before the call is sent, so an honest worker's part
//! always falls inside it; a report that claims more is cut down and
//! counted, [`trimmed_reports`]), and however little it claims, a sample
//! is never below this thread's own CPU time over the run.
//!
//! Where the kernel keeps no count of a thread's wait for a CPU (or the
//! thread could not open it: it tries again, and says so once in the log),
//! the sample is the wall time, and a worker's report replaces nothing.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

thread_local! {
    /// This thread's `/proc/thread-self/schedstat`, opened once: the link
    /// resolves to the thread that opens it, and a read of an open file is
    /// about as cheap as reading the thread's CPU clock.
    static SCHEDSTAT: RefCell<Schedstat> = const { RefCell::new(Schedstat::Unopened) };
    /// For the run in progress: the time this thread waited on other
    /// processes (less its waits for a CPU meanwhile), and what they
    /// reported their part took instead.
    static REPLACED: Cell<(Duration, Duration)> = const { Cell::new((Duration::ZERO, Duration::ZERO)) };
}

/// Reports from other processes cut down to the wait they replace,
/// process-wide (a worker that claims more than it could have).
static TRIMMED: AtomicU64 = AtomicU64::new(0);

/// A thread's count of its waits for a CPU, as far as it got opening it.
enum Schedstat {
    Unopened,
    Open(File),
    /// The open failed; tried again after this many more reads.
    Failed(u32),
}

/// Reads between two tries to open a thread's count that failed to open
/// (out of descriptors during a flood, say; or a kernel without it).
const RETRY_AFTER: u32 = 1024;

/// Whether a failed open was logged, once for the process.
static SAID: std::sync::Once = std::sync::Once::new();

/// How long the calling thread has waited for a CPU while runnable since
/// it started; `None` where the kernel does not count it, or its count
/// could not be opened (tried again every [`RETRY_AFTER`] reads).
pub fn own_run_delay() -> Option<Duration> {
    SCHEDSTAT.with(|cell| {
        let mut state = cell.borrow_mut();
        match &mut *state {
            Schedstat::Failed(left) if *left > 0 => {
                *left -= 1;
                return None;
            }
            Schedstat::Open(_) => {}
            _ => match File::open("/proc/thread-self/schedstat") {
                Ok(file) => *state = Schedstat::Open(file),
                Err(error) => {
                    SAID.call_once(|| {
                        tracing::warn!(
                            %error,
                            "A thread's count of its waits for a CPU cannot be read; its runs' latency samples are \
                             their wall time until it can, which a busy machine inflates."
                        );
                    });
                    *state = Schedstat::Failed(RETRY_AFTER);
                    return None;
                }
            },
        }
        let Schedstat::Open(file) = &*state else { return None };
        let mut buffer = [0u8; 96];
        let read = file.read_at(&mut buffer, 0).ok()?;
        let text = std::str::from_utf8(&buffer[..read]).ok()?;
        let nanos: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
        Some(Duration::from_nanos(nanos))
    })
}

/// A wait of this thread on another process, timed from [`Waiting::start`]
/// to [`Waiting::answered`].
#[derive(Debug)]
pub struct Waiting {
    started: Instant,
    delay: Option<Duration>,
}

impl Waiting {
    /// Starts timing a wait for another process's answer.
    pub fn start() -> Waiting {
        let started = Instant::now();
        Waiting { started, delay: own_run_delay() }
    }

    /// The answer came, with `ran`, the other process's timing of its part
    /// (`None`: it sent none, and the wait counts as it is).
    pub fn answered(self, ran: Option<Duration>) {
        let (Some(before), Some(now), Some(ran)) = (self.delay, own_run_delay(), ran) else { return };
        let wall = self.started.elapsed();
        ran_elsewhere(wall, wall.saturating_sub(now.saturating_sub(before)), ran);
    }
}

/// Tells the run in progress on this thread that it waited `wall` on
/// another process, `own` of it not waiting for a CPU itself, and that the
/// other process timed its part at `ran`: the sample counts `ran` in place
/// of `own`, at most `wall` (no part of a call outlasts the wait for it).
pub fn ran_elsewhere(wall: Duration, own: Duration, ran: Duration) {
    let counted = if ran > wall {
        TRIMMED.fetch_add(1, Ordering::Relaxed);
        wall
    } else {
        ran
    };
    REPLACED.with(|cell| {
        let (o, r) = cell.get();
        cell.set((o.saturating_add(own.min(wall)), r.saturating_add(counted)));
    });
}

/// How many reports from other processes were cut down since this process
/// started, because they claimed more than the wait they replace.
pub fn trimmed_reports() -> u64 {
    TRIMMED.load(Ordering::Relaxed)
}

/// A run's clock: started before the run, stopped after it, on the thread
/// that waits for it.
#[derive(Debug)]
pub struct Stopwatch {
    started: Instant,
    cpu: Option<Duration>,
    delay: Option<Duration>,
}

/// What a stopped [`Stopwatch`] read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// The wall time of the run, on the waiting thread.
    pub wall: Duration,
    /// The waiting thread's CPU time over the run, if the platform keeps it.
    pub cpu: Option<Duration>,
    /// The waiting thread's wait for a CPU over the run, if counted.
    pub delay: Option<Duration>,
    /// The time spent waiting on other processes, less waits for a CPU,
    /// and what those processes' reports counted instead.
    pub replaced: (Duration, Duration),
    /// The sample: `wall` less `delay`, with `replaced.0` replaced by
    /// `replaced.1`, and at least `cpu`.
    pub sample: Duration,
}

impl Stopwatch {
    /// Starts timing a run on this thread.
    pub fn start() -> Stopwatch {
        REPLACED.with(|cell| cell.set((Duration::ZERO, Duration::ZERO)));
        // The wall clock is read outside the thread's counts, so that what
        // it spans holds what they span.
        let started = Instant::now();
        let delay = own_run_delay();
        let cpu = crate::threads::sys::thread_cpu_time();
        Stopwatch { started, cpu, delay }
    }

    /// Stops it: the run's sample.
    pub fn stop(self) -> Duration {
        self.read().sample
    }

    /// Stops it: every reading.
    pub fn read(self) -> Reading {
        let cpu = crate::threads::sys::thread_cpu_time().zip(self.cpu).map(|(now, then)| now.saturating_sub(then));
        let delay = own_run_delay().zip(self.delay).map(|(now, then)| now.saturating_sub(then));
        let wall = self.started.elapsed();
        let replaced = REPLACED.with(|cell| cell.replace((Duration::ZERO, Duration::ZERO)));
        let own = wall.saturating_sub(delay.unwrap_or_default());
        // However another process reports, the sample keeps this thread's
        // own CPU time.
        let sample = own.saturating_sub(replaced.0).saturating_add(replaced.1).max(cpu.unwrap_or_default());
        Reading { wall, cpu, delay, replaced, sample }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin(for_cpu: Duration) {
        let start = crate::threads::sys::thread_cpu_time().unwrap();
        while crate::threads::sys::thread_cpu_time().unwrap() - start < for_cpu {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn a_run_on_the_cpu_is_its_cpu_time_and_a_sleep_counts() {
        let watch = Stopwatch::start();
        spin(Duration::from_millis(3));
        let busy = watch.read();
        let watch = Stopwatch::start();
        std::thread::sleep(Duration::from_millis(5));
        let slept = watch.read();
        assert!(busy.sample >= Duration::from_millis(2), "{busy:?}");
        assert!(slept.sample >= Duration::from_millis(5), "{slept:?}");
        assert!(busy.sample <= busy.wall && slept.sample <= slept.wall);
        if busy.delay.is_some() {
            // Counted so, the spin is its CPU time: what it waited for a
            // CPU is not in it (a little of the clocks' own reads is).
            let cpu = busy.cpu.unwrap();
            assert!(busy.sample.abs_diff(cpu) < Duration::from_millis(1), "{busy:?}");
        }
    }

    #[test]
    fn a_wait_on_another_process_counts_as_what_it_reported_at_most_the_wait() {
        if own_run_delay().is_none() {
            eprintln!("this kernel does not count a thread's wait for a CPU: nothing is replaced");
            return;
        }
        // 10 ms waiting on a worker that says its run took 4 ms: the sample
        // is about 4 ms, plus this thread's own reads.
        let watch = Stopwatch::start();
        let waiting = Waiting::start();
        std::thread::sleep(Duration::from_millis(10));
        waiting.answered(Some(Duration::from_millis(4)));
        let honest = watch.read();
        assert_eq!(honest.replaced.1, Duration::from_millis(4), "{honest:?}");
        assert!(honest.sample >= Duration::from_millis(4) && honest.sample < Duration::from_millis(9), "{honest:?}");

        // A report of a year counts for the wait alone.
        let trimmed = trimmed_reports();
        let watch = Stopwatch::start();
        let waiting = Waiting::start();
        std::thread::sleep(Duration::from_millis(2));
        waiting.answered(Some(Duration::from_secs(365 * 24 * 3600)));
        let liar = watch.read();
        assert!(trimmed_reports() > trimmed);
        assert!(liar.sample <= liar.wall, "{liar:?}");

        // A report of nothing leaves the caller's own CPU time.
        let watch = Stopwatch::start();
        let waiting = Waiting::start();
        spin(Duration::from_millis(3));
        waiting.answered(Some(Duration::ZERO));
        let nothing = watch.read();
        assert!(nothing.sample >= nothing.cpu.unwrap() && nothing.sample >= Duration::from_millis(3), "{nothing:?}");

        // No report: the wait counts as it is.
        let watch = Stopwatch::start();
        let waiting = Waiting::start();
        std::thread::sleep(Duration::from_millis(3));
        waiting.answered(None);
        let silent = watch.read();
        assert!(silent.sample >= Duration::from_millis(3), "{silent:?}");

        // A report is for the run in progress only.
        ran_elsewhere(Duration::from_millis(50), Duration::from_millis(50), Duration::ZERO);
        let watch = Stopwatch::start();
        std::thread::sleep(Duration::from_millis(3));
        assert!(watch.read().sample >= Duration::from_millis(3));
    }
}
