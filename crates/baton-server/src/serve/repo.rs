//! The repository `--repo` names: a directory, or an object store read
//! through baton's cache (`s3://bucket/prefix` and the like).

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::Context;
use baton_core::files::source::{LocalRepository, Source};
use baton_core::registry::events::EventKind;
use baton_store::{Options, StoreSource};

use super::{ServeArgs, demo};
use crate::app::App;

/// The repository a server reads.
pub struct Repo {
    /// How messages name it: a path or a URL.
    pub name: String,
    /// Where versions come from.
    pub source: Arc<dyn Source>,
    /// Where the state file lives unless `--state-dir` says otherwise: the
    /// directory, or the cache of a store.
    pub state_root: PathBuf,
    store: Option<Arc<StoreSource>>,
}

/// How a store repository is cached and read.
pub struct StoreCache<'a> {
    /// The cache directory.
    pub dir: &'a std::path::Path,
    /// Its bound in bytes.
    pub max_bytes: Option<u64>,
    /// How often the store is listed.
    pub poll: Duration,
    /// The loader's nice value and idle class, for the store client's threads.
    pub nice: i32,
    /// See `nice`.
    pub idle: bool,
}

/// Opens the object store `url` as a source read through `cache`.
pub fn open_store(url: &str, cache: &StoreCache<'_>) -> anyhow::Result<Arc<StoreSource>> {
    let mut options = Options::new(url, cache.dir.to_owned());
    options.cache_max_bytes = cache.max_bytes;
    options.poll = cache.poll;
    (options.nice, options.idle) = (cache.nice, cache.idle);
    let store = StoreSource::open(options).map_err(|e| anyhow::anyhow!("the model store {url}: {e}"))?;
    tracing::info!(store = url, cache = %cache.dir.display(), "Reading models from an object store through the local cache.");
    Ok(Arc::new(store))
}

impl Repo {
    /// The repository `args` name; the demo one without `--repo`.
    pub fn open(args: &ServeArgs) -> anyhow::Result<Repo> {
        let root = match &args.repo {
            Some(root) => root.clone(),
            None => {
                let root =
                    demo::prepare(std::path::Path::new(".baton/demo")).context("preparing the demo repository")?;
                tracing::info!(repo = %root.display(), "No --repo given; serving the demo repository.");
                root
            }
        };
        let text = root.to_string_lossy().into_owned();
        if baton_store::is_store_url(&text) {
            let cache = StoreCache {
                dir: &args.cache_dir,
                max_bytes: args.cache_max_bytes,
                poll: args.poll_interval(),
                nice: args.loader_nice,
                idle: args.loader_idle,
            };
            let store = open_store(&text, &cache)?;
            let source: Arc<dyn Source> = store.clone();
            return Ok(Repo { name: text, source, state_root: args.cache_dir.clone(), store: Some(store) });
        }
        anyhow::ensure!(root.is_dir(), "the model repository {} is not a directory", root.display());
        // One model's directory given as the repository (a KServe storageUri
        // naming the model, not the repository above it) would serve nothing
        // and still be ready: say what to give instead.
        anyhow::ensure!(
            !root.join("model.toml").is_file(),
            "the model repository {} holds a model.toml: it is one model's directory, not a repository of \
             models; give --repo the directory above it (with KServe, a storageUri that holds the model's \
             directory)",
            root.display()
        );
        Ok(Repo { name: text, source: Arc::new(LocalRepository::new(&root)), state_root: root, store: None })
    }

    /// Whether it is an object store read through the cache.
    pub fn is_store(&self) -> bool {
        self.store.is_some()
    }

    /// Lets the cache know which versions serve, so that it keeps them.
    pub fn serve_for(&self, app: &Arc<App>) {
        if let Some(store) = &self.store {
            let app: Weak<App> = Arc::downgrade(app);
            store.set_serving(Box::new(move |model, version| {
                let Some(app) = app.upgrade() else { return false };
                let snapshot = app.registry.snapshot();
                snapshot.model(model).is_some_and(|r| r.versions().any(|v| v.number() == version))
            }));
        }
    }
}

/// Announces on the event stream each change in what the store answers:
/// a failure of another kind, or the store answering again.
pub async fn announce_store(app: Arc<App>, every: Duration) {
    let mut last: Option<(bool, &'static str)> = None;
    let mut ticks = tokio::time::interval(every);
    loop {
        ticks.tick().await;
        let Some(answer) = app.registry.source().store_answer() else { return };
        let now = (answer.ok, answer.kind);
        // Before the first listing nothing is known; nothing to announce.
        if last == Some(now) || (last.is_none() && answer.listings == 0) {
            continue;
        }
        if last.is_some() || !answer.ok {
            let kind = EventKind::Store { ok: answer.ok, kind: answer.kind.to_owned(), message: answer.message };
            app.registry.announce("", None, kind);
        }
        last = Some(now);
    }
}
