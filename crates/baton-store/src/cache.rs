//! baton's local cache of a store's versions.
//!
//! ```text
//! <cache>/<model>/model.toml        the model.toml last listed
//! <cache>/<model>/<version>/…       the version's files, MANIFEST included
//! <cache>/<model>/<version>.seal    what the fetch hashed (baton_core::files::seal)
//! <cache>/<model>/<version>.tag     the store's tag of the MANIFEST fetched
//! <cache>/<model>/.<version>.partial  a fetch under way
//! ```
//!
//! A version is cached when its directory, seal and tag are there and every
//! file the MANIFEST lists is sealed with the MANIFEST's digest. The seal's
//! modification time is the version's last use; eviction removes the least
//! recently used versions that do not serve.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use baton_core::files::manifest::{self, MANIFEST};
use baton_core::files::seal::Seal;
use baton_core::files::source::{FetchError, Fetched};

/// The cache directory and its bound.
#[derive(Clone, Debug)]
pub struct Cache {
    root: PathBuf,
    max_bytes: Option<u64>,
}

/// A cached version, for eviction.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The model.
    pub model: String,
    /// The version.
    pub version: u64,
    /// Bytes its files hold.
    pub bytes: u64,
    /// When it was last fetched or found cached.
    pub used: SystemTime,
}

fn io(what: &Path, e: std::io::Error) -> FetchError {
    FetchError::Io(format!("the cache at {}: {e}", what.display()))
}

impl Cache {
    /// The cache at `root`, holding at most `max_bytes` of version files.
    /// Fetches that were cut short (the process stopped) are removed.
    pub fn open(root: PathBuf, max_bytes: Option<u64>) -> Result<Cache, FetchError> {
        std::fs::create_dir_all(&root).map_err(|e| io(&root, e))?;
        let cache = Cache { root, max_bytes };
        for model in cache.model_dirs() {
            for entry in std::fs::read_dir(&model).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') && (name.ends_with(".partial") || name.ends_with(".old")) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        Ok(cache)
    }

    fn model_dirs(&self) -> Vec<PathBuf> {
        let entries = std::fs::read_dir(&self.root).into_iter().flatten().flatten();
        entries
            .filter(|e| e.path().is_dir() && !e.file_name().to_string_lossy().starts_with('.'))
            .map(|e| e.path())
            .collect()
    }

    /// Where a version's files are.
    pub fn dir(&self, model: &str, version: u64) -> PathBuf {
        self.root.join(model).join(version.to_string())
    }

    fn seal_path(&self, model: &str, version: u64) -> PathBuf {
        self.root.join(model).join(format!("{version}.seal"))
    }

    fn tag_path(&self, model: &str, version: u64) -> PathBuf {
        self.root.join(model).join(format!("{version}.tag"))
    }

    /// The version, if it is cached whole with the MANIFEST the store tags
    /// `tag` (any tag, when `None`: the store cannot be asked). Marks it
    /// used.
    pub fn lookup(&self, model: &str, version: u64, tag: Option<&str>) -> Option<Fetched> {
        let dir = self.dir(model, version);
        let seal = Seal::read(&self.seal_path(model, version))?;
        let cached_tag = std::fs::read_to_string(self.tag_path(model, version)).ok()?;
        if tag.is_some_and(|t| t != cached_tag) {
            return None;
        }
        let text = std::fs::read_to_string(dir.join(MANIFEST)).ok()?;
        let listed = manifest::parse(&text).ok()?;
        let sealed: BTreeMap<&str, &str> =
            seal.entries().iter().map(|e| (e.path.as_str(), e.sha256.as_str())).collect();
        if !listed.entries.iter().all(|e| sealed.get(e.path.as_str()) == Some(&e.sha256.as_str())) {
            return None;
        }
        let _ = File::options()
            .append(true)
            .open(self.seal_path(model, version))
            .and_then(|f| f.set_modified(SystemTime::now()));
        Some(Fetched { dir, seal: Some(seal) })
    }

    /// A fresh directory to fetch a version into.
    pub fn partial(&self, model: &str, version: u64) -> Result<PathBuf, FetchError> {
        let dir = self.root.join(model).join(format!(".{version}.partial"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        Ok(dir)
    }

    /// Puts a fetched version in place of any cached one: its files, then
    /// its tag, then its seal, which makes it cached. The files of a version
    /// replaced are unlinked; whoever has them open or mapped keeps reading
    /// them.
    pub fn commit(
        &self,
        model: &str,
        version: u64,
        partial: &Path,
        seal: Seal,
        tag: &str,
    ) -> Result<Fetched, FetchError> {
        let (dir, seal_path) = (self.dir(model, version), self.seal_path(model, version));
        let _ = std::fs::remove_file(&seal_path);
        if dir.exists() {
            let old = self.root.join(model).join(format!(".{version}.old"));
            let _ = std::fs::remove_dir_all(&old);
            std::fs::rename(&dir, &old).map_err(|e| io(&dir, e))?;
            let _ = std::fs::remove_dir_all(&old);
        }
        std::fs::rename(partial, &dir).map_err(|e| io(&dir, e))?;
        let tag_path = self.tag_path(model, version);
        std::fs::write(&tag_path, tag).map_err(|e| io(&tag_path, e))?;
        seal.write(&seal_path).map_err(|e| io(&seal_path, e))?;
        Ok(Fetched { dir, seal: Some(seal) })
    }

    /// Keeps the model's `model.toml`, for a start with the store down.
    pub fn keep_spec(&self, model: &str, text: &str) {
        let dir = self.root.join(model);
        let same = std::fs::read_to_string(dir.join("model.toml")).is_ok_and(|t| t == text);
        if !same && std::fs::create_dir_all(&dir).is_ok() {
            let tmp = dir.join(".model.toml.tmp");
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(&tmp, dir.join("model.toml"));
            }
        }
    }

    /// The `model.toml` kept for a model.
    pub fn spec(&self, model: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(model).join("model.toml")).ok()
    }

    /// Every version cached, with what it holds and when it was last used.
    pub fn entries(&self) -> Vec<Entry> {
        let mut out = Vec::new();
        for dir in self.model_dirs() {
            let model = dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(version) = name.strip_suffix(".seal").and_then(|v| v.parse::<u64>().ok()) else {
                    continue;
                };
                let Some(seal) = Seal::read(&entry.path()) else { continue };
                let bytes = seal.entries().iter().map(|e| e.size()).sum();
                let used = entry.metadata().and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
                out.push(Entry { model: model.clone(), version, bytes, used });
            }
        }
        out
    }

    /// Removes a cached version.
    pub fn evict(&self, model: &str, version: u64) {
        let _ = std::fs::remove_file(self.seal_path(model, version));
        let _ = std::fs::remove_file(self.tag_path(model, version));
        let _ = std::fs::remove_dir_all(self.dir(model, version));
    }

    /// Makes room for `needed` more bytes under the bound, evicting the
    /// least recently used versions that `serving` does not claim (and never
    /// `model`'s `version` itself). Refuses when the versions that serve
    /// leave no room.
    pub fn make_room(
        &self,
        model: &str,
        version: u64,
        needed: u64,
        serving: &dyn Fn(&str, u64) -> bool,
    ) -> Result<Vec<(String, u64)>, FetchError> {
        let Some(max) = self.max_bytes else { return Ok(Vec::new()) };
        let mut entries = self.entries();
        entries.retain(|e| !(e.model == model && e.version == version));
        let mut held: u64 = entries.iter().map(|e| e.bytes).sum();
        entries.retain(|e| !serving(&e.model, e.version));
        entries.sort_by_key(|e| e.used);
        let mut evicted = Vec::new();
        for entry in entries {
            if held + needed <= max {
                break;
            }
            self.evict(&entry.model, entry.version);
            held -= entry.bytes;
            evicted.push((entry.model, entry.version));
        }
        if held + needed > max {
            return Err(FetchError::Store {
                kind: "cache_full",
                message: format!(
                    "version {version} of model '{model}' needs {needed} bytes in the cache at {}, which holds {held} \
                     bytes of versions that serve, against a bound of {max} bytes (--cache-max-bytes)",
                    self.root.display()
                ),
            });
        }
        Ok(evicted)
    }
}
