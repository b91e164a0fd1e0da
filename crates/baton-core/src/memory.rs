//! Memory accounting: which versions are alive, what each holds, and what
//! came back when one was freed (seed 000's residual rate).
//!
//! Method: process RSS after asking glibc to trim its free heap
//! ([`crate::sys::trimmed_rss`]). ONNX Runtime allocates through C++
//! `new`/`malloc`, invisible to any Rust global allocator, so only the
//! kernel's view sees all of a version's memory. A version's `held` is the
//! RSS growth across its load (fetch to end of warmup), and `returned` is the
//! RSS drop across its free. The loader and the keeper take one measurement
//! lock so a free never lands inside a load's window; serving traffic still
//! adds noise of a few pages either way, which is why residuals are reported
//! per unload rather than asserted to the byte.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak, mpsc};
use std::time::SystemTime;

use serde::Serialize;

use crate::backend::Model;
use crate::events::{Event, EventKind, EventSender};
use crate::version::Version;

/// How many unload records are kept.
const UNLOAD_HISTORY: usize = 256;

/// What freeing one version gave back.
#[derive(Clone, Debug, Serialize)]
pub struct UnloadRecord {
    /// Model name.
    pub model: String,
    /// Version number.
    pub version: u64,
    /// Bytes the version held, measured at load.
    pub held: u64,
    /// Bytes RSS dropped by when it was freed.
    pub returned: u64,
    /// `held - returned`, floored at zero: memory that did not come back.
    pub residual: u64,
    /// When it was freed.
    #[serde(skip)]
    pub at: SystemTime,
}

/// A version still alive: served, kept for rollback, or pinned by requests.
#[derive(Clone, Debug, Serialize)]
pub struct LiveVersion {
    /// Version number.
    pub version: u64,
    /// Bytes it holds.
    pub bytes_held: u64,
}

struct Released {
    model: String,
    version: u64,
    held: u64,
    engine: Arc<dyn Model>,
}

/// Hands a dropped version's engine to the memory keeper thread.
#[derive(Clone)]
pub struct Releaser {
    tx: mpsc::Sender<Released>,
}

impl Releaser {
    /// Queues the engine to be freed and measured; frees it in place if the
    /// keeper is gone.
    pub(crate) fn release(&self, model: &str, version: u64, held: u64, engine: Arc<dyn Model>) {
        let job = Released { model: model.to_owned(), version, held, engine };
        if let Err(mpsc::SendError(job)) = self.tx.send(job) {
            drop(job.engine);
        }
    }
}

/// The registry's memory book-keeping, shared by the loader, the keeper
/// thread and status queries.
pub(crate) struct Memory {
    live: Mutex<Vec<(String, Weak<Version>)>>,
    unloads: Mutex<VecDeque<UnloadRecord>>,
    measuring: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Memory {
    /// Starts the keeper thread; returns the book and the releaser versions use.
    pub(crate) fn start(events: EventSender, nice: i32, idle: bool) -> (Arc<Memory>, Releaser) {
        let memory = Arc::new(Memory {
            live: Mutex::new(Vec::new()),
            unloads: Mutex::new(VecDeque::new()),
            measuring: Mutex::new(()),
        });
        let (tx, rx) = mpsc::channel::<Released>();
        let book = Arc::downgrade(&memory);
        std::thread::Builder::new()
            .name("baton-release".into())
            .spawn(move || {
                crate::sys::lower_current_thread(nice, idle);
                for job in rx {
                    let Some(memory) = book.upgrade() else {
                        drop(job.engine);
                        continue;
                    };
                    memory.free(job, &events);
                }
            })
            .expect("spawning the release thread");
        (memory, Releaser { tx })
    }

    fn free(&self, job: Released, events: &EventSender) {
        // A batch task may hold the engine for a moment after its last
        // answer went out; wait for it so the free happens here.
        let waited = std::time::Instant::now();
        while Arc::strong_count(&job.engine) > 1 && waited.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _window = self.measure();
        let before = crate::sys::trimmed_rss().unwrap_or(0);
        drop(job.engine);
        let after = crate::sys::trimmed_rss().unwrap_or(0);
        let returned = before.saturating_sub(after);
        let record = UnloadRecord {
            model: job.model,
            version: job.version,
            held: job.held,
            returned,
            residual: job.held.saturating_sub(returned),
            at: SystemTime::now(),
        };
        tracing::info!(
            model = %record.model,
            version = record.version,
            held = record.held,
            returned = record.returned,
            residual = record.residual,
            "Freed a version and measured the memory that came back."
        );
        // Recorded before it is announced, so a subscriber that hears of it can read it.
        {
            let mut unloads = lock(&self.unloads);
            if unloads.len() == UNLOAD_HISTORY {
                unloads.pop_front();
            }
            unloads.push_back(record.clone());
        }
        let _ = events.send(Event {
            model: record.model.clone(),
            version: Some(record.version),
            at: record.at,
            kind: EventKind::Unloaded { held: record.held, returned: record.returned, residual: record.residual },
        });
    }

    /// Holds off frees while a load measures its memory.
    pub(crate) fn measure(&self) -> MutexGuard<'_, ()> {
        lock(&self.measuring)
    }

    /// Starts tracking a new version (by a weak reference only).
    pub(crate) fn track(&self, version: &Arc<Version>) {
        let mut live = lock(&self.live);
        live.retain(|(_, w)| w.strong_count() > 0);
        live.push((version.model().to_owned(), Arc::downgrade(version)));
    }

    /// Versions of `model` still alive, ascending.
    pub(crate) fn live(&self, model: &str) -> Vec<LiveVersion> {
        let live = lock(&self.live);
        let mut out: Vec<LiveVersion> = live
            .iter()
            .filter(|(m, _)| m == model)
            .filter_map(|(_, w)| w.upgrade())
            .map(|v| LiveVersion { version: v.number(), bytes_held: v.bytes_held() })
            .collect();
        out.sort_by_key(|v| v.version);
        out
    }

    /// The most recent unload records, oldest first.
    pub(crate) fn unloads(&self) -> Vec<UnloadRecord> {
        lock(&self.unloads).iter().cloned().collect()
    }
}
