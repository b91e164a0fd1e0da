//! Latency statistics of a set of requests.

use serde::Serialize;

/// Requests, failures and the latency of the successful ones.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Requests started in the span.
    pub requests: u64,
    /// Of which failed.
    pub failed: u64,
    /// Median latency of the successful ones, ms (none when none succeeded).
    pub p50_ms: Option<f64>,
    /// 99th percentile, ms.
    pub p99_ms: Option<f64>,
    /// 99.9th percentile, ms.
    pub p999_ms: Option<f64>,
    /// Maximum, ms.
    pub max_ms: Option<f64>,
    /// Mean, ms.
    pub mean_ms: Option<f64>,
}

/// The value at percentile `p` (0–1] of sorted values, nearest rank.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Accumulates requests, then summarises them.
#[derive(Default)]
pub struct Collector {
    requests: u64,
    failed: u64,
    latencies: Vec<u64>,
}

impl Collector {
    /// Adds a request: its latency in ns, and whether it succeeded.
    pub fn add(&mut self, latency: u64, ok: bool) {
        self.requests += 1;
        if ok {
            self.latencies.push(latency);
        } else {
            self.failed += 1;
        }
    }

    /// The statistics (sorts the latencies).
    pub fn stats(&mut self) -> Stats {
        self.latencies.sort_unstable();
        let ms = |ns: u64| ns as f64 / 1e6;
        let l = &self.latencies;
        let mean = (!l.is_empty()).then(|| l.iter().map(|&v| v as f64).sum::<f64>() / l.len() as f64 / 1e6);
        Stats {
            requests: self.requests,
            failed: self.failed,
            p50_ms: percentile(l, 0.5).map(ms),
            p99_ms: percentile(l, 0.99).map(ms),
            p999_ms: percentile(l, 0.999).map(ms),
            max_ms: l.last().copied().map(ms),
            mean_ms: mean,
        }
    }

    /// Successful requests (those with a latency).
    pub fn successes(&self) -> u64 {
        self.latencies.len() as u64
    }

    /// The worst latency, in ms, that `n` of these requests would be
    /// expected to show: the nearest-rank quantile n/(n+1) of all of them,
    /// which is the maximum when `n` is at least their number.
    pub fn worst_of(&mut self, n: u64) -> Option<f64> {
        // Cheap when `stats` has sorted them already.
        self.latencies.sort_unstable();
        let p = n as f64 / (n as f64 + 1.0);
        percentile(&self.latencies, p).map(|ns| ns as f64 / 1e6)
    }
}

/// The worst latency of steady time and of swap windows compared at the
/// same number of requests. Swap windows usually hold far more requests
/// than steady time (a loading version stretches them), and the maximum of
/// more samples is larger even when nothing is worse; this compares like
/// with like.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EqualWorst {
    /// Requests each side is taken at: the smaller side's successful requests.
    pub requests: u64,
    /// Steady time's worst latency at that many requests, ms.
    pub steady_ms: Option<f64>,
    /// Swap windows' worst latency at that many requests, ms.
    pub in_swaps_ms: Option<f64>,
}

impl EqualWorst {
    /// Compares `steady` and `in_swaps` at the smaller side's number of
    /// successful requests.
    pub fn of(steady: &mut Collector, in_swaps: &mut Collector) -> EqualWorst {
        let requests = steady.successes().min(in_swaps.successes());
        EqualWorst { requests, steady_ms: steady.worst_of(requests), in_swaps_ms: in_swaps.worst_of(requests) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn worst_at_equal_size_takes_the_larger_side_down_to_the_smaller() {
        let (mut steady, mut swaps) = (Collector::default(), Collector::default());
        // 9 steady requests of 1..=9 ms; 99 in swap windows of 99..=1 ms, unsorted.
        (1..=9u64).for_each(|v| steady.add(v * 1_000_000, true));
        (1..=99u64).rev().for_each(|v| swaps.add(v * 1_000_000, true));
        swaps.add(500_000_000, false);
        let worst = EqualWorst::of(&mut steady, &mut swaps);
        assert_eq!(worst.requests, 9);
        // The smaller side keeps its maximum; the larger is read at 9/10.
        assert_eq!(worst.steady_ms, Some(9.0));
        assert_eq!(worst.in_swaps_ms, Some(90.0));
        assert_eq!(swaps.worst_of(1_000), Some(99.0));
    }

    #[test]
    fn failures_do_not_count_in_latency() {
        let mut c = Collector::default();
        c.add(2_000_000, true);
        c.add(50_000_000, false);
        let s = c.stats();
        assert_eq!((s.requests, s.failed, s.max_ms), (2, 1, Some(2.0)));
    }
}
