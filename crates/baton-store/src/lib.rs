//! Model repositories in object stores: `--repo s3://bucket/prefix`.
//!
//! The layout under the prefix is the one on disk: `<model>/model.toml` and
//! `<model>/<version>/…` with its MANIFEST, which is published last and
//! marks the version complete. [`StoreSource`] is a [`Source`] for the load
//! transaction:
//!
//! - **Listing** runs on a thread of its own at the poll interval, with
//!   backoff while the store fails. The source's listings and presence
//!   answers come from the last listing and never wait on the network, so
//!   a status request or the repository watcher never blocks on a store.
//!   While the store fails, presence is "unreadable", never "missing": what
//!   serves keeps serving.
//! - **Fetching** downloads a version into the cache (see [`cache`]) in one
//!   pass, hashing as the bytes arrive (see [`download`]), and hands the
//!   verify stage a seal of what it hashed, so no byte is read twice. A
//!   version already cached under the same MANIFEST is not downloaded again,
//!   after a restart too; with the store down, a cached version loads.
//! - The store's client runs on a small runtime of its own, on threads at
//!   the loader's priority.

pub mod cache;
pub mod download;
pub mod errors;
pub mod listing;
pub mod location;
mod notes;
pub mod profile;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use baton_core::files::source::{FetchError, Fetched, Presence, Source, StoreAnswer};
use baton_core::files::spec::ModelSpec;

use crate::cache::Cache;
use crate::download::{Counters, Plan, Remote};
use crate::listing::{ModelListing, Snapshot, VersionListing};
use crate::notes::Note;

pub use location::is_store_url;

/// How a store repository is read and cached.
#[derive(Clone, Debug)]
pub struct Options {
    /// The repository, `s3://bucket/prefix` and the like.
    pub url: String,
    /// baton's cache of the store's versions.
    pub cache_dir: PathBuf,
    /// At most this many bytes of version files in the cache; `None`: no bound.
    pub cache_max_bytes: Option<u64>,
    /// How often the store is listed while it answers.
    pub poll: Duration,
    /// The longest pause between listings while the store fails.
    pub max_backoff: Duration,
    /// How each file is read.
    pub plan: Plan,
    /// The nice value of the store client's threads (the loader's).
    pub nice: i32,
    /// Whether those threads run at idle priority (the loader's setting).
    pub idle: bool,
    /// Settings of the store's client over the environment's, by the
    /// library's configuration keys (`aws_endpoint_url`, `aws_access_key_id`, …).
    pub settings: Vec<(String, String)>,
}

impl Options {
    /// Defaults for `url` with the cache at `cache_dir`: listed every
    /// second, backing off to 30 s; 8 MiB ranges, four at once.
    pub fn new(url: &str, cache_dir: PathBuf) -> Options {
        Options {
            url: url.trim_end_matches('/').to_owned(),
            cache_dir,
            cache_max_bytes: None,
            poll: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            plan: Plan { range_bytes: 8 << 20, parallel: 4, attempts: 6 },
            nice: 10,
            idle: false,
            settings: Vec::new(),
        }
    }
}

/// How many times a download starts over on a version published again
/// while it was being fetched.
const RESTARTS: u32 = 2;

/// Says whether a model's version serves now: such versions are not evicted.
pub type Serving = Box<dyn Fn(&str, u64) -> bool + Send + Sync>;

/// A repository in an object store, read through a local cache.
pub struct StoreSource {
    shared: Arc<Shared>,
    stop: Option<Sender<()>>,
    lister: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    options: Options,
    location: location::Location,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    cache: Cache,
    snapshot: Mutex<Arc<Snapshot>>,
    answer: Mutex<Answer>,
    counters: Counters,
    cache_hits: AtomicU64,
    /// Downloads started over because the store changed during them.
    restarts: AtomicU64,
    serving: OnceLock<Serving>,
    /// One download at a time: two would share the link and the cache bound.
    fetching: Mutex<()>,
}

/// The last listing's outcome.
#[derive(Clone, Debug, Default)]
struct Answer {
    /// A listing has succeeded since start.
    listed: bool,
    /// The last listing's failure: kind and message.
    failed: Option<(&'static str, String)>,
    failures: u64,
    listings: u64,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Dropping a runtime inside another one's worker would panic.
        if let Some(runtime) = self.runtime.lock().unwrap_or_else(|e| e.into_inner()).take() {
            runtime.shutdown_background();
        }
    }
}

impl StoreSource {
    /// Opens the store and its cache and lists the store once. A store that
    /// cannot be listed now is no error: the source starts from what the
    /// cache holds and keeps listing.
    pub fn open(options: Options) -> Result<StoreSource, String> {
        let location = location::open(&options.url, &options.settings)?;
        let cache = Cache::open(options.cache_dir.clone(), options.cache_max_bytes).map_err(|e| e.to_string())?;
        let (nice, idle) = (options.nice, options.idle);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("baton-store")
            .on_thread_start(move || {
                let _ = baton_core::threads::sys::lower_current_thread(nice, idle);
            })
            .enable_all()
            .build()
            .map_err(|e| format!("starting the store client: {e}"))?;
        let shared = Arc::new(Shared {
            snapshot: Mutex::new(Arc::new(from_cache(&cache))),
            handle: runtime.handle().clone(),
            runtime: Mutex::new(Some(runtime)),
            options,
            location,
            cache,
            answer: Mutex::new(Answer::default()),
            counters: Counters::default(),
            cache_hits: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            serving: OnceLock::new(),
            fetching: Mutex::new(()),
        });
        shared.refresh();
        let (stop, stopped) = std::sync::mpsc::channel();
        let lister = Arc::clone(&shared);
        let lister = std::thread::Builder::new()
            .name("baton-store-list".into())
            .spawn(move || lister.keep_listing(&stopped))
            .map_err(|e| format!("starting the store's lister: {e}"))?;
        Ok(StoreSource { shared, stop: Some(stop), lister: Some(lister) })
    }

    /// Tells the cache which versions serve, so that it never evicts them.
    pub fn set_serving(&self, serving: Serving) {
        let _ = self.shared.serving.set(serving);
    }

    /// Lists the store now, as the lister does.
    pub fn refresh(&self) {
        self.shared.refresh();
    }

    /// The cache.
    pub fn cache(&self) -> &Cache {
        &self.shared.cache
    }

    /// Downloads started over because an object changed during them.
    pub fn restarts(&self) -> u64 {
        self.shared.restarts.load(Ordering::Relaxed)
    }
}

impl Drop for StoreSource {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(lister) = self.lister.take() {
            let _ = lister.join();
        }
    }
}

/// What the cache holds, as a snapshot: what a server started with the
/// store down can serve.
fn from_cache(cache: &Cache) -> Snapshot {
    let mut snapshot = Snapshot::default();
    for entry in cache.entries() {
        let Some(spec) = cache.spec(&entry.model) else { continue };
        let model = snapshot.models.entry(entry.model.clone()).or_insert_with(|| ModelListing {
            spec,
            spec_tag: String::new(),
            versions: Default::default(),
        });
        model.versions.insert(entry.version, VersionListing::default());
    }
    snapshot
}

impl Shared {
    fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(&self.snapshot.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn answer(&self) -> Answer {
        self.answer.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Lists the store; on success the listing replaces the snapshot.
    /// Returns whether it succeeded.
    fn refresh(&self) -> bool {
        let previous = self.snapshot();
        let listed = self.handle.block_on(listing::list(
            self.location.store.as_ref(),
            &self.location.prefix,
            &self.options.url,
            &previous,
        ));
        let mut answer = self.answer.lock().unwrap_or_else(|e| e.into_inner());
        answer.listings += 1;
        match listed {
            Ok(snapshot) => {
                for (name, model) in &snapshot.models {
                    self.cache.keep_spec(name, &model.spec);
                }
                if answer.failed.is_some() {
                    tracing::info!(store = %self.options.url, after = answer.failures, "The model store answers again.");
                }
                *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(snapshot);
                answer.listed = true;
                answer.failed = None;
                answer.failures = 0;
                true
            }
            Err(error) => {
                if answer.failed.is_none() {
                    tracing::warn!(store = %self.options.url, kind = error.kind(), %error, "The model store cannot be listed; what serves keeps serving.");
                }
                answer.failed = Some((error.kind(), error.to_string()));
                answer.failures += 1;
                false
            }
        }
    }

    /// Lists at the poll interval, backing off while the store fails, and
    /// logs the notes downloads left at least once a second.
    fn keep_listing(&self, stop: &Receiver<()>) {
        let tick = self.options.poll.min(Duration::from_secs(1));
        let mut pause = self.options.poll;
        let mut next = Instant::now() + pause;
        loop {
            let wait = next.saturating_duration_since(Instant::now()).min(tick);
            match stop.recv_timeout(wait) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => break,
            }
            self.counters.notes.log(&self.options.url);
            if Instant::now() < next {
                continue;
            }
            pause = if self.refresh() {
                self.options.poll
            } else {
                (pause * 2).min(self.options.max_backoff.max(self.options.poll))
            };
            next = Instant::now() + pause;
        }
        self.counters.notes.log(&self.options.url);
    }

    /// Presence as the last listing says, or unreadable while the store fails.
    fn presence(&self, found: impl FnOnce(&Snapshot) -> bool) -> Presence {
        let answer = self.answer();
        if let Some((_, message)) = answer.failed {
            return Presence::Unreadable(message);
        }
        if !answer.listed {
            return Presence::Unreadable(format!("{} has not been listed yet", self.options.url));
        }
        if found(&self.snapshot()) { Presence::Present } else { Presence::Missing }
    }

    fn fetch(&self, model: &str, version: u64) -> Result<Fetched, FetchError> {
        let _one = self.fetching.lock().unwrap_or_else(|e| e.into_inner());
        let snapshot = self.snapshot();
        let listing = snapshot.models.get(model).and_then(|m| m.versions.get(&version));
        let store_up = self.answer().failed.is_none() && self.answer().listed;
        // With the store down, whatever is cached is the best there is.
        let tag = listing.filter(|_| store_up).map(|l| l.manifest_tag.as_str());
        if let Some(cached) = self.cache.lookup(model, version, tag) {
            self.cache_hits.fetch_add(1, Ordering::Relaxed);
            let dir = cached.dir.display().to_string();
            self.counters.notes.push(Note::CacheHit { model: model.into(), version, dir });
            return Ok(cached);
        }
        let place = self.options.url.clone();
        let Some(listing) = listing.filter(|_| store_up) else {
            if let Some((kind, message)) = self.answer().failed {
                return Err(FetchError::Store { kind, message });
            }
            return Err(if snapshot.models.contains_key(model) {
                FetchError::VersionNotFound { model: model.into(), version, place }
            } else {
                FetchError::ModelNotFound { model: model.into(), place }
            });
        };
        let listing = listing.clone();
        drop(snapshot);
        self.download(model, version, listing)
    }

    /// Downloads the version as `listing` describes it into the cache. A
    /// download that finds an object changed since the listing
    /// (`store_changed`) lists the store again and, when the version's
    /// objects are no longer what they were (published again, or a file
    /// replaced), starts over on what the store holds now, at most
    /// [`RESTARTS`] times; a store that keeps changing fails the fetch with
    /// `store_changed`. Nothing of an abandoned download is kept.
    fn download(&self, model: &str, version: u64, mut listing: VersionListing) -> Result<Fetched, FetchError> {
        let mut restarts = 0;
        loop {
            match self.download_once(model, version, &listing) {
                Err(error) if error.kind() == "store_changed" && restarts < RESTARTS => {
                    self.refresh();
                    let snapshot = self.snapshot();
                    let now = snapshot.models.get(model).and_then(|m| m.versions.get(&version));
                    match now {
                        Some(now) if *now != listing => {
                            restarts += 1;
                            self.restarts.fetch_add(1, Ordering::Relaxed);
                            let note = Note::Restarted { model: model.into(), version, error: error.to_string() };
                            self.counters.notes.push(note);
                            listing = now.clone();
                        }
                        _ => return Err(error),
                    }
                }
                done => return done,
            }
        }
    }

    fn download_once(&self, model: &str, version: u64, listing: &VersionListing) -> Result<Fetched, FetchError> {
        let place = self.options.url.clone();
        let needed = listing.sizes.values().sum();
        let never = |_: &str, _: u64| false;
        let serving: &dyn Fn(&str, u64) -> bool = match self.serving.get() {
            Some(serving) => serving.as_ref(),
            None => &never,
        };
        for (model, version) in self.cache.make_room(model, version, needed, serving)? {
            self.counters.notes.push(Note::Evicted { model, version });
        }
        let into = self.cache.partial(model, version)?;
        let prefix = self.location.prefix.child(model).child(version.to_string());
        let remote = Remote { store: self.location.store.as_ref(), prefix, url: format!("{place}/{model}/{version}") };
        let started = Instant::now();
        let before = self.counters.bytes.load(Ordering::Relaxed);
        let fetched =
            self.handle.block_on(download::version(&remote, listing, &into, self.options.plan, &self.counters));
        let (_, seal) = fetched.inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&into);
        })?;
        let fetched = self.cache.commit(model, version, &into, seal, &listing.manifest_tag)?;
        let bytes = self.counters.bytes.load(Ordering::Relaxed) - before;
        let ms = started.elapsed().as_millis() as u64;
        self.counters.notes.push(Note::Downloaded { model: model.into(), version, bytes, ms });
        Ok(fetched)
    }
}

impl Source for StoreSource {
    fn models(&self) -> Result<Vec<String>, FetchError> {
        Ok(self.shared.snapshot().models.keys().cloned().collect())
    }

    fn versions(&self, model: &str) -> Result<Vec<u64>, FetchError> {
        let snapshot = self.shared.snapshot();
        let listing = snapshot
            .models
            .get(model)
            .ok_or_else(|| FetchError::ModelNotFound { model: model.into(), place: self.shared.options.url.clone() })?;
        Ok(listing.versions.keys().copied().collect())
    }

    fn presence(&self, model: &str, version: Option<u64>) -> Presence {
        self.shared.presence(|s| {
            let listed = s.models.get(model);
            match version {
                None => listed.is_some(),
                Some(v) => listed.is_some_and(|m| m.versions.contains_key(&v)),
            }
        })
    }

    fn spec(&self, model: &str) -> Result<ModelSpec, FetchError> {
        let snapshot = self.shared.snapshot();
        let listing = snapshot
            .models
            .get(model)
            .ok_or_else(|| FetchError::ModelNotFound { model: model.into(), place: self.shared.options.url.clone() })?;
        let url = &self.shared.options.url;
        ModelSpec::parse(&listing.spec).map_err(|e| FetchError::Spec(format!("{url}/{model}/model.toml: {e}")))
    }

    fn fetch(&self, model: &str, version: u64) -> Result<Fetched, FetchError> {
        self.shared.fetch(model, version)
    }

    fn version_stamp(&self, model: &str, version: u64) -> Option<String> {
        let snapshot = self.shared.snapshot();
        let tag = &snapshot.models.get(model)?.versions.get(&version)?.manifest_tag;
        (!tag.is_empty()).then(|| tag.clone())
    }

    fn store_answer(&self) -> Option<StoreAnswer> {
        let answer = self.shared.answer();
        let (kind, message) = answer.failed.unwrap_or(("ok", String::new()));
        Some(StoreAnswer {
            url: self.shared.options.url.clone(),
            ok: kind == "ok" && answer.listed,
            kind,
            message,
            failures: answer.failures,
            listings: answer.listings,
            bytes_fetched: self.shared.counters.bytes.load(Ordering::Relaxed),
            cache_hits: self.shared.cache_hits.load(Ordering::Relaxed),
        })
    }
}
