//! The stall probe's late wakes, split like the requests: in steady time
//! and in swap windows, each per minute of its own time, since the two
//! hold different lengths of the drill.

use serde::Serialize;

use super::swaps::Span;
use crate::drill::stalls::{PERIOD, Probe};

/// Late wakes in one kind of time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StallStats {
    /// Seconds of the drill of this kind.
    pub seconds: f64,
    /// Late wakes.
    pub count: u64,
    /// Late wakes per minute of this time.
    pub per_minute: f64,
    /// Their lateness summed, ms.
    pub late_ms: f64,
    /// The latest, ms.
    pub max_ms: f64,
}

/// What the probe saw, in the report.
#[derive(Clone, Debug, Serialize)]
pub struct StallReport {
    /// Whether the probe ran under `SCHED_FIFO` (else its late wakes also
    /// count waits for a busy CPU).
    pub realtime: bool,
    /// Why it did not, when it did not.
    pub note: Option<String>,
    /// How long each sleep was, ms.
    pub period_ms: f64,
    /// Wakes later than this count, ms.
    pub late_ms: f64,
    /// Sleeps made.
    pub sleeps: u64,
    /// In steady time.
    pub steady: StallStats,
    /// In swap windows.
    pub in_swaps: StallStats,
    /// The ten latest wakes, latest first: (when due, s; how late, ms).
    pub worst: Vec<(f64, f64)>,
}

/// Splits the probe's late wakes between steady time and the swap
/// windows `spans` (in time order, not overlapping) of a load that ran
/// `end` ns.
pub fn report(probe: &Probe, spans: &[Span], end: u64) -> StallReport {
    let in_swaps_ns: u64 = spans.iter().map(|s| s.to.min(end).saturating_sub(s.from.min(end))).sum();
    let mut steady = StallStats { seconds: end.saturating_sub(in_swaps_ns) as f64 / 1e9, ..StallStats::default() };
    let mut in_swaps = StallStats { seconds: in_swaps_ns as f64 / 1e9, ..StallStats::default() };
    for stall in probe.stalls.iter().filter(|s| s.due < end) {
        let i = spans.partition_point(|s| s.to <= stall.due);
        let into = match spans.get(i) {
            Some(s) if stall.due >= s.from => &mut in_swaps,
            _ => &mut steady,
        };
        let ms = stall.late as f64 / 1e6;
        into.count += 1;
        into.late_ms += ms;
        into.max_ms = into.max_ms.max(ms);
    }
    for s in [&mut steady, &mut in_swaps] {
        s.per_minute = if s.seconds > 0.0 { s.count as f64 * 60.0 / s.seconds } else { 0.0 };
    }
    let mut worst: Vec<(f64, f64)> = probe.stalls.iter().map(|s| (s.due as f64 / 1e9, s.late as f64 / 1e6)).collect();
    worst.sort_by(|a, b| b.1.total_cmp(&a.1));
    worst.truncate(10);
    StallReport {
        realtime: probe.realtime,
        note: probe.note.clone(),
        period_ms: PERIOD.as_secs_f64() * 1e3,
        late_ms: probe.late.as_secs_f64() * 1e3,
        sleeps: probe.sleeps,
        steady,
        in_swaps,
        worst,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::drill::stalls::Stall;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    #[test]
    fn late_wakes_are_split_between_steady_time_and_swap_windows() {
        // Windows 2–3 s and 5–7 s of a 10 s load: 3 s in windows, 7 steady.
        let spans =
            [Span { from: 2 * S, commit: 2 * S + S / 2, to: 3 * S }, Span { from: 5 * S, commit: 6 * S, to: 7 * S }];
        let stalls = vec![
            Stall { due: S, late: 4 * MS },
            Stall { due: 2 * S, late: 9 * MS }, // a window's first instant is in it
            Stall { due: 3 * S, late: 2 * MS }, // its end is not
            Stall { due: 6 * S, late: 3 * MS },
            Stall { due: 11 * S, late: 50 * MS }, // after the load: not counted
        ];
        let probe = Probe { realtime: true, note: None, late: Duration::from_millis(2), sleeps: 9000, stalls };
        let r = report(&probe, &spans, 10 * S);
        assert_eq!((r.steady.count, r.in_swaps.count), (2, 2));
        assert!((r.steady.seconds - 7.0).abs() < 1e-9 && (r.in_swaps.seconds - 3.0).abs() < 1e-9);
        assert!((r.in_swaps.per_minute - 40.0).abs() < 1e-9, "{}", r.in_swaps.per_minute);
        assert!((r.steady.late_ms - 6.0).abs() < 1e-9 && (r.in_swaps.max_ms - 9.0).abs() < 1e-9);
        assert_eq!(r.worst.first(), Some(&(11.0, 50.0)), "the list of the latest wakes keeps every one");
        assert_eq!((r.late_ms, r.period_ms, r.sleeps), (2.0, 1.0, 9000));
    }

    #[test]
    fn a_drill_without_swaps_is_all_steady_time() {
        let probe = Probe { stalls: vec![Stall { due: S, late: 3 * MS }], ..Probe::default() };
        let r = report(&probe, &[], 2 * S);
        assert_eq!((r.steady.count, r.in_swaps.count), (1, 0));
        assert_eq!((r.in_swaps.seconds, r.in_swaps.per_minute), (0.0, 0.0));
        assert!((r.steady.per_minute - 30.0).abs() < 1e-9);
    }
}
