//! What is recorded while the load runs: one small [`Record`] per request,
//! kept by the worker that sent it (no sharing on the request path), and a
//! few shared atomics the progress line and the swap driver read.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// One request. Times are nanoseconds since the load started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// When the request started: sent (closed loop) or scheduled (open loop).
    pub start: u64,
    /// From start to the end of the answer (or of the failure).
    pub latency: u64,
    /// Index of the answering version in the version table (0: none known).
    pub version: u32,
    /// 0 when the request succeeded, else 1 + index in the error table.
    pub error: u32,
    /// The worker (connection) that sent it.
    pub worker: u32,
    /// The role the answer named in a rollout ([`crate::role`]; 0: none).
    pub role: u8,
}

impl Record {
    /// When the answer ended.
    pub fn end(&self) -> u64 {
        self.start + self.latency
    }

    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.error == 0
    }
}

/// One worker's records with its own small tables of versions and errors.
pub struct WorkerLog {
    /// The worker's number.
    pub worker: u32,
    /// Its requests, in the order it sent them.
    pub records: Vec<Record>,
    /// Version strings; index 0 is "no version".
    pub versions: Vec<String>,
    /// (kind, message) of each distinct error.
    pub errors: Vec<(String, String)>,
    /// Open loop: requests that found every connection busy at their
    /// scheduled time (latency counted from that time).
    pub queued: u64,
    /// Open loop: requests sent more than 1 ms late although a connection
    /// was idle (the client's own timer or scheduling; not counted).
    pub late: u64,
    /// Open loop: the largest delay between a request's scheduled time and its sending, in ns.
    pub max_lag: u64,
}

impl WorkerLog {
    /// An empty log.
    pub fn new(worker: u32) -> WorkerLog {
        WorkerLog {
            worker,
            records: Vec::new(),
            versions: vec![String::new()],
            errors: Vec::new(),
            queued: 0,
            late: 0,
            max_lag: 0,
        }
    }

    /// The index of `version` in this worker's table.
    pub fn version_id(&mut self, version: &str) -> u32 {
        if version.is_empty() {
            return 0;
        }
        if let Some(i) = self.versions.iter().rposition(|v| v == version) {
            return i as u32;
        }
        self.versions.push(version.to_owned());
        (self.versions.len() - 1) as u32
    }

    /// The error id (1 + index) of an error.
    pub fn error_id(&mut self, kind: &str, message: &str) -> u32 {
        if let Some(i) = self.errors.iter().position(|(k, m)| k == kind && m == message) {
            return i as u32 + 1;
        }
        self.errors.push((kind.to_owned(), message.to_owned()));
        self.errors.len() as u32
    }
}

/// Buckets of the progress histogram: 16 per power of two of microseconds.
const BUCKETS: usize = 16 + 40 * 16;

fn bucket(us: u64) -> usize {
    if us < 16 {
        return us as usize;
    }
    let exponent = 63 - us.leading_zeros() as usize;
    let mantissa = ((us >> (exponent - 4)) & 15) as usize;
    (16 + (exponent - 4) * 16 + mantissa).min(BUCKETS - 1)
}

fn bucket_floor(index: usize) -> u64 {
    if index < 16 {
        return index as u64;
    }
    let exponent = (index - 16) / 16 + 4;
    let mantissa = ((index - 16) % 16) as u64;
    (16 + mantissa) << (exponent - 4)
}

/// Shared state read while the load runs.
pub struct Live {
    /// When the load started.
    pub t0: Instant,
    /// Requests finished.
    pub requests: AtomicU64,
    /// Requests failed.
    pub errors: AtomicU64,
    /// Set when the load must stop.
    pub stop: AtomicBool,
    histogram: Vec<AtomicU64>,
    versions: Mutex<Vec<String>>,
    /// Per worker: (version id << 48) | ns of its last successful answer.
    last_ok: Vec<AtomicU64>,
}

const TIME_BITS: u32 = 48;

impl Live {
    /// State for `workers` workers, the load starting now.
    pub fn new(workers: usize) -> Live {
        Live {
            t0: Instant::now(),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            histogram: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            versions: Mutex::new(vec![String::new()]),
            last_ok: (0..workers).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Nanoseconds since the load started.
    pub fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// Nanoseconds from the start to `at`.
    pub fn offset(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.t0).as_nanos() as u64
    }

    /// Whether the load must stop.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The shared id of a version string (a lock, taken only when a worker
    /// sees a version different from its last one).
    pub fn version_id(&self, version: &str) -> u32 {
        let mut versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = versions.iter().position(|v| v == version) {
            return i as u32;
        }
        versions.push(version.to_owned());
        (versions.len() - 1) as u32
    }

    /// Counts a finished request.
    pub fn finished(&self, latency_ns: u64, ok: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.histogram[bucket(latency_ns / 1000)].fetch_add(1, Ordering::Relaxed);
    }

    /// Notes that `worker` got a successful answer from shared version `id` at `at_ns`.
    pub fn answered(&self, worker: usize, id: u32, at_ns: u64) {
        let packed = (u64::from(id) << TIME_BITS) | (at_ns & ((1 << TIME_BITS) - 1));
        self.last_ok[worker].store(packed, Ordering::Relaxed);
    }

    /// Whether some worker's last successful answer came from `version`
    /// and ended after `since_ns`.
    pub fn serving_since(&self, version: &str, since_ns: u64) -> bool {
        let id = self.version_id(version);
        self.last_ok.iter().any(|slot| {
            let packed = slot.load(Ordering::Relaxed);
            (packed >> TIME_BITS) as u32 == id && (packed & ((1 << TIME_BITS) - 1)) > since_ns
        })
    }

    /// The version of the most recent successful answer, if any.
    pub fn latest_version(&self) -> Option<String> {
        let latest =
            self.last_ok.iter().map(|s| s.load(Ordering::Relaxed)).max_by_key(|p| p & ((1 << TIME_BITS) - 1))?;
        let id = (latest >> TIME_BITS) as usize;
        let versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        versions.get(id).filter(|v| !v.is_empty()).cloned()
    }

    /// The 99th percentile of latencies since the last call, in µs
    /// (±6 %), and resets the histogram.
    pub fn take_p99_us(&self) -> Option<u64> {
        let counts: Vec<u64> = self.histogram.iter().map(|b| b.swap(0, Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = total - total / 100;
        let mut seen = 0;
        for (i, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(bucket_floor(i));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_close() {
        let mut last = 0;
        for us in [0, 1, 15, 16, 17, 100, 1000, 12_345, 1_000_000, 60_000_000] {
            let b = bucket(us);
            assert!(b >= last);
            last = b;
            let floor = bucket_floor(b);
            assert!(floor <= us && us - floor <= us / 16 + 1, "{us} -> {floor}");
        }
    }

    #[test]
    fn interning_and_serving() {
        let live = Live::new(2);
        let two = live.version_id("2");
        live.answered(1, two, 500);
        assert!(live.serving_since("2", 100));
        assert!(!live.serving_since("2", 600));
        assert!(!live.serving_since("3", 0));
        assert_eq!(live.latest_version().as_deref(), Some("2"));
        let mut log = WorkerLog::new(0);
        assert_eq!((log.version_id(""), log.version_id("7"), log.version_id("7")), (0, 1, 1));
        assert_eq!((log.error_id("io", "x"), log.error_id("io", "y"), log.error_id("io", "x")), (1, 2, 1));
    }

    #[test]
    fn p99_of_a_window() {
        let live = Live::new(1);
        for i in 0..100 {
            live.finished(if i == 99 { 50_000_000 } else { 1_000_000 }, true);
        }
        let p99 = live.take_p99_us().unwrap();
        assert!((940..=1000).contains(&p99), "{p99}");
        assert_eq!(live.take_p99_us(), None);
    }
}
