//! Memory accounting: which versions are alive, what each holds, and what
//! came back when one was freed (seed 000's residual rate).
//!
//! Method: process RSS after asking glibc to trim its free heap
//! ([`crate::sys::trimmed_rss`]). ONNX Runtime allocates through C++
//! `new`/`malloc`, invisible to any Rust global allocator, so only the
//! kernel's view sees all of a version's memory. A version's `held` is the
//! RSS growth across its load (fetch to end of warmup), and `returned` is the
//! RSS drop across its free.
//!
//! A free's `residual` is not `held - returned`: memory a free does not give
//! back at once is mostly reused by the next load, so that difference
//! overstates what stays behind. What a leak looks like from outside is RSS
//! that grows swap after swap while the versions alive stay the same size.
//! So after every free the keeper computes the *unaccounted* memory — RSS
//! minus the footprint of every live version and of every version still
//! waiting to be freed — and a free's residual is how much that grew since
//! the previous free.
//!
//! A version's footprint is the largest `held` measured for a version of
//! the same model whose files add up to the same number of bytes (its own
//! included). `held` is RSS growth, and a load that reuses memory an
//! earlier free left resident grows RSS by less than it takes; without this,
//! every such load would show up once more as unaccounted memory. Versions
//! of one model with files of one size — the same architecture with new
//! weights — take the same memory.
//!
//! Residuals are signed and add up: their sum over any run of frees is the
//! growth of unaccounted RSS over it, the number an outside RSS graph
//! shows. The loader and the keeper take one measurement lock so a free
//! never lands inside a load's window; serving traffic still moves RSS by a
//! few pages either way.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak, mpsc};
use std::time::SystemTime;

use serde::Serialize;

use crate::backend::Model;
use crate::events::{Event, EventKind, EventSender};
use crate::heap::HeapLease;
use crate::trimmer::Trimmer;
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
    /// How much the unaccounted memory grew from the previous free to the
    /// end of this one (for the first free, from just before it): what this
    /// swap cycle left behind. Negative when memory was given back.
    pub residual: i64,
    /// RSS after this free minus the footprint of every live version: the
    /// server's own memory plus anything left behind.
    pub unaccounted: u64,
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
    /// Its footprint when it was queued, counted in `queued` until freed.
    footprint: u64,
    engine: Arc<dyn Model>,
    /// The version's build thread, where the engine is dropped.
    heap: Option<HeapLease>,
}

/// The largest `held` measured per (model, bytes of the version's files).
#[derive(Default)]
struct Footprints(Mutex<HashMap<(String, u64), u64>>);

impl Footprints {
    /// Records a version's measurement; every version is recorded when it
    /// starts to be tracked.
    fn record(&self, version: &Version) {
        let key = (version.model().to_owned(), version.manifest().total_bytes());
        let mut map = lock(&self.0);
        let entry = map.entry(key).or_default();
        *entry = (*entry).max(version.bytes_held());
    }

    /// The footprint of a version of `model` whose files add up to `files`
    /// bytes and which measured `held`.
    fn lookup(&self, model: &str, files: u64, held: u64) -> u64 {
        let recorded = lock(&self.0).get(&(model.to_owned(), files)).copied();
        recorded.unwrap_or(0).max(held)
    }

    fn of(&self, version: &Version) -> u64 {
        self.lookup(version.model(), version.manifest().total_bytes(), version.bytes_held())
    }
}

/// Hands a dropped version's engine to the memory keeper thread.
#[derive(Clone)]
pub struct Releaser {
    tx: mpsc::Sender<Released>,
    /// Footprint of the engines queued but not yet freed.
    queued: Arc<AtomicU64>,
    footprints: Arc<Footprints>,
}

impl Releaser {
    /// Queues the engine to be freed and measured; frees it in place if the
    /// keeper is gone.
    pub(crate) fn release(
        &self,
        model: &str,
        version: u64,
        files: u64,
        held: u64,
        engine: Arc<dyn Model>,
        heap: Option<HeapLease>,
    ) {
        let footprint = self.footprints.lookup(model, files, held);
        let job = Released { model: model.to_owned(), version, held, footprint, engine, heap };
        self.queued.fetch_add(footprint, Ordering::Relaxed);
        if let Err(mpsc::SendError(job)) = self.tx.send(job) {
            self.queued.fetch_sub(job.footprint, Ordering::Relaxed);
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
    /// Shared with the releaser: footprint of engines queued for freeing.
    queued: Arc<AtomicU64>,
    footprints: Arc<Footprints>,
    /// Unaccounted memory after the last free; `None` before the first.
    settled: Mutex<Option<u64>>,
    /// Where the heap is trimmed before RSS is read, at serving priority.
    trimmer: Trimmer,
}

fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Memory {
    /// Starts the keeper thread and the heap trimmer; returns the book and
    /// the releaser versions use. The trimmer keeps the calling thread's
    /// priority (see [`crate::trimmer`]), so call this at serving priority.
    pub(crate) fn start(events: EventSender, nice: i32, idle: bool) -> (Arc<Memory>, Releaser) {
        let queued = Arc::new(AtomicU64::new(0));
        let footprints = Arc::new(Footprints::default());
        let memory = Arc::new(Memory {
            live: Mutex::new(Vec::new()),
            unloads: Mutex::new(VecDeque::new()),
            measuring: Mutex::new(()),
            queued: Arc::clone(&queued),
            footprints: Arc::clone(&footprints),
            settled: Mutex::new(None),
            trimmer: Trimmer::start(),
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
        (memory, Releaser { tx, queued, footprints })
    }

    fn free(&self, job: Released, events: &EventSender) {
        // The version's session threads hold the engine until they have
        // stopped; wait for them so the free happens here.
        let waited = std::time::Instant::now();
        while Arc::strong_count(&job.engine) > 1 && waited.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _window = self.measure();
        let before = self.trimmed_rss().unwrap_or(0);
        let unaccounted_before = self.unaccounted(before);
        // Freed on the version's build thread, which then ends; see `HeapLease::free_there`.
        match job.heap {
            Some(heap) => heap.free_there(Box::new(job.engine)),
            None => drop(job.engine),
        }
        self.queued.fetch_sub(job.footprint, Ordering::Relaxed);
        let after = self.trimmed_rss().unwrap_or(0);
        let unaccounted = self.unaccounted(after);
        let previous = lock(&self.settled).replace(unaccounted).unwrap_or(unaccounted_before);
        let record = UnloadRecord {
            model: job.model,
            version: job.version,
            held: job.held,
            returned: before.saturating_sub(after),
            residual: signed(unaccounted) - signed(previous),
            unaccounted,
            at: SystemTime::now(),
        };
        tracing::info!(
            model = %record.model,
            version = record.version,
            held = record.held,
            returned = record.returned,
            residual = record.residual,
            unaccounted = record.unaccounted,
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
            kind: EventKind::Unloaded {
                held: record.held,
                returned: record.returned,
                residual: record.residual,
                unaccounted: record.unaccounted,
            },
        });
    }

    /// `rss` minus the footprint of live versions and of engines queued
    /// for freeing.
    fn unaccounted(&self, rss: u64) -> u64 {
        let live: Vec<Arc<Version>> = lock(&self.live).iter().filter_map(|(_, w)| w.upgrade()).collect();
        let live: u64 = live.iter().map(|v| self.footprints.of(v)).sum();
        rss.saturating_sub(live).saturating_sub(self.queued.load(Ordering::Relaxed))
    }

    /// The memory this process really holds now: RSS after the heap was
    /// trimmed, the trim made on the trimmer thread.
    pub(crate) fn trimmed_rss(&self) -> Option<u64> {
        self.trimmer.trimmed_rss()
    }

    /// Holds off frees while a load measures its memory.
    pub(crate) fn measure(&self) -> MutexGuard<'_, ()> {
        lock(&self.measuring)
    }

    /// Starts tracking a new version (by a weak reference only).
    pub(crate) fn track(&self, version: &Arc<Version>) {
        self.footprints.record(version);
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
