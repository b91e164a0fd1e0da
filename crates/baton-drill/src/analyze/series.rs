//! The downsampled views: latency per time bucket, and the server's RSS
//! with its growth per swap.

use serde::Serialize;

use super::stats::Collector;
use crate::record::Record;
use crate::rss::Samples;

/// Latency over time, one point per bucket of request start times.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    /// Width of a bucket, ms (100, wider for long runs).
    pub bucket_ms: u64,
    /// One point per bucket.
    pub points: Vec<Point>,
}

/// One bucket.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// Start of the bucket, s.
    pub t_s: f64,
    /// Requests started in it.
    pub requests: u64,
    /// Of which failed.
    pub failed: u64,
    /// Latency of the successful ones, ms.
    pub p50_ms: Option<f64>,
    /// 99th percentile, ms.
    pub p99_ms: Option<f64>,
    /// Maximum, ms.
    pub max_ms: Option<f64>,
    /// The version that answered most of them.
    pub version: Option<String>,
}

/// Buckets of 100 ms, widened (in 100 ms steps) to keep at most 3000 points.
pub fn series(records: &[Record], versions: &[String], end: u64) -> Series {
    let steps = (end / 100_000_000 / 3000) + 1;
    let bucket = steps * 100_000_000;
    let count = (end / bucket + 1) as usize;
    let mut collectors: Vec<Collector> = (0..count).map(|_| Collector::default()).collect();
    let mut tallies: Vec<Vec<u64>> = vec![vec![0; versions.len()]; count];
    for r in records {
        let b = ((r.start / bucket) as usize).min(count - 1);
        collectors[b].add(r.latency, r.ok());
        if r.ok() {
            tallies[b][r.version as usize] += 1;
        }
    }
    let points = collectors
        .iter_mut()
        .zip(tallies)
        .enumerate()
        .map(|(i, (c, tally))| {
            let s = c.stats();
            let top = tally.iter().enumerate().filter(|(_, n)| **n > 0).max_by_key(|(_, n)| **n).map(|(v, _)| v);
            Point {
                t_s: (i as u64 * bucket) as f64 / 1e9,
                requests: s.requests,
                failed: s.failed,
                p50_ms: s.p50_ms,
                p99_ms: s.p99_ms,
                max_ms: s.max_ms,
                version: top.map(|v| versions[v].clone()).filter(|v| !v.is_empty()),
            }
        })
        .collect();
    Series { bucket_ms: bucket / 1_000_000, points }
}

/// The server's RSS during the drill.
#[derive(Clone, Debug, Serialize)]
pub struct RssReport {
    /// The process sampled.
    pub pid: u32,
    /// Every process sampled, in order: more than `pid` when upgrades
    /// replaced it.
    pub pids: Vec<u32>,
    /// (s since the start, bytes), at most ~3000 of them.
    pub samples: Vec<(f64, u64)>,
    /// The first sample, bytes.
    pub first_bytes: u64,
    /// The last sample.
    pub last_bytes: u64,
    /// The smallest.
    pub min_bytes: u64,
    /// The largest.
    pub max_bytes: u64,
    /// The last sample before each swap's trigger.
    pub before_swaps: Vec<u64>,
    /// The largest sample from each swap's trigger to the next swap's
    /// (or the end): the peak while that swap ran, both versions resident
    /// under the availability policy, one under the resource policy.
    pub peak_during_swaps: Vec<u64>,
    /// Growth per swap, bytes: see `growth_method`.
    pub growth_per_swap_bytes: Option<f64>,
    /// How the growth per swap is computed.
    pub growth_method: &'static str,
    /// Why sampling stopped early, if it did.
    pub stopped: Option<String>,
}

/// What [`RssReport::growth_per_swap_bytes`] is.
pub const GROWTH_METHOD: &str = "least-squares slope of RSS against the number of swaps done, over the last sample \
     before each swap's trigger and the last sample of the run";

/// Least-squares slope of `ys` against 0, 1, 2, ….
pub fn slope(ys: &[f64]) -> Option<f64> {
    if ys.len() < 2 {
        return None;
    }
    let n = ys.len() as f64;
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = ys.iter().sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in ys.iter().enumerate() {
        let dx = x as f64 - mean_x;
        num += dx * (y - mean_y);
        den += dx * dx;
    }
    Some(num / den)
}

/// Summarises RSS samples against the swaps' triggers (ns).
pub fn rss(pid: u32, samples: &Samples, triggers: &[u64]) -> Option<RssReport> {
    let points = &samples.points;
    let (first, last) = (points.first()?.1, points.last()?.1);
    let before_swaps: Vec<u64> =
        triggers.iter().filter_map(|&t| points.iter().take_while(|(at, _)| *at <= t).last().map(|(_, b)| *b)).collect();
    let growth = if before_swaps.len() == triggers.len() && !triggers.is_empty() {
        let mut ys: Vec<f64> = before_swaps.iter().map(|&b| b as f64).collect();
        ys.push(last as f64);
        slope(&ys)
    } else {
        None
    };
    let peak_during_swaps = triggers
        .iter()
        .enumerate()
        .map(|(i, &from)| {
            let until = triggers.get(i + 1).copied().unwrap_or(u64::MAX);
            points.iter().filter(|(at, _)| *at >= from && *at < until).map(|p| p.1).max().unwrap_or(0)
        })
        .collect();
    let stride = points.len().div_ceil(3000).max(1);
    Some(RssReport {
        pid,
        pids: if samples.pids.is_empty() { vec![pid] } else { samples.pids.clone() },
        samples: points.iter().step_by(stride).map(|&(t, b)| (t as f64 / 1e9, b)).collect(),
        first_bytes: first,
        last_bytes: last,
        min_bytes: points.iter().map(|p| p.1).min().unwrap_or(first),
        max_bytes: points.iter().map(|p| p.1).max().unwrap_or(first),
        before_swaps,
        peak_during_swaps,
        growth_per_swap_bytes: growth,
        growth_method: GROWTH_METHOD,
        stopped: samples.stopped.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slopes() {
        assert_eq!(slope(&[1.0, 2.0, 3.0]), Some(1.0));
        assert_eq!(slope(&[5.0, 5.0]), Some(0.0));
        assert_eq!(slope(&[5.0]), None);
    }

    #[test]
    fn buckets() {
        let versions = vec![String::new(), "1".into(), "2".into()];
        let r = |start: u64, version: u32| Record { start, latency: 1_000_000, version, error: 0, worker: 0, role: 0 };
        let s = series(&[r(0, 1), r(50_000_000, 1), r(150_000_000, 2)], &versions, 200_000_000);
        assert_eq!(s.bucket_ms, 100);
        assert_eq!(s.points.len(), 3);
        assert_eq!((s.points[0].requests, s.points[0].version.as_deref()), (2, Some("1")));
        assert_eq!(s.points[1].version.as_deref(), Some("2"));
        assert_eq!(s.points[2].requests, 0);
    }

    #[test]
    fn rss_growth() {
        let samples = Samples { pids: vec![7], points: vec![(0, 100), (10, 110), (20, 120), (30, 130)], stopped: None };
        let report = rss(7, &samples, &[5, 15, 25]).unwrap();
        assert_eq!(report.before_swaps, vec![100, 110, 120]);
        assert_eq!(report.growth_per_swap_bytes, Some(10.0));
    }
}
