//! Memory accounting: which versions are alive, what each holds, and what
//! came back when one was freed.
//!
//! Method: process RSS after asking glibc to trim its free heap
//! ([`crate::threads::sys::trimmed_rss`]), since ONNX Runtime allocates where no Rust
//! global allocator sees. A version's `held` is the RSS growth across its
//! load; `returned` is the RSS drop across its free. A free's `residual` is
//! how much the *unaccounted* memory (RSS minus the footprint of every live
//! version and of every version waiting to be freed) grew since the previous
//! free; residuals are signed and add up to the growth an outside RSS graph
//! shows. A version's footprint is the largest `held` measured for a
//! version of the same model whose files add up to the same size. Why each
//! of these, and how close they come to RSS: docs/hot-swap.md, "Memory:
//! held, returned, residual".
//!
//! The loader and the keeper, both lowered threads, share one measurement
//! lock so a free never lands inside a load's window. The book itself
//! (live versions, footprints, unload records) is read by serving threads,
//! so the lowered threads change it only through the registry's agent
//! ([`crate::threads::agent`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, MutexGuard, Weak};
use std::time::{Instant, SystemTime};

use serde::Serialize;

use crate::registry::events::{Event, EventKind, EventSender};
use crate::run::release::{Footprints, Released, Releaser};
use crate::run::version::Version;
use crate::threads::agent::Agent;
use crate::threads::sync::{self, Lock};
use crate::threads::trimmer::Trimmer;

/// How many unload records are kept, and how many freed versions are
/// remembered for loads waiting for them.
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
    /// For a version that ran in a worker process: the process, what it
    /// held, and whether it is gone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerFreed>,
    /// Whether it was a rollout's twin of a stable version, which goes on
    /// serving: the record is the twin's, not the version's.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub twin: bool,
    /// When it was freed.
    #[serde(skip)]
    pub at: SystemTime,
}

/// The unload check of a version that ran in a worker process: its memory
/// is the process's, and comes back whole when the process has ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerFreed {
    /// The worker's process id.
    pub pid: u32,
    /// Its resident memory just before it was told to exit, in bytes (0
    /// when it could not be read).
    pub rss: u64,
    /// Whether the process was gone once the version was freed; `null`
    /// where that cannot be seen.
    pub gone: Option<bool>,
}

/// A version still alive: served, kept for rollback, or pinned by requests.
#[derive(Clone, Debug, Serialize)]
pub struct LiveVersion {
    /// Version number.
    pub version: u64,
    /// Bytes it holds.
    pub bytes_held: u64,
    /// Its memory, split up.
    pub memory: crate::run::version::VersionMemory,
    /// Which kind of update it was.
    pub update: crate::run::backend::UpdateKind,
    /// Why it was that kind.
    pub update_reason: crate::run::backend::UpdateReason,
    /// Whether it is a rollout's twin of the stable version (same number,
    /// a second instance that only runs comparison copies).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub twin: bool,
    /// The worker process it runs in, when it runs in one: its pid,
    /// resident memory and start time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<crate::run::backend::ProcessInfo>,
    /// False once the worker process it ran in has ended by itself.
    pub alive: bool,
}

/// What the keeper measured around one free, for the agent to settle.
struct Freed {
    model: String,
    version: u64,
    twin: bool,
    held: u64,
    worker: Option<WorkerFreed>,
    before: u64,
    after: u64,
    unaccounted_before: u64,
}

/// The registry's memory book-keeping, shared by the loader, the keeper
/// thread and status queries.
pub(crate) struct Memory {
    live: Lock<Vec<(String, Weak<Version>)>>,
    unloads: Lock<VecDeque<UnloadRecord>>,
    /// The measurement window, between the loader and the keeper only.
    measuring: Lock<()>,
    /// Shared with the releaser: footprint of engines queued for freeing.
    queued: Arc<AtomicU64>,
    footprints: Arc<Footprints>,
    /// Unaccounted memory after the last free; `None` before the first.
    settled: Lock<Option<u64>>,
    /// Where the heap is trimmed before RSS is read, at serving priority.
    trimmer: Trimmer,
    /// Where the lowered threads' changes to the book are applied.
    agent: Agent,
    events: EventSender,
    /// Versions the keeper has freed, newest last: what a load under the
    /// resource swap policy waits for. Lowered threads only.
    freed: Lock<VecDeque<(String, u64)>>,
    freed_signal: Condvar,
}

/// What the containers of packed weights that `versions` share hold
/// beyond those versions' own additions: the packed matrices of versions
/// that are gone, which no live version's measurement counts. Each
/// container is counted once.
fn retained(versions: &[Arc<Version>]) -> u64 {
    let mut containers: Vec<(u64, u64, u64)> = Vec::new();
    for version in versions {
        let info = version.weights();
        let Some(container) = info.container else { continue };
        let added = info.shared.saturating_sub(info.reused);
        match containers.iter_mut().find(|(id, _, _)| *id == container.id) {
            Some((_, _, sum)) => *sum = sum.saturating_add(added),
            None => containers.push((container.id, container.holds, added)),
        }
    }
    containers.iter().map(|(_, holds, added)| holds.saturating_sub(*added)).sum()
}

/// What live versions hold, for a load's memory budget.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct InUse {
    /// Every model's live versions, and engines waiting to be freed.
    pub all: u64,
    /// The loading model's live versions.
    pub model: u64,
}

fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl Memory {
    /// Starts the keeper thread and the heap trimmer; returns the book and
    /// the releaser versions use. The trimmer keeps the calling thread's
    /// priority (see [`crate::threads::trimmer`]), so call this at serving priority.
    pub(crate) fn start(events: EventSender, agent: Agent, nice: i32, idle: bool) -> (Arc<Memory>, Releaser) {
        let queued = Arc::new(AtomicU64::new(0));
        let footprints = Arc::new(Footprints::default());
        let memory = Arc::new(Memory {
            live: Lock::new(Vec::new()),
            unloads: Lock::new(VecDeque::new()),
            measuring: Lock::among_lowered(()),
            queued: Arc::clone(&queued),
            footprints: Arc::clone(&footprints),
            settled: Lock::new(None),
            trimmer: Trimmer::start(),
            agent: agent.clone(),
            events,
            freed: Lock::among_lowered(VecDeque::new()),
            freed_signal: Condvar::new(),
        });
        let book = Arc::downgrade(&memory);
        let tx = sync::spawn_receiver::<Released>("baton-release", move |jobs| {
            crate::threads::agent::lower_current_thread(&agent, nice, idle);
            drop(agent);
            while let Some(job) = jobs.recv() {
                let Some(memory) = book.upgrade() else {
                    drop(job.engine);
                    continue;
                };
                memory.free(job);
            }
        })
        .expect("spawning the release thread");
        (memory, Releaser { tx, queued, footprints })
    }

    /// On the keeper thread: frees a version's engine, measures, and has the
    /// agent settle the book.
    fn free(self: &Arc<Self>, job: Released) {
        // The version's session threads hold the engine until they have
        // stopped; wait for them so the free happens here.
        let waited = std::time::Instant::now();
        while Arc::strong_count(&job.engine) > 1 && waited.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _window = self.measure();
        let before = self.trimmed_rss().unwrap_or(0);
        let book = Arc::clone(self);
        let unaccounted_before = self.agent.call(move || book.unaccounted(before));
        // A worker's memory is its process's: read before it is told to
        // exit, and checked gone after (freeing a worker's version waits
        // for its process to end).
        let process = job.engine.process();
        // Freed on the version's build thread, which then ends; see `HeapLease::free_there`.
        match job.heap {
            Some(heap) => heap.free_there(Box::new(job.engine)),
            None => drop(job.engine),
        }
        self.queued.fetch_sub(job.footprint, Ordering::Relaxed);
        let after = self.trimmed_rss().unwrap_or(0);
        let book = Arc::clone(self);
        let (model, version, twin) = (job.model.clone(), job.version, job.twin);
        let worker = process.map(|p| WorkerFreed {
            pid: p.pid,
            rss: p.rss.unwrap_or(0),
            gone: crate::threads::sys::process_gone(p.pid),
        });
        let freed =
            Freed { model: job.model, version, twin, held: job.held, worker, before, after, unaccounted_before };
        self.agent.call(move || book.settle(freed));
        // A twin's free is not its version's: nothing waits for it.
        if twin {
            return;
        }
        let mut list = self.freed.lock();
        if list.len() == UNLOAD_HISTORY {
            list.pop_front();
        }
        list.push_back((model, version));
        self.freed_signal.notify_all();
    }

    /// On a lowered thread: waits until the keeper has freed every one of
    /// `versions` of `model`, or `until` passes; returns the versions not
    /// freed by then.
    pub(crate) fn wait_freed(&self, model: &str, versions: &[u64], until: Instant) -> Vec<u64> {
        let mut list = self.freed.lock();
        loop {
            let left: Vec<u64> =
                versions.iter().copied().filter(|v| !list.iter().any(|(m, f)| m == model && f == v)).collect();
            let now = Instant::now();
            if left.is_empty() || now >= until {
                return left;
            }
            list = self.freed_signal.wait_timeout(list, until - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Forgets that versions of `model` were freed, before a load waits for
    /// some of them (a version number can be loaded and freed again).
    pub(crate) fn forget_freed(&self, model: &str) {
        self.freed.lock().retain(|(m, _)| m != model);
    }

    /// What live versions hold: every model's (with engines queued for
    /// freeing) and `model`'s, leaving out `leaving`, the versions a swap
    /// frees before its candidate loads. Read on the agent, since the book
    /// is the serving threads'.
    pub(crate) fn in_use(self: &Arc<Self>, model: &str, leaving: Vec<Weak<Version>>) -> InUse {
        let (book, model) = (Arc::clone(self), model.to_owned());
        self.agent.call(move || {
            let live: Vec<(String, Weak<Version>)> = book.live.lock().clone();
            let mut in_use = InUse { all: book.queued.load(Ordering::Relaxed), model: 0 };
            let mut counted = Vec::new();
            for (name, weak) in live {
                let Some(version) = weak.upgrade() else { continue };
                if leaving.iter().any(|l| l.ptr_eq(&weak)) {
                    continue;
                }
                let holds = version.holds();
                in_use.all = in_use.all.saturating_add(holds);
                if name == model {
                    in_use.model = in_use.model.saturating_add(holds);
                }
                counted.push(version);
            }
            // What shared containers keep of versions that are gone.
            in_use.all = in_use.all.saturating_add(retained(&counted));
            counted.retain(|v| v.model() == model);
            in_use.model = in_use.model.saturating_add(retained(&counted));
            in_use
        })
    }

    /// What a version of `model` whose files add up to `files` bytes is
    /// expected to hold: the footprint measured for one of that size, and
    /// never less than the files; and whether a footprint was known.
    pub(crate) fn estimate(self: &Arc<Self>, model: &str, files: u64) -> (u64, crate::registry::budget::Basis) {
        let (book, model) = (Arc::clone(self), model.to_owned());
        let footprint = self.agent.call(move || book.footprints.0.lock().get(&(model, files)).copied());
        match footprint {
            Some(bytes) if bytes > files => (bytes, crate::registry::budget::Basis::Footprint),
            _ => (files, crate::registry::budget::Basis::Files),
        }
    }

    /// On the agent: records a measured free and announces it.
    fn settle(&self, freed: Freed) {
        let unaccounted = self.unaccounted(freed.after);
        let previous = self.settled.lock().replace(unaccounted).unwrap_or(freed.unaccounted_before);
        let record = UnloadRecord {
            model: freed.model,
            version: freed.version,
            held: freed.held,
            returned: freed.before.saturating_sub(freed.after),
            residual: signed(unaccounted) - signed(previous),
            unaccounted,
            worker: freed.worker,
            twin: freed.twin,
            at: SystemTime::now(),
        };
        tracing::info!(
            model = %record.model,
            version = record.version,
            twin = record.twin,
            held = record.held,
            returned = record.returned,
            residual = record.residual,
            unaccounted = record.unaccounted,
            "Freed a version and measured the memory that came back."
        );
        // Recorded before it is announced, so a subscriber that hears of it can read it.
        {
            let mut unloads = self.unloads.lock();
            if unloads.len() == UNLOAD_HISTORY {
                unloads.pop_front();
            }
            unloads.push_back(record.clone());
        }
        let _ = self.events.send(Event {
            model: record.model.clone(),
            version: Some(record.version),
            at: record.at,
            kind: EventKind::Unloaded {
                held: record.held,
                returned: record.returned,
                residual: record.residual,
                unaccounted: record.unaccounted,
                worker: record.worker,
                twin: record.twin,
            },
        });
    }

    /// `rss` minus the footprint of live versions, of what shared
    /// containers keep of gone ones, and of engines queued for freeing.
    fn unaccounted(&self, rss: u64) -> u64 {
        let live: Vec<Arc<Version>> = self.live.lock().iter().filter_map(|(_, w)| w.upgrade()).collect();
        let held: u64 = live.iter().map(|v| self.footprints.of(v)).sum::<u64>() + retained(&live);
        rss.saturating_sub(held).saturating_sub(self.queued.load(Ordering::Relaxed))
    }

    /// What the shared containers of `model`'s live versions keep of
    /// versions that are gone (see [`retained`]).
    pub(crate) fn retained(&self, model: &str) -> u64 {
        let live: Vec<Arc<Version>> =
            self.live.lock().iter().filter(|(m, _)| m == model).filter_map(|(_, w)| w.upgrade()).collect();
        retained(&live)
    }

    /// The memory this process really holds now: RSS after the heap was
    /// trimmed, the trim made on the trimmer thread.
    pub(crate) fn trimmed_rss(&self) -> Option<u64> {
        self.trimmer.trimmed_rss()
    }

    /// Holds off frees while a load measures its memory. For lowered
    /// threads only.
    pub(crate) fn measure(&self) -> MutexGuard<'_, ()> {
        self.measuring.lock()
    }

    /// Starts tracking a new version (by a weak reference only); called by
    /// the loading thread, applied on the agent before it returns.
    pub(crate) fn track(self: &Arc<Self>, version: &Arc<Version>) {
        let (book, version) = (Arc::clone(self), Arc::clone(version));
        self.agent.call(move || book.record_live(&version));
    }

    fn record_live(&self, version: &Arc<Version>) {
        self.footprints.record(version);
        let mut live = self.live.lock();
        live.retain(|(_, w)| w.strong_count() > 0);
        live.push((version.model().to_owned(), Arc::downgrade(version)));
    }

    /// Versions of `model` still alive, ascending.
    pub(crate) fn live(&self, model: &str) -> Vec<LiveVersion> {
        let live = self.live.lock();
        let mut out: Vec<LiveVersion> = live
            .iter()
            .filter(|(m, _)| m == model)
            .filter_map(|(_, w)| w.upgrade())
            .map(|v| {
                let weights = v.weights();
                LiveVersion {
                    version: v.number(),
                    bytes_held: v.bytes_held(),
                    memory: v.memory(),
                    update: weights.kind(),
                    update_reason: weights.why(),
                    twin: v.is_twin(),
                    worker: v.process(),
                    alive: v.alive(),
                }
            })
            .collect();
        out.sort_by_key(|v| (v.version, v.twin));
        out
    }

    /// The most recent unload records, oldest first.
    pub(crate) fn unloads(&self) -> Vec<UnloadRecord> {
        self.unloads.lock().iter().cloned().collect()
    }
}
