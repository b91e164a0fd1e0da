//! Downloading a version into the cache in one pass: each file is read in
//! ranges, several at once, and every byte is hashed and written once, in
//! order, as it arrives. A range whose connection drops is asked for again
//! from the first byte not yet received.

use std::fs::File;
use std::ops::Range;
use std::path::Path as FsPath;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use baton_core::digest::{Format, Hasher};
use baton_core::manifest::{self, MANIFEST, Manifest};
use baton_core::seal::Seal;
use baton_core::source::FetchError;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore};

use crate::errors::fetch_error;
use crate::listing::VersionListing;

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

/// Downloads the version `listing` describes into `into`: its MANIFEST,
/// then every file the MANIFEST lists, each hashed as it is written. A file
/// the store holds at another size than the MANIFEST says is not
/// downloaded; a file it does not hold is left for the verify stage to
/// name. Returns the seal of what was written.
pub async fn version(
    remote: &Remote<'_>,
    listing: &VersionListing,
    into: &FsPath,
    plan: Plan,
    counters: &Counters,
) -> Result<(Manifest, Seal), FetchError> {
    let manifest_path = remote.prefix.child(MANIFEST);
    let doing = format!("reading {}/{MANIFEST}", remote.url);
    let got = remote.store.get(&manifest_path).await.map_err(|e| fetch_error(&doing, &e))?;
    let text = got.bytes().await.map_err(|e| fetch_error(&doing, &e))?;
    let local = into.join(MANIFEST);
    std::fs::write(&local, &text).map_err(|e| io(&local, e))?;
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
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        let mut file = File::create(&target).map_err(|e| io(&target, e))?;
        let object = entry.path.split('/').fold(remote.prefix.clone(), |p, part| p.child(part));
        let url = format!("{}/{}", remote.url, entry.path);
        let into_file = Into { file: &mut file, format: parsed.format };
        let digest = file_bytes(remote.store, &object, &url, entry.size, into_file, plan, counters).await.map_err(
            |e| match e {
                Failure::Store(e) => e,
                Failure::Write(e) => io(&target, e),
            },
        )?;
        seal.record(&entry.path, &file, &digest).map_err(|e| io(&target, e))?;
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
struct Into<'a> {
    file: &'a mut File,
    format: Format,
}

/// Reads `size` bytes of `object` in ranges, writes them to the file in
/// order and returns their digest, of the MANIFEST's format.
async fn file_bytes(
    store: &dyn ObjectStore,
    object: &Path,
    url: &str,
    size: u64,
    into: Into<'_>,
    plan: Plan,
    counters: &Counters,
) -> Result<String, Failure> {
    let Into { file, format } = into;
    let step = plan.range_bytes.max(1);
    let ranges = (0..size.div_ceil(step)).map(|i| i * step..((i + 1) * step).min(size));
    let pool = Pool::default();
    let mut chunks = futures_util::stream::iter(ranges)
        .map(|range| range_bytes(store, object, url, range, plan.attempts, counters, &pool))
        .buffered(plan.parallel.max(1));
    let mut hasher = Hasher::new(format);
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(Failure::Store)?;
        hasher.update(&chunk);
        // In pieces: one 8 MiB write would hold a CPU in the kernel for milliseconds.
        baton_core::short_reads::write_all(file, &chunk).map_err(Failure::Write)?;
        pool.give(chunk);
    }
    Ok(hasher.finish())
}

/// One range, resumed at the first byte not received when a request or its
/// body fails, up to `attempts` times with a growing pause.
async fn range_bytes(
    store: &dyn ObjectStore,
    object: &Path,
    url: &str,
    range: Range<u64>,
    attempts: u32,
    counters: &Counters,
    pool: &Pool,
) -> Result<Vec<u8>, FetchError> {
    let len = usize::try_from(range.end - range.start).unwrap_or(usize::MAX);
    let mut bytes = pool.take(len);
    let mut tried = 0;
    loop {
        let start = range.start + bytes.len() as u64;
        let options = GetOptions { range: Some(GetRange::Bounded(start..range.end)), ..GetOptions::default() };
        let doing = format!("reading bytes {start}..{} of {url}", range.end);
        let failure = match store.get_opts(object, options).await {
            Ok(got) => {
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
        let permanent = matches!(failure.kind(), "store_denied" | "store_not_found");
        if permanent || tried >= attempts {
            return Err(failure);
        }
        counters.resumes.fetch_add(1, Ordering::Relaxed);
        let (object, error) = (url.to_owned(), failure.to_string());
        counters.notes.push(crate::notes::Note::Resumed { object, at: start, attempt: tried, error });
        tokio::time::sleep(Duration::from_millis(250 << tried.min(5))).await;
    }
}
