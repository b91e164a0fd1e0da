//! A large model's weights laid out for ONNX Runtime to map, not copy.
//!
//! Given a model file that keeps its weights inline, ONNX Runtime copies
//! them while it builds each session, and packs each matrix into a buffer
//! of its own for faster products: about four times the weights' size of
//! memory touched for the first time, per session, which is most of what a
//! load costs (docs/benchmarks-notebook.md §3, "Weights mapped, not
//! copied").
//!
//! When a model's weights are external data at page-aligned offsets, ONNX
//! Runtime maps the data file instead and copies nothing but what it packs.
//! So before the sessions of a large self-contained model are created, the
//! model is staged: [`proto::externalize`] rewrites it to refer to a data
//! file, the payloads are copied there by the kernel (one copy, into the page
//! cache), and the sessions are created from the rewritten model. The staged
//! directory is deleted as soon as the sessions exist: ONNX Runtime's
//! mappings keep the data alive for as long as a session uses it, and no file
//! is left behind (a server killed while staging leaves its directory; the
//! next start removes those of processes no longer running, once they are
//! an hour old). Staging is skipped (and ONNX Runtime reads the file
//! itself) for a model that already has external data, one baton cannot
//! parse, and when it fails, for example for lack of space in the temporary
//! directory, which is logged.

use std::collections::HashSet;
use std::fs::{DirBuilder, File};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::proto::{self, InitData};

/// Payloads smaller than this stay inline: mapping works in whole pages.
pub(crate) const MIN_MOVED: usize = 4096;

/// The offset alignment ONNX Runtime needs to map external data: a page.
const ALIGN: u64 = 4096;

/// The data file's name inside the staged directory.
const DATA_FILE: &str = "weights.bin";

/// What a staged directory's name begins with, followed by the pid.
const PREFIX: &str = "baton-staged-";

/// Distinguishes the staged directories of one process.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A model staged in a directory of its own, deleted when this is dropped.
#[derive(Debug)]
pub(crate) struct Staged {
    dir: PathBuf,
    model: PathBuf,
}

impl Staged {
    /// The staged model file, to create sessions from.
    pub(crate) fn model(&self) -> &Path {
        &self.model
    }

    /// Stages the model at `path` under `parent`. `Ok(None)` when there is
    /// nothing to stage: the model has external data or no payload of
    /// [`MIN_MOVED`] bytes. Errors say what failed; the caller then lets
    /// ONNX Runtime read the file.
    pub(crate) fn create(path: &Path, parent: &Path) -> Result<Option<Staged>, String> {
        let file = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
        let mut skeleton = proto::read_skeleton(&file, path).map_err(|e| e.to_string())?;
        let model = proto::parse(&skeleton).map_err(|e| e.to_string())?;
        if model.initializers.iter().any(|i| matches!(i.data, InitData::External { .. })) {
            return Ok(None);
        }
        let rewrite = |skeleton: &[u8]| proto::externalize(skeleton, DATA_FILE, MIN_MOVED, ALIGN);
        let Some(plan) = rewrite(&skeleton).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        // The skeleton lacks every payload, and the rewrite keeps the ones it
        // does not move as they are: read those in, then rewrite again.
        let moved: HashSet<usize> = plan.moves.iter().map(|m| m.from.start).collect();
        for init in &model.initializers {
            if let InitData::Raw(range) = &init.data
                && !moved.contains(&range.start)
            {
                let at = range.start as u64;
                baton_core::short_reads::read_exact_at(&file, &mut skeleton[range.clone()], at)
                    .map_err(|e| format!("reading {} from {}: {e}", init.name, path.display()))?;
            }
        }
        let layout =
            rewrite(&skeleton).map_err(|e| e.to_string())?.ok_or("the rewrite moved nothing the second time")?;
        drop(skeleton);
        let name = format!("{PREFIX}{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let dir = parent.join(name);
        DirBuilder::new().mode(0o700).create(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        // From here on, dropping `staged` removes the directory.
        let staged = Staged { model: dir.join(crate::MODEL_FILE), dir };
        let fail = |what: &str, e: std::io::Error| format!("{what} in {}: {e}", staged.dir.display());
        std::fs::write(&staged.model, &layout.model).map_err(|e| fail("writing the model", e))?;
        let mut data = File::create(staged.dir.join(DATA_FILE)).map_err(|e| fail("creating the data file", e))?;
        let mut source = &file;
        for moved in &layout.moves {
            let len = (moved.from.end - moved.from.start) as u64;
            source.seek(SeekFrom::Start(moved.from.start as u64)).map_err(|e| fail("seeking the model file", e))?;
            data.seek(SeekFrom::Start(moved.to)).map_err(|e| fail("seeking the data file", e))?;
            // File to file: the kernel copies, with no buffer of ours.
            let copied = std::io::copy(&mut source.take(len), &mut data).map_err(|e| fail("copying weights", e))?;
            if copied != len {
                return Err(format!("{} ended inside a weight: copied {copied} of {len} bytes", path.display()));
            }
        }
        data.set_len(layout.data_len).map_err(|e| fail("sizing the data file", e))?;
        Ok(Some(staged))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            // Dropped on a lowered loading thread: logged through the registry's agent.
            let dir = self.dir.display().to_string();
            baton_core::agent::at_serving_priority(move || {
                tracing::warn!(%dir, error = %e, "A staged model directory could not be removed.");
            });
        }
    }
}

/// A staged directory is left alone for this long after it was last
/// changed, even when its process seems gone: a server in another pid
/// namespace sharing the directory may be loading from it.
const STALE_AFTER: Duration = Duration::from_secs(3600);

/// Removes staged directories under `parent` left by processes that no
/// longer run (a server killed while loading) and unchanged for
/// [`STALE_AFTER`]. Errors are ignored: a directory that cannot be listed or
/// removed is left for the next start.
pub(crate) fn remove_stale(parent: &Path) {
    remove_stale_after(parent, STALE_AFTER);
}

fn remove_stale_after(parent: &Path, age: Duration) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        let alive = pid.parse::<u32>().is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        let old = entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|e| e >= age));
        if !alive && old && std::fs::remove_dir_all(entry.path()).is_ok() {
            tracing::info!(dir = %entry.path().display(), "A staged model directory left by a stopped server was removed.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlp::{Mlp, write_model};
    use crate::proto::RawData;

    fn model_file(dir: &Path, sizes: &[usize], external: Option<&str>) -> PathBuf {
        write_model(dir, &Mlp::new(sizes, 7), external)
    }

    #[test]
    fn large_weights_move_to_aligned_places_in_the_data_file_and_keep_their_bytes() {
        let (src, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // fc0.weight is 64 × 48 floats (12 KiB): moved; fc0.bias (192 B) stays.
        let path = model_file(src.path(), &[64, 48, 1], None);
        let original = std::fs::read(&path).unwrap();
        let staged = Staged::create(&path, tmp.path()).unwrap().expect("a 12 KiB weight is staged");
        let parsed = proto::parse(&original).unwrap();
        let rewritten = proto::parse(&std::fs::read(staged.model()).unwrap()).unwrap();
        assert_eq!(rewritten.graph_inputs, parsed.graph_inputs);
        assert_eq!(rewritten.graph_outputs, parsed.graph_outputs);
        let staged_bytes = std::fs::read(staged.model()).unwrap();
        let mut moved = 0;
        let (mut scratch, mut no_scratch) = (Vec::new(), Vec::new());
        for (before, after) in parsed.initializers.iter().zip(&rewritten.initializers) {
            assert_eq!((&before.name, before.data_type, &before.dims), (&after.name, after.data_type, &after.dims));
            let InitData::Raw(range) = &before.data else { panic!("the encoder writes raw_data") };
            match &after.data {
                InitData::External { location, offset, .. } => {
                    assert!(range.len() >= MIN_MOVED, "{} moved", before.name);
                    assert_eq!((location.as_str(), offset % ALIGN), (DATA_FILE, 0));
                    moved += 1;
                }
                InitData::Raw(_) => assert!(range.len() < MIN_MOVED, "{} stayed inline", before.name),
                InitData::Inline(_) => panic!("{} changed form", before.name),
            }
            // Every weight, moved or inline, reads back as it was.
            let was = proto::initializer_bytes(before, RawData::InBytes(&original), src.path(), &mut no_scratch);
            let is = proto::initializer_bytes(after, RawData::InBytes(&staged_bytes), &staged.dir, &mut scratch);
            assert_eq!(is.unwrap(), was.unwrap(), "{}'s bytes", before.name);
        }
        // fc0's weight (12 KiB) moved; its bias (192 bytes) and fc1's stayed.
        assert_eq!(moved, 1);
        let dir = staged.dir.clone();
        drop(staged);
        assert!(!dir.exists(), "the staged directory outlives its model");
    }

    #[test]
    fn models_with_external_data_or_only_small_weights_are_not_staged() {
        let tmp = tempfile::tempdir().unwrap();
        for (sizes, external) in [(&[4usize, 2][..], None), (&[64, 48, 1][..], Some("w.bin"))] {
            let src = tempfile::tempdir().unwrap();
            let path = model_file(src.path(), sizes, external);
            assert!(Staged::create(&path, tmp.path()).unwrap().is_none(), "{sizes:?} {external:?}");
        }
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "a directory was left behind");
    }

    #[test]
    fn a_failed_stage_says_why_and_leaves_nothing() {
        let src = tempfile::tempdir().unwrap();
        let path = model_file(src.path(), &[64, 48, 1], None);
        let missing = src.path().join("no-such-dir");
        let e = Staged::create(&path, &missing).unwrap_err();
        assert!(e.contains("no-such-dir"), "{e}");
        std::fs::write(&path, b"\xff\xff not a model").unwrap();
        let tmp = tempfile::tempdir().unwrap();
        assert!(Staged::create(&path, tmp.path()).is_err());
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn old_directories_of_stopped_servers_are_removed_and_others_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let mine = tmp.path().join(format!("{PREFIX}{}-0", std::process::id()));
        // Pid numbers stop well below this.
        let stale = tmp.path().join(format!("{PREFIX}{}-3", u32::MAX - 1));
        let other = tmp.path().join("unrelated");
        for dir in [&mine, &stale, &other] {
            std::fs::create_dir(dir).unwrap();
        }
        // Too recent: another server may be loading from it.
        remove_stale(tmp.path());
        assert!(mine.exists() && other.exists() && stale.exists());
        remove_stale_after(tmp.path(), Duration::ZERO);
        assert!(mine.exists() && other.exists());
        assert!(!stale.exists());
    }
}
