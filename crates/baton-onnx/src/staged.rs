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
//! an hour old). For a large self-contained model, staging is skipped when
//! `stage_weights` is off and when it fails, for example for lack of space
//! in the temporary directory, which is logged; ONNX Runtime then reads the
//! verified model file itself.
//!
//! A model that already has external data is always staged, its external
//! payloads copied from the files the verify stage hashed (and its large
//! inline ones too, unless `stage_weights` is off): ONNX Runtime finds
//! external files by name, relative to the model, and only a directory
//! baton wrote makes sure the names lead to the verified files. If that
//! staging fails, the load fails.

use std::collections::HashSet;
use std::fs::{DirBuilder, File};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use baton_core::files::verified::VerifiedFile;

use crate::proto::{self, InitData, Origin};
use crate::shared::Placed;

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
    /// The data file, open for reading, and its length.
    data: Option<(File, u64)>,
    /// The tensors moved to the data file, where each now is.
    placed: Vec<Placed>,
}

/// What [`Staged::create`] stages.
pub(crate) struct Input<'a> {
    /// The model file's bytes, whole or as a skeleton.
    pub(crate) bytes: ModelBytes<'a>,
    /// The model file, to copy and read payloads from.
    pub(crate) file: &'a File,
    /// Its name, for messages.
    pub(crate) name: &'a Path,
    /// The external data files, by location as the model writes them.
    pub(crate) external: &'a dyn Fn(&str) -> Option<&'a File>,
    /// Whether inline payloads of [`MIN_MOVED`] bytes or more move to the
    /// data file too (`stage_weights`).
    pub(crate) move_inline: bool,
}

/// The model file's bytes.
pub(crate) enum ModelBytes<'a> {
    /// All of them.
    Whole(&'a [u8]),
    /// Without its initializers' payloads ([`proto::read_skeleton`]).
    Skeleton(Vec<u8>),
}

impl Staged {
    /// The staged model file, to create sessions from.
    pub(crate) fn model(&self) -> &Path {
        &self.model
    }

    /// The data file and its length, once written.
    pub(crate) fn data(&self) -> Option<&(File, u64)> {
        self.data.as_ref()
    }

    /// The initializers whose payloads are in the data file.
    pub(crate) fn placed(&self) -> &[Placed] {
        &self.placed
    }

    /// Stages the model under `parent`. `Ok(None)` when there is nothing to
    /// move: no external data, and no inline payload of [`MIN_MOVED`] bytes
    /// that may move. Errors say what failed.
    pub(crate) fn create(input: Input<'_>, parent: &Path) -> Result<Option<Staged>, String> {
        let Input { bytes, file, name, external, move_inline } = input;
        let bytes_now: &[u8] = match &bytes {
            ModelBytes::Whole(whole) => whole,
            ModelBytes::Skeleton(skeleton) => skeleton,
        };
        let model = proto::parse(bytes_now).map_err(|e| e.to_string())?;
        let has_external = model.initializers.iter().any(|i| matches!(i.data, InitData::External { .. }));
        let lengths = |location: &str| external(location).and_then(|f| f.metadata().ok()).map(|m| m.len());
        let lengths: proto::FileLength<'_> = &lengths;
        let min_len = if move_inline { MIN_MOVED } else { usize::MAX };
        let rewrite =
            |bytes: &[u8]| proto::externalize(bytes, DATA_FILE, min_len, ALIGN, has_external.then_some(lengths));
        let Some(plan) = rewrite(bytes_now).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let layout = match bytes {
            ModelBytes::Whole(_) => plan,
            ModelBytes::Skeleton(mut skeleton) => {
                // The skeleton lacks every payload, and the rewrite keeps the
                // ones it does not move as they are: read those in, then
                // rewrite again.
                let moved: HashSet<usize> = plan
                    .moves
                    .iter()
                    .filter_map(|m| if let Origin::Inline(range) = &m.from { Some(range.start) } else { None })
                    .collect();
                for init in &model.initializers {
                    if let InitData::Raw(range) = &init.data
                        && !moved.contains(&range.start)
                    {
                        let at = range.start as u64;
                        baton_core::files::short_reads::read_exact_at(file, &mut skeleton[range.clone()], at)
                            .map_err(|e| format!("reading {} from {}: {e}", init.name, name.display()))?;
                    }
                }
                rewrite(&skeleton).map_err(|e| e.to_string())?.ok_or("the rewrite moved nothing the second time")?
            }
        };
        let dir_name = format!("{PREFIX}{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let dir = parent.join(dir_name);
        DirBuilder::new().mode(0o700).create(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        // From here on, dropping `staged` removes the directory.
        let placed = placed_in(&layout.model, DATA_FILE).map_err(|e| e.to_string())?;
        let mut staged = Staged { model: dir.join(crate::MODEL_FILE), dir, data: None, placed };
        let fail = |what: &str, e: std::io::Error| format!("{what} in {}: {e}", staged.dir.display());
        std::fs::write(&staged.model, &layout.model).map_err(|e| fail("writing the model", e))?;
        let mut data = File::create(staged.dir.join(DATA_FILE)).map_err(|e| fail("creating the data file", e))?;
        for moved in &layout.moves {
            let len = moved.len();
            let (mut source, at, what) = match &moved.from {
                Origin::Inline(range) => (file, range.start as u64, name.display().to_string()),
                Origin::External { location, offset, .. } => {
                    let source = external(location).ok_or_else(|| format!("no external data file '{location}'"))?;
                    (source, *offset, location.clone())
                }
            };
            source.seek(SeekFrom::Start(at)).map_err(|e| fail("seeking the model file", e))?;
            data.seek(SeekFrom::Start(moved.to)).map_err(|e| fail("seeking the data file", e))?;
            // File to file: the kernel copies, with no buffer of ours.
            let copied = std::io::copy(&mut source.take(len), &mut data).map_err(|e| fail("copying weights", e))?;
            if copied != len {
                return Err(format!("{what} ended inside a weight: copied {copied} of {len} bytes"));
            }
        }
        data.set_len(layout.data_len).map_err(|e| fail("sizing the data file", e))?;
        let reader = File::open(staged.dir.join(DATA_FILE)).map_err(|e| fail("opening the data file", e))?;
        staged.data = Some((reader, layout.data_len));
        Ok(Some(staged))
    }
}

/// A model whose external data stays where it is: in one file that baton
/// wrote and hashed on the way ([`VerifiedFile::sealed`]), in a directory
/// only baton writes (a store's cache, or the verify stage's copy of a
/// repository's file). Nothing more is copied: the tensors are mapped from
/// that file, and ONNX Runtime, given the model's bytes, is told to look
/// for external data in the file's directory. It reads none from there but
/// tensors of a type baton does not map (bfloat16, for one), which it reads
/// from that file by name.
#[derive(Debug)]
pub(crate) struct InPlace {
    /// The directory the model's data file is in, at its location.
    pub(crate) folder: PathBuf,
    /// The data file, as verified, and its length.
    pub(crate) data: (File, u64),
    /// The verified file, which keeps a directory of copies while the
    /// sessions are made.
    _verified: VerifiedFile,
    /// The initializers in the data file, where each is.
    pub(crate) placed: Vec<Placed>,
}

impl InPlace {
    /// `model`'s external data mapped where it is, when every external
    /// tensor is in `data` (at `location` in `version_dir`) at an offset
    /// aligned to its element size, which mapping needs; `Ok(None)`
    /// otherwise, and the model is staged by copying.
    pub(crate) fn new(
        model: &[u8],
        location: &str,
        data: &VerifiedFile,
        version_dir: &Path,
    ) -> Result<Option<InPlace>, String> {
        let parsed = proto::parse(model).map_err(|e| e.to_string())?;
        let mappable = parsed.initializers.iter().all(|init| match &init.data {
            InitData::External { location: at, offset, length: Some(_) } => {
                at == location && proto::elem_size(init.data_type).is_some_and(|size| offset % size as u64 == 0)
            }
            InitData::External { .. } => false,
            InitData::Raw(_) | InitData::Inline(_) => true,
        });
        if !mappable || proto::relative_location(location).is_none() {
            return Ok(None);
        }
        let placed = placed_in(model, location).map_err(|e| e.to_string())?;
        let reader = data.file().try_clone().map_err(|e| format!("opening {location}: {e}"))?;
        let folder = data.folder(version_dir).to_owned();
        Ok(Some(InPlace { folder, data: (reader, data.size()), placed, _verified: data.clone() }))
    }
}

/// The initializers of a model whose payloads are in its data file, at
/// `data_file`.
fn placed_in(model: &[u8], data_file: &str) -> Result<Vec<Placed>, proto::ProtoError> {
    let parsed = proto::parse(model)?;
    Ok(parsed
        .initializers
        .into_iter()
        .filter_map(|init| match init.data {
            InitData::External { location, offset, length: Some(length) } if location == data_file => Some(Placed {
                name: init.name,
                data_type: init.data_type,
                dims: init.dims,
                range: offset..offset + length,
            }),
            _ => None,
        })
        .collect())
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            // Dropped on a lowered loading thread: logged through the registry's agent.
            let dir = self.dir.display().to_string();
            baton_core::threads::agent::at_serving_priority(move || {
                tracing::warn!(%dir, error = %e, "A staged model directory could not be removed.");
            });
        }
    }
}

/// Removes staged directories under `parent` left by servers that no
/// longer run ([`baton_core::files::scratch::remove_stale`]).
pub(crate) fn remove_stale(parent: &Path) {
    baton_core::files::scratch::remove_stale(parent, PREFIX);
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::mlp::{Mlp, write_model};
    use crate::proto::RawData;

    fn model_file(dir: &Path, sizes: &[usize], external: Option<&str>) -> PathBuf {
        write_model(dir, &Mlp::new(sizes, 7), external)
    }

    /// Stages the model at `path` from its skeleton, its external data files
    /// found beside it.
    fn stage(path: &Path, parent: &Path, move_inline: bool) -> Result<Option<Staged>, String> {
        let file = File::open(path).map_err(|e| e.to_string())?;
        let skeleton = proto::read_skeleton(&file, path).map_err(|e| e.to_string())?;
        let beside: HashMap<String, File> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.file_name().into_string().unwrap(), File::open(e.path()).unwrap()))
            .collect();
        let external = |location: &str| beside.get(location);
        let input =
            Input { bytes: ModelBytes::Skeleton(skeleton), file: &file, name: path, external: &external, move_inline };
        Staged::create(input, parent)
    }

    #[test]
    fn large_weights_move_to_aligned_places_in_the_data_file_and_keep_their_bytes() {
        let (src, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // fc0.weight is 64 × 48 floats (12 KiB): moved; fc0.bias (192 B) stays.
        let path = model_file(src.path(), &[64, 48, 1], None);
        let original = std::fs::read(&path).unwrap();
        let staged = stage(&path, tmp.path(), true).unwrap().expect("a 12 KiB weight is staged");
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
            let is =
                proto::initializer_bytes(after, RawData::InBytes(&staged_bytes), staged.dir.as_path(), &mut scratch);
            assert_eq!(is.unwrap(), was.unwrap(), "{}'s bytes", before.name);
        }
        // fc0's weight (12 KiB) moved; its bias (192 bytes) and fc1's stayed.
        assert_eq!(moved, 1);
        let dir = staged.dir.clone();
        drop(staged);
        assert!(!dir.exists(), "the staged directory outlives its model");
    }

    #[test]
    fn models_with_only_small_weights_or_nothing_to_move_are_not_staged() {
        let tmp = tempfile::tempdir().unwrap();
        for (sizes, move_inline) in [(&[4usize, 2][..], true), (&[64, 48, 1][..], false)] {
            let src = tempfile::tempdir().unwrap();
            let path = model_file(src.path(), sizes, None);
            assert!(stage(&path, tmp.path(), move_inline).unwrap().is_none(), "{sizes:?} {move_inline}");
        }
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "a directory was left behind");
    }

    #[test]
    fn external_data_of_any_size_moves_to_the_staged_data_file_and_keeps_its_bytes() {
        let (src, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let path = model_file(src.path(), &[64, 48, 1], Some("w.bin"));
        let original = std::fs::read(&path).unwrap();
        let staged = stage(&path, tmp.path(), false).unwrap().expect("external data is always staged");
        let staged_bytes = std::fs::read(staged.model()).unwrap();
        let (parsed, rewritten) = (proto::parse(&original).unwrap(), proto::parse(&staged_bytes).unwrap());
        assert_eq!(parsed.initializers.len(), rewritten.initializers.len());
        let (mut scratch, mut was_scratch) = (Vec::new(), Vec::new());
        for (before, after) in parsed.initializers.iter().zip(&rewritten.initializers) {
            let InitData::External { location, offset, .. } = &after.data else { panic!("{} moved", before.name) };
            assert_eq!((location.as_str(), offset % ALIGN), (DATA_FILE, 0), "{}", before.name);
            let was = proto::initializer_bytes(before, RawData::InBytes(&original), src.path(), &mut was_scratch);
            let is =
                proto::initializer_bytes(after, RawData::InBytes(&staged_bytes), staged.dir.as_path(), &mut scratch);
            assert_eq!(is.unwrap(), was.unwrap(), "{}'s bytes", before.name);
        }
    }

    /// `dir`'s version verified with a seal for every file, as a store's
    /// cache hands it over.
    fn verified_sealed(dir: &Path) -> baton_core::files::verified::Verified {
        use baton_core::files::manifest::{self, VerifyOptions};
        let written = manifest::write(dir).unwrap();
        let mut seal = baton_core::files::seal::Seal::new();
        for entry in &written.entries {
            seal.record(&entry.path, &File::open(dir.join(&entry.path)).unwrap(), &entry.sha256).unwrap();
        }
        let fetched = baton_core::files::source::Fetched { dir: dir.to_owned(), seal: Some(seal) };
        manifest::verify_fetched(&fetched, &VerifyOptions::default()).unwrap()
    }

    #[test]
    fn sealed_external_data_is_mapped_where_it_is() {
        let src = tempfile::tempdir().unwrap();
        let path = model_file(src.path(), &[64, 48, 1], Some("w.bin"));
        let verified = verified_sealed(src.path());
        let data = verified.file("w.bin").unwrap();
        assert!(data.sealed());
        let model = std::fs::read(&path).unwrap();
        let in_place = InPlace::new(&model, "w.bin", data, src.path()).unwrap().expect("aligned: mapped in place");
        assert_eq!(in_place.folder, src.path());
        // Every external tensor is placed at its own offset in the file.
        let parsed = proto::parse(&model).unwrap();
        let original = std::fs::read(src.path().join("w.bin")).unwrap();
        let mut no_scratch = Vec::new();
        assert_eq!(in_place.placed.len(), parsed.initializers.len());
        for (placed, init) in in_place.placed.iter().zip(&parsed.initializers) {
            let bytes = proto::initializer_bytes(init, RawData::InBytes(&model), src.path(), &mut no_scratch).unwrap();
            let range = placed.range.start as usize..placed.range.end as usize;
            assert_eq!((placed.name.as_str(), &original[range]), (init.name.as_str(), bytes));
        }
        assert_eq!(in_place.data.1, original.len() as u64);
    }

    #[test]
    fn external_data_that_cannot_be_mapped_where_it_is_is_left_to_a_copy() {
        let src = tempfile::tempdir().unwrap();
        let path = model_file(src.path(), &[64, 48, 1], Some("w.bin"));
        let verified = verified_sealed(src.path());
        let data = verified.file("w.bin").unwrap();
        let model = std::fs::read(&path).unwrap();
        // Another file's name: the model's tensors are not all in `data`.
        assert!(InPlace::new(&model, "other.bin", data, src.path()).unwrap().is_none());
        // A tensor at an offset its element size does not divide.
        let moved = proto::point_at(&model, "w.bin", &|name| name.ends_with("weight").then_some((2, 4))).unwrap();
        assert!(InPlace::new(&moved, "w.bin", data, src.path()).unwrap().is_none());
    }

    #[test]
    fn a_failed_stage_says_why_and_leaves_nothing() {
        let src = tempfile::tempdir().unwrap();
        let path = model_file(src.path(), &[64, 48, 1], None);
        let missing = src.path().join("no-such-dir");
        let e = stage(&path, &missing, true).unwrap_err();
        assert!(e.contains("no-such-dir"), "{e}");
        // An external data file shorter than the model says.
        let path = model_file(src.path(), &[64, 48, 1], Some("w.bin"));
        std::fs::write(src.path().join("w.bin"), b"short").unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let e = stage(&path, tmp.path(), true).unwrap_err();
        assert!(e.contains("past its end"), "{e}");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}
