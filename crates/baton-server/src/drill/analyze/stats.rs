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
            max_ms: l.last().copied().map(ms),
            mean_ms: mean,
        }
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
    fn failures_do_not_count_in_latency() {
        let mut c = Collector::default();
        c.add(2_000_000, true);
        c.add(50_000_000, false);
        let s = c.stats();
        assert_eq!((s.requests, s.failed, s.max_ms), (2, 1, Some(2.0)));
    }
}
