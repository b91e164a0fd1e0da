//! What an inference of a version costs, learnt from its runs: the moving
//! averages of a run's time and of its rows. A request of `rows` rows is
//! estimated at the average time, scaled up when it has more rows than the
//! average run: an engine's time grows less than in proportion to the
//! rows, so the estimate errs on the high side, and a batch of 1,024 rows
//! of a model whose runs average one row is estimated at 1,024 runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Weight of a new run in the averages: 1/8.
const SHIFT: u32 = 3;

/// Rows are kept in thousandths, so averages below one row stay exact
/// enough.
const MILLI: u64 = 1000;

/// The moving averages; updated by whichever thread ran, read without a
/// lock.
#[derive(Debug)]
pub(super) struct RunCost {
    nanos: AtomicU64,
    milli_rows: AtomicU64,
}

impl RunCost {
    /// Averages that start at one run of `first` for one row (the fastest
    /// warmup run, until real runs say otherwise).
    pub(super) fn new(first: Duration) -> RunCost {
        RunCost { nanos: AtomicU64::new(nanos(first)), milli_rows: AtomicU64::new(MILLI) }
    }

    /// Counts a run of `rows` rows that took `took`.
    pub(super) fn record(&self, rows: usize, took: Duration) {
        let step = |avg: &AtomicU64, sample: u64| {
            let old = avg.load(Ordering::Relaxed);
            let new = old - (old >> SHIFT) + (sample >> SHIFT);
            avg.store(new, Ordering::Relaxed);
        };
        step(&self.nanos, nanos(took));
        step(&self.milli_rows, (rows.max(1) as u64).saturating_mul(MILLI));
    }

    /// The estimated time of a run of `rows` rows.
    pub(super) fn estimate(&self, rows: usize) -> Duration {
        let nanos = self.nanos.load(Ordering::Relaxed);
        let avg_rows = self.milli_rows.load(Ordering::Relaxed).max(1);
        let rows = (rows.max(1) as u64).saturating_mul(MILLI);
        let scaled = if rows <= avg_rows { nanos } else { nanos.saturating_mul(rows) / avg_rows };
        Duration::from_nanos(scaled)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_follow_runs_and_scale_with_rows_beyond_the_average() {
        let cost = RunCost::new(Duration::from_micros(50));
        assert_eq!(cost.estimate(1), Duration::from_micros(50));
        assert_eq!(cost.estimate(1024), Duration::from_micros(50 * 1024), "a large batch is not cheap");
        for _ in 0..100 {
            cost.record(1, Duration::from_micros(200));
        }
        let one = cost.estimate(1);
        assert!(one > Duration::from_micros(190) && one <= Duration::from_micros(200), "{one:?}");
        for _ in 0..100 {
            cost.record(4, Duration::from_micros(400));
        }
        let (four, eight) = (cost.estimate(4), cost.estimate(8));
        assert!(cost.estimate(2) == four, "up to the average rows, the average time");
        assert!(eight > four + four / 2, "{four:?} {eight:?}");
    }
}
