//! The load: closed loop (N workers, each sending its next request when
//! the last is answered) or open loop (requests on a fixed schedule, sent
//! by a pool of connections; a request that had to wait for a busy
//! connection counts its latency from its scheduled time, so a stalled
//! server cannot hide its backlog — no coordinated omission). Workers share
//! nothing but an atomic counter; each keeps its own records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::caller::{Caller, Failure};
use super::record::{Live, Record, WorkerLog};

/// Closed or open loop.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "loop", rename_all = "snake_case")]
pub enum Mode {
    /// `workers` workers sending back to back.
    Closed {
        /// Workers, each with its own connection.
        workers: usize,
    },
    /// `rate` requests per second over at most `connections` connections.
    Open {
        /// Requests per second.
        rate: f64,
        /// Connections, and so the most requests in flight.
        connections: usize,
    },
}

impl Mode {
    /// How many workers (connections) the mode needs.
    pub fn workers(&self) -> usize {
        match *self {
            Mode::Closed { workers } => workers,
            Mode::Open { connections, .. } => connections,
        }
    }
}

/// What the load does and when it stops.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Closed or open loop.
    pub mode: Mode,
    /// The load stops this long after it started.
    pub duration: Duration,
    /// The load stops after this many requests.
    pub max_requests: Option<u64>,
    /// A request not answered within this fails.
    pub timeout: Duration,
}

/// A worker whose connection could not be opened waits this long before
/// its next attempt, so a dead server is not hammered with connects.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);

/// Runs the load until the plan's bounds or `live.stop`; returns every worker's log.
pub async fn run(callers: Vec<Caller>, plan: Plan, live: Arc<Live>) -> Vec<WorkerLog> {
    let deadline = live.t0 + plan.duration;
    let mut tasks = Vec::new();
    match plan.mode {
        Mode::Closed { .. } => {
            let issued = Arc::new(AtomicU64::new(0));
            for (id, caller) in callers.into_iter().enumerate() {
                let (live, issued, plan) = (Arc::clone(&live), Arc::clone(&issued), plan.clone());
                tasks.push(tokio::spawn(closed(id, caller, live, plan, deadline, issued)));
            }
        }
        Mode::Open { rate, .. } => {
            let slots = Arc::new(AtomicU64::new(0));
            for (id, caller) in callers.into_iter().enumerate() {
                let (live, slots, plan) = (Arc::clone(&live), Arc::clone(&slots), plan.clone());
                tasks.push(tokio::spawn(open(id, caller, live, plan, rate, deadline, slots)));
            }
        }
    }
    let mut logs = Vec::new();
    for task in tasks {
        match task.await {
            Ok(log) => logs.push(log),
            Err(e) => eprintln!("baton drill: a worker failed: {e}"),
        }
    }
    logs
}

/// Tracks the worker's last version, so the shared table is touched only on a change.
struct Versions {
    local: u32,
    shared: u32,
}

/// Records a finished request; true when it failed to connect.
fn note(
    log: &mut WorkerLog,
    live: &Live,
    last: &mut Versions,
    start: Instant,
    end: Instant,
    result: Result<(&str, u8), Failure>,
) -> bool {
    let start_ns = live.offset(start);
    let latency = end.saturating_duration_since(start).as_nanos() as u64;
    let worker = log.worker;
    match result {
        Ok((version, role)) => {
            let same = log.versions.get(last.local as usize).is_some_and(|v| v == version);
            if !same {
                last.local = log.version_id(version);
                last.shared = live.version_id(version);
            }
            live.answered(worker as usize, last.shared, start_ns + latency);
            log.records.push(Record { start: start_ns, latency, version: last.local, error: 0, worker, role });
            live.finished(latency, true);
            false
        }
        Err(failure) => {
            let error = log.error_id(&failure.kind, &failure.message);
            log.records.push(Record { start: start_ns, latency, version: 0, error, worker, role: 0 });
            live.finished(latency, false);
            failure.kind == "connect"
        }
    }
}

async fn closed(
    id: usize,
    mut caller: Caller,
    live: Arc<Live>,
    plan: Plan,
    deadline: Instant,
    issued: Arc<AtomicU64>,
) -> WorkerLog {
    let mut log = WorkerLog::new(id as u32);
    let mut last = Versions { local: u32::MAX, shared: 0 };
    loop {
        let start = Instant::now();
        if live.stopped() || start >= deadline {
            break;
        }
        if plan.max_requests.is_some_and(|max| issued.fetch_add(1, Ordering::Relaxed) >= max) {
            break;
        }
        let result = caller.call(plan.timeout).await;
        let end = Instant::now();
        if note(&mut log, &live, &mut last, start, end, result) {
            tokio::time::sleep(CONNECT_BACKOFF).await;
        }
    }
    log
}

/// An open-loop worker: whenever its connection is free it takes the next
/// slot of the schedule (slot i is due at i / rate) and sends it when due.
/// A slot taken after it was due found every connection busy — the
/// server's backlog — and its latency counts from the scheduled time. A
/// slot taken early waits on the async timer (1 ms granularity), and its
/// latency counts from when it was sent: the timer's lateness is the
/// client's, not the server's.
async fn open(
    id: usize,
    mut caller: Caller,
    live: Arc<Live>,
    plan: Plan,
    rate: f64,
    deadline: Instant,
    slots: Arc<AtomicU64>,
) -> WorkerLog {
    let mut log = WorkerLog::new(id as u32);
    let mut last = Versions { local: u32::MAX, shared: 0 };
    loop {
        let index = slots.fetch_add(1, Ordering::Relaxed);
        if plan.max_requests.is_some_and(|max| index >= max) {
            break;
        }
        let scheduled = live.t0 + Duration::from_secs_f64(index as f64 / rate);
        if scheduled >= deadline {
            break;
        }
        let ready = Instant::now();
        if !sleep_until(&live, scheduled).await {
            break;
        }
        let sent = Instant::now();
        let start = if ready > scheduled {
            log.queued += 1;
            scheduled
        } else {
            if sent > scheduled + Duration::from_millis(1) {
                log.late += 1;
            }
            sent
        };
        log.max_lag = log.max_lag.max(sent.saturating_duration_since(scheduled).as_nanos() as u64);
        let result = caller.call(plan.timeout).await;
        let end = Instant::now();
        note(&mut log, &live, &mut last, start, end, result);
    }
    log
}

/// Sleeps until `at`, in steps that notice the stop; false if stopped.
async fn sleep_until(live: &Live, at: Instant) -> bool {
    loop {
        if live.stopped() {
            return false;
        }
        let now = Instant::now();
        if at <= now {
            return true;
        }
        tokio::time::sleep((at - now).min(Duration::from_millis(50))).await;
    }
}
