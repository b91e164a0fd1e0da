//! Downloading a version into the cache in one pass: each file is read in
//! ranges, several at once, and every byte is hashed and written once, in
//! order, as it arrives. A range whose connection drops is asked for again
//! from the first byte not yet received.
//!
//! Every read of an object, its resumes included, asks for the content the
//! listing saw (`If-Match` with the listing's entity tag), and an answer
//! carrying another tag is refused too, for stores that ignore `If-Match`:
//! an object replaced during the download ends it with `store_changed`
//! instead of a file spliced from two contents.
//!
//! The async runtime only moves bytes: creating, writing and hashing files
//! run on its blocking threads, one writer per file fed through a channel,
//! so a slow disk or a large hash never holds a runtime worker.

use std::fs::File;
use std::ops::Range;
use std::path::Path as FsPath;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use baton_core::files::digest::{Format, Hasher};
use baton_core::files::manifest::{self, MANIFEST, Manifest};
use baton_core::files::seal::Seal;
use baton_core::files::source::FetchError;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore};

use crate::errors::{changed_since_listed, fetch_error};
use crate::listing::{VersionListing, same_etag};

/// How a download reads.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Bytes per ranged request.
    pub range_bytes: u64,
    /// Ranged requests in flight at once, per file.
    pub parallel: usize,
    /// Attempts at one range, counting the first, before the fetch fails.
    pub attempts: u32,
}

/// Counters a download adds to.
#[derive(Debug, Default)]
pub struct Counters {
    /// Bytes received and written.
    pub bytes: AtomicU64,
    /// Ranges asked for again after a failure.
    pub resumes: AtomicU64,
    /// What the download has to say, for a thread that may log.
    pub(crate) notes: crate::notes::Notes,
}

/// Where a version is, and what it is called in errors.
pub struct Remote<'a> {
    /// The store.
    pub store: &'a dyn ObjectStore,
    /// The version's prefix in the store.
    pub prefix: Path,
    /// `s3://bucket/prefix/model/version`, for messages.
    pub url: String,
}

fn io(path: &FsPath, e: std::io::Error) -> FetchError {
    FetchError::Io(format!("writing {} in the cache: {e}", path.display()))
}

/// Runs `work` on the runtime's blocking threads.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// Refuses an answer whose entity tag is not the one listed.
fn check_etag(url: &str, listed: Option<&str>, answered: Option<&str>) -> Result<(), FetchError> {
    match (listed, answered) {
        (Some(listed), Some(now)) if !same_etag(listed, now) => Err(changed_since_listed(url, listed, now)),
        _ => Ok(()),
    }
}

/// The `If-Match` a read of an object listed with `etag` sends: the tag
/// itself when it is strong. A weak tag (`W/"…"`) never matches under
/// `If-Match`'s strong comparison, so every read would get 412 and be
/// retried as a changed object; such a read sends none, and the answer's
/// tag is compared with the listed one instead (`check_etag`).
fn if_match(etag: Option<&str>) -> Option<String> {
    etag.filter(|tag| !tag.trim_start().starts_with("W/")).map(str::to_owned)
}

/// Downloads the version `listing` describes into `into`: its MANIFEST,
/// then every file the MANIFEST lists, each hashed as it is written. A file
/// the store holds at another size than the MANIFEST says is not
/// downloaded; a file it does not hold is left for the verify stage to
/// name. Every object is read as listed (see the module's docs). Returns
/// the seal of what was written.
pub async fn version(
    remote: &Remote<'_>,
    listing: &VersionListing,
    into: &FsPath,
    plan: Plan,
    counters: &Counters,
) -> Result<(Manifest, Seal), FetchError> {
    let manifest_path = remote.prefix.child(MANIFEST);
    let url = format!("{}/{MANIFEST}", remote.url);
    let doing = format!("reading {url}");
    let etag = listing.etags.get(MANIFEST).cloned();
    let options = GetOptions { if_match: if_match(etag.as_deref()), ..GetOptions::default() };
    let got = remote.store.get_opts(&manifest_path, options).await.map_err(|e| fetch_error(&doing, &e))?;
    check_etag(&url, etag.as_deref(), got.meta.e_tag.as_deref())?;
    let text = got.bytes().await.map_err(|e| fetch_error(&doing, &e))?;
    let local = into.join(MANIFEST);
    let written = text.clone();
    blocking({
        let local = local.clone();
        move || std::fs::write(&local, &written)
    })
    .await
    .map_err(|e| io(&local, e))?;
    let parsed = manifest::parse(&String::from_utf8_lossy(&text))
        .map_err(|e| FetchError::Io(format!("{}/{MANIFEST}: {e}", remote.url)))?;
    for entry in &parsed.entries {
        match listing.sizes.get(&entry.path) {
            Some(&size) if size != entry.size => {
                return Err(FetchError::Store {
                    kind: "size_mismatch",
                    message: format!(
                        "{}/{} has {size} bytes in the store, its MANIFEST says {}; nothing was downloaded",
                        remote.url, entry.path, entry.size
                    ),
                });
            }
            _ => {}
        }
    }
    let mut seal = Seal::new();
    for entry in &parsed.entries {
        if !listing.sizes.contains_key(&entry.path) {
            continue;
        }
        let target = into.join(&entry.path);
        let file = blocking({
            let target = target.clone();
            move || {
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                File::create(&target)
            }
        })
        .await
        .map_err(|e| io(&target, e))?;
        let object = entry.path.split('/').fold(remote.prefix.clone(), |p, part| p.child(part));
        let read = Read {
            object: &object,
            url: format!("{}/{}", remote.url, entry.path),
            size: entry.size,
            etag: listing.etags.get(&entry.path).map(String::as_str),
        };
        let into_file = Into { file, format: parsed.format };
        let (digest, file) = file_bytes(remote.store, read, into_file, plan, counters).await.map_err(|e| match e {
            Failure::Store(e) => e,
            Failure::Write(e) => io(&target, e),
        })?;
        let path = entry.path.clone();
        seal = blocking(move || seal.record(&path, &file, &digest).map(|()| seal)).await.map_err(|e| io(&target, e))?;
    }
    Ok((parsed, seal))
}

/// Range buffers, reused for the whole download of a file rather than
/// allocated for each range: each is large enough that the allocator would
/// map it alone and unmap it when freed, and an unmap makes every CPU that
/// runs the process (serving threads included) drop its address
/// translations.
#[derive(Default)]
struct Pool(std::sync::Mutex<Vec<Vec<u8>>>);

impl Pool {
    fn take(&self, len: usize) -> Vec<u8> {
        let reused = self.0.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut buffer = reused.unwrap_or_default();
        buffer.clear();
        buffer.reserve(len);
        buffer
    }

    fn give(&self, buffer: Vec<u8>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(buffer);
    }
}

enum Failure {
    Store(FetchError),
    Write(std::io::Error),
}

/// Where a file's bytes go: the file, and how the MANIFEST digests them.
struct Into {
    file: File,
    format: Format,
}

/// What is read: the object, its URL for messages, its size, and the
/// entity tag it was listed with.
struct Read<'a> {
    object: &'a Path,
    url: String,
    size: u64,
    etag: Option<&'a str>,
}

/// Reads the object in ranges and hands them, in order, to a writer on a
/// blocking thread that hashes them and writes them to the file; returns
/// their digest, of the MANIFEST's format, and the file.
async fn file_bytes(
    store: &dyn ObjectStore,
    read: Read<'_>,
    into: Into,
    plan: Plan,
    counters: &Counters,
) -> Result<(String, File), Failure> {
    let Into { mut file, format } = into;
    let step = plan.range_bytes.max(1);
    let ranges = (0..read.size.div_ceil(step)).map(|i| i * step..((i + 1) * step).min(read.size));
    let pool = Arc::new(Pool::default());
    // One range waits for the writer at most: memory stays at `parallel`
    // ranges in flight plus two.
    let (chunks_to_write, mut to_write) = tokio::sync::mpsc::channel::<Vec<u8>>(1);
    let written = Arc::clone(&pool);
    let writer = tokio::task::spawn_blocking(move || -> std::io::Result<(String, File)> {
        let mut hasher = Hasher::new(format);
        while let Some(chunk) = to_write.blocking_recv() {
            hasher.update(&chunk);
            // In pieces: one 8 MiB write would hold a CPU in the kernel for milliseconds.
            baton_core::files::short_reads::write_all(&mut file, &chunk)?;
            written.give(chunk);
        }
        Ok((hasher.finish(), file))
    });
    let mut chunks = futures_util::stream::iter(ranges)
        .map(|range| range_bytes(store, &read, range, plan.attempts, counters, &pool))
        .buffered(plan.parallel.max(1));
    let mut failed = None;
    while let Some(chunk) = chunks.next().await {
        match chunk {
            // A writer that stopped says why when joined.
            Ok(chunk) => {
                if chunks_to_write.send(chunk).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    drop((chunks, chunks_to_write));
    let written = writer.await.unwrap_or_else(|e| Err(std::io::Error::other(e)));
    match (failed, written) {
        (Some(e), _) => Err(Failure::Store(e)),
        (None, Ok(done)) => Ok(done),
        (None, Err(e)) => Err(Failure::Write(e)),
    }
}

/// One range, resumed at the first byte not received when a request or its
/// body fails, up to `attempts` times with a growing pause. Every request
/// asks for the content listed; another is `store_changed`, never resumed.
async fn range_bytes(
    store: &dyn ObjectStore,
    read: &Read<'_>,
    range: Range<u64>,
    attempts: u32,
    counters: &Counters,
    pool: &Pool,
) -> Result<Vec<u8>, FetchError> {
    let url = read.url.as_str();
    let len = usize::try_from(range.end - range.start).unwrap_or(usize::MAX);
    let mut bytes = pool.take(len);
    let mut tried = 0;
    loop {
        let start = range.start + bytes.len() as u64;
        let options = GetOptions {
            range: Some(GetRange::Bounded(start..range.end)),
            if_match: if_match(read.etag),
            ..GetOptions::default()
        };
        let doing = format!("reading bytes {start}..{} of {url}", range.end);
        let failure = match store.get_opts(read.object, options).await {
            Ok(got) => {
                check_etag(url, read.etag, got.meta.e_tag.as_deref())?;
                let mut body = got.into_stream();
                let mut failed = None;
                while let Some(piece) = body.next().await {
                    match piece {
                        Ok(piece) => {
                            let room = len - bytes.len();
                            bytes.extend_from_slice(&piece[..piece.len().min(room)]);
                            counters.bytes.fetch_add(piece.len().min(room) as u64, Ordering::Relaxed);
                        }
                        Err(e) => {
                            failed = Some(fetch_error(&doing, &e));
                            break;
                        }
                    }
                }
                match failed {
                    None if bytes.len() == len => return Ok(bytes),
                    None => FetchError::Store {
                        kind: "store_error",
                        message: format!("{doing}: the store ended the body after {} bytes", bytes.len()),
                    },
                    Some(e) => e,
                }
            }
            Err(e) => fetch_error(&doing, &e),
        };
        tried += 1;
        let permanent = matches!(failure.kind(), "store_denied" | "store_not_found" | "store_changed");
        if permanent || tried >= attempts {
            return Err(failure);
        }
        counters.resumes.fetch_add(1, Ordering::Relaxed);
        let (object, error) = (url.to_owned(), failure.to_string());
        counters.notes.push(crate::notes::Note::Resumed { object, at: start, attempt: tried, error });
        tokio::time::sleep(Duration::from_millis(250 << tried.min(5))).await;
    }
}

#[cfg(test)]
mod if_match_tests {
    use super::if_match;

    #[test]
    fn a_strong_tag_is_sent_and_a_weak_one_is_not() {
        assert_eq!(if_match(Some("\"abc\"")).as_deref(), Some("\"abc\""));
        assert_eq!(if_match(Some("abc")).as_deref(), Some("abc"));
        assert_eq!(if_match(Some("W/\"abc\"")), None);
        assert_eq!(if_match(None), None);
    }
}
