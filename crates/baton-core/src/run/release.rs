//! How a dropped version hands its engine to the registry's memory
//! keeper thread, which frees it where it was built and measures what came
//! back (`registry::memory`): the releaser a version holds, the job it
//! queues, and the footprints the releaser and the book share.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::run::backend::Model;
use crate::run::version::Version;
use crate::threads::heap::HeapLease;
use crate::threads::sync::{self, Lock};

/// Which version a released engine was, as its unload record names it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Freeing<'a> {
    /// Model name.
    pub(crate) model: &'a str,
    /// Version number.
    pub(crate) version: u64,
    /// Whether it was a rollout's twin of the stable version.
    pub(crate) twin: bool,
}

/// A dropped version's engine on its way to the keeper thread.
pub(crate) struct Released {
    pub(crate) model: String,
    pub(crate) version: u64,
    pub(crate) twin: bool,
    pub(crate) held: u64,
    /// Its footprint when it was queued, counted in `queued` until freed.
    pub(crate) footprint: u64,
    pub(crate) engine: Arc<dyn Model>,
    /// The version's build thread, where the engine is dropped.
    pub(crate) heap: Option<HeapLease>,
}

/// The largest `held` measured per (model, bytes of the version's files).
#[derive(Default)]
pub(crate) struct Footprints(pub(crate) Lock<HashMap<(String, u64), u64>>);

impl Footprints {
    /// Records a version's measurement; every version is recorded when it
    /// starts to be tracked.
    pub(crate) fn record(&self, version: &Version) {
        let key = (version.model().to_owned(), version.manifest().total_bytes());
        let mut map = self.0.lock();
        let entry = map.entry(key).or_default();
        *entry = (*entry).max(version.bytes_held());
    }

    /// The footprint of a version of `model` whose files add up to `files`
    /// bytes and which measured `held`.
    pub(crate) fn lookup(&self, model: &str, files: u64, held: u64) -> u64 {
        let recorded = self.0.lock().get(&(model.to_owned(), files)).copied();
        recorded.unwrap_or(0).max(held)
    }

    pub(crate) fn of(&self, version: &Version) -> u64 {
        self.lookup(version.model(), version.manifest().total_bytes(), version.bytes_held())
    }
}

/// Hands a dropped version's engine to the memory keeper thread.
#[derive(Clone)]
pub struct Releaser {
    pub(crate) tx: sync::Sender<Released>,
    /// Footprint of the engines queued but not yet freed.
    pub(crate) queued: Arc<AtomicU64>,
    pub(crate) footprints: Arc<Footprints>,
}

impl Releaser {
    /// Queues the engine to be freed and measured; frees it in place if the
    /// keeper is gone.
    pub(crate) fn release(
        &self,
        freeing: Freeing<'_>,
        files: u64,
        held: u64,
        engine: Arc<dyn Model>,
        heap: Option<HeapLease>,
    ) {
        let Freeing { model, version, twin } = freeing;
        let footprint = self.footprints.lookup(model, files, held);
        let job = Released { model: model.to_owned(), version, twin, held, footprint, engine, heap };
        self.queued.fetch_add(footprint, Ordering::Relaxed);
        if let Err(job) = self.tx.send(job) {
            self.queued.fetch_sub(job.footprint, Ordering::Relaxed);
            drop(job.engine);
        }
    }
}
