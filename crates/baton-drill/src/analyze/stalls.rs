//! The stall probe's late wakes, split like the requests: in steady time
//! and in swap windows, each per minute of its own time, since the two
//! hold different lengths of the drill. And the slowest requests of each,
//! with how much of their time the probe was kept from its CPU too: a
//! request that took 40 ms while the probe could not run for 38 of them
//! waited for the machine, not for the server.

use serde::Serialize;

use super::swaps::Span;
use crate::record::Record;
use crate::stalls::{PERIOD, Probe, Stall};

/// How many of the slowest requests of each kind of time are reported.
pub const SLOWEST: usize = 5;

/// Late wakes in one kind of time (from several probes, the stops of at
/// least one CPU).
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
    /// How many probes ran, one per CPU; their late wakes are merged into
    /// the times when at least one CPU was stopped, and those are counted.
    pub cpus: usize,
    /// Sleeps made, by all probes.
    pub sleeps: u64,
    /// In steady time.
    pub steady: StallStats,
    /// In swap windows.
    pub in_swaps: StallStats,
    /// The ten latest wakes, latest first: (when due, s; how late, ms).
    pub worst: Vec<(f64, f64)>,
    /// The slowest successful requests of steady time, slowest first.
    pub slowest_steady: Vec<SlowRequest>,
    /// The slowest successful requests of the swap windows, slowest first.
    pub slowest_in_swaps: Vec<SlowRequest>,
}

/// One of the slowest requests, and how much of it the probe also stalled.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SlowRequest {
    /// When it started, s since the load started.
    pub start_s: f64,
    /// Its latency, ms.
    pub latency_ms: f64,
    /// Of that time, how long the probe was kept from its CPU too, ms.
    /// Only wakes later than the probe's threshold are recorded, so
    /// shorter stalls are not in it.
    pub stalled_ms: f64,
}

/// Whether a span holds `at` (`spans` in time order, not overlapping; a
/// span holds its first instant, not its last).
fn in_a_span(spans: &[Span], at: u64) -> bool {
    spans.get(spans.partition_point(|s| s.to <= at)).is_some_and(|s| at >= s.from)
}

/// How much of `from..to` the stalls cover, ns. The probe sleeps one sleep
/// at a time, so its stalls (from when a wake was due to when it came) are
/// in time order and do not overlap.
fn stalled(stalls: &[Stall], from: u64, to: u64) -> u64 {
    let first = stalls.partition_point(|s| s.due + s.late <= from);
    stalls[first..].iter().take_while(|s| s.due < to).map(|s| (s.due + s.late).min(to) - s.due.max(from)).sum()
}

/// The [`SLOWEST`] slowest successful requests of one kind of time, kept
/// as the analysis meets them, which already sorts each request into its
/// kind: (latency, index in the records), slowest first.
#[derive(Debug, Default)]
pub struct Slowest(Vec<(u64, usize)>);

impl Slowest {
    /// Keeps `r`, the `index`th record, if it succeeded and is among the slowest so far.
    pub fn add(&mut self, r: &Record, index: usize) {
        if !r.ok() || (self.0.len() == SLOWEST && self.0.last().is_some_and(|&(l, _)| l >= r.latency)) {
            return;
        }
        let at = self.0.partition_point(|&(l, _)| l >= r.latency);
        self.0.insert(at, (r.latency, index));
        self.0.truncate(SLOWEST);
    }

    /// Each kept request of `records`, with the stalls over it.
    fn report(&self, records: &[Record], stalls: &[Stall]) -> Vec<SlowRequest> {
        self.0
            .iter()
            .map(|&(_, i)| {
                let r = &records[i];
                SlowRequest {
                    start_s: r.start as f64 / 1e9,
                    latency_ms: r.latency as f64 / 1e6,
                    stalled_ms: stalled(stalls, r.start, r.end()) as f64 / 1e6,
                }
            })
            .collect()
    }
}

/// Splits the probe's late wakes between steady time and the swap
/// windows `spans` (in time order, not overlapping) of a load that ran
/// `end` ns, and sets the slowest requests of each (`slowest`, steady
/// then windows, kept from `records`) beside them.
pub fn report(probe: &Probe, spans: &[Span], end: u64, records: &[Record], slowest: [&Slowest; 2]) -> StallReport {
    let in_swaps_ns: u64 = spans.iter().map(|s| s.to.min(end).saturating_sub(s.from.min(end))).sum();
    let mut steady = StallStats { seconds: end.saturating_sub(in_swaps_ns) as f64 / 1e9, ..StallStats::default() };
    let mut in_swaps = StallStats { seconds: in_swaps_ns as f64 / 1e9, ..StallStats::default() };
    for stall in probe.stalls.iter().filter(|s| s.due < end) {
        let into = if in_a_span(spans, stall.due) { &mut in_swaps } else { &mut steady };
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
    let [slowest_steady, slowest_in_swaps] = slowest.map(|kind| kind.report(records, &probe.stalls));
    StallReport {
        realtime: probe.realtime,
        note: probe.note.clone(),
        period_ms: PERIOD.as_secs_f64() * 1e3,
        late_ms: probe.late.as_secs_f64() * 1e3,
        cpus: probe.cpus,
        sleeps: probe.sleeps,
        steady,
        in_swaps,
        worst,
        slowest_steady,
        slowest_in_swaps,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::stalls::Stall;

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
        let probe = Probe { realtime: true, note: None, late: Duration::from_millis(2), cpus: 1, sleeps: 9000, stalls };
        let r = report(&probe, &spans, 10 * S, &[], [&Slowest::default(), &Slowest::default()]);
        assert_eq!((r.steady.count, r.in_swaps.count), (2, 2));
        assert!((r.steady.seconds - 7.0).abs() < 1e-9 && (r.in_swaps.seconds - 3.0).abs() < 1e-9);
        assert!((r.in_swaps.per_minute - 40.0).abs() < 1e-9, "{}", r.in_swaps.per_minute);
        assert!((r.steady.late_ms - 6.0).abs() < 1e-9 && (r.in_swaps.max_ms - 9.0).abs() < 1e-9);
        assert_eq!(r.worst.first(), Some(&(11.0, 50.0)), "the list of the latest wakes keeps every one");
        assert_eq!((r.late_ms, r.period_ms, r.sleeps), (2.0, 1.0, 9000));
    }

    fn request(start: u64, latency: u64, error: u32) -> Record {
        Record { start, latency, version: 1, error, worker: 0, role: 0 }
    }

    #[test]
    fn the_slowest_requests_carry_the_stalls_that_overlap_them() {
        // One window, 2–3 s. Stalls: 4 ms from 1.000 s, 5 ms from 2.500 s.
        let spans = [Span { from: 2 * S, commit: 2 * S + S / 2, to: 3 * S }];
        let stalls = vec![Stall { due: S, late: 4 * MS }, Stall { due: 2 * S + S / 2, late: 5 * MS }];
        let probe = Probe { late: Duration::from_millis(2), stalls, ..Probe::default() };
        let mut records = vec![
            request(S - 2 * MS, 10 * MS, 0),  // steady, 1 s − 2 ms to + 8 ms: all 4 ms of the stall
            request(S + 3 * MS, 6 * MS, 0),   // steady, starts 1 ms before the stall ends
            request(S + 50 * MS, 90 * MS, 1), // the slowest, but failed: not counted
            request(2 * S + S / 2 + 2 * MS, 20 * MS, 0), // in the window, 3 ms of its stall
        ];
        // Fast requests in both kinds, more than SLOWEST of them.
        records.extend((0..20).map(|k| request(S / 10 + k * MS, MS, 0)));
        records.extend((0..20).map(|k| request(2 * S + k * MS, 2 * MS, 0)));
        records.sort_by_key(|r| r.start);
        // Sorted into their kinds as the analysis does: by start, in a window or not.
        let (mut in_steady, mut in_windows) = (Slowest::default(), Slowest::default());
        for (i, r) in records.iter().enumerate() {
            if in_a_span(&spans, r.start) { &mut in_windows } else { &mut in_steady }.add(r, i);
        }
        let r = report(&probe, &spans, 4 * S, &records, [&in_steady, &in_windows]);
        let steady: Vec<(f64, f64)> = r.slowest_steady.iter().map(|x| (x.latency_ms, x.stalled_ms)).collect();
        assert_eq!(steady, [(10.0, 4.0), (6.0, 1.0), (1.0, 0.0), (1.0, 0.0), (1.0, 0.0)]);
        let windows: Vec<(f64, f64)> = r.slowest_in_swaps.iter().map(|x| (x.latency_ms, x.stalled_ms)).collect();
        assert_eq!(windows, [(20.0, 3.0), (2.0, 0.0), (2.0, 0.0), (2.0, 0.0), (2.0, 0.0)]);
        assert!((r.slowest_in_swaps[0].start_s - 2.502).abs() < 1e-9);
    }

    #[test]
    fn a_drill_without_swaps_is_all_steady_time() {
        let probe = Probe { stalls: vec![Stall { due: S, late: 3 * MS }], ..Probe::default() };
        let r = report(&probe, &[], 2 * S, &[], [&Slowest::default(), &Slowest::default()]);
        assert_eq!((r.steady.count, r.in_swaps.count), (1, 0));
        assert_eq!((r.in_swaps.seconds, r.in_swaps.per_minute), (0.0, 0.0));
        assert!((r.steady.per_minute - 30.0).abs() < 1e-9);
    }
}
