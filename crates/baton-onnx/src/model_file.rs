//! The model file, read once per load when it is small.
//!
//! ONNX Runtime reads a model file through a buffer of its own, as large as
//! the file up to 4 MiB, once per session; validation then reads the whole
//! file again to visit the weights, and each read fills memory the process
//! touches for the first time, which is what a load costs serving most. So
//! a file of up to [`READ_ONCE_LIMIT`] is read once: every session is
//! created from these bytes, validation visits the same bytes (so it checks
//! exactly what the sessions were built from), and they are dropped once it
//! has.
//!
//! A larger file is not held, since holding it while the sessions are
//! created raises a load's peak memory by far more than it saves. Its
//! weights are staged for ONNX Runtime to map ([`Staged`]), or, when that is
//! off or fails, ONNX Runtime reads the file. Validation then reads it once
//! the sessions exist, without its weights' payloads, and each payload into
//! one reused buffer when its tensor is visited ([`proto::read_skeleton`]).
//! A model with external data is also created from the file, because ONNX
//! Runtime finds external files relative to the model's path and a model
//! given as bytes has none; so is a file baton's own reader cannot parse, so
//! that ONNX Runtime's error is the one reported. Measurements:
//! docs/hot-swap.md, "Loading never slows serving", and
//! docs/benchmarks-notebook.md, "Fresh memory".

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use baton_core::backend::BackendError;

use crate::proto::{self, InitData, OnnxModel, RawData};
use crate::staged::Staged;

/// The largest model file read once for all sessions and validation: the
/// size of the buffer ONNX Runtime reads a file through.
pub(crate) const READ_ONCE_LIMIT: u64 = 4 << 20;

/// Where the sessions of a version are created from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SessionSource<'a> {
    /// The model file's bytes, read once.
    Bytes(&'a [u8]),
    /// The file itself (large, external data, or not parsable by baton).
    File(&'a Path),
}

/// `model.onnx` as one load read it.
#[derive(Debug)]
pub(crate) struct ModelFile {
    path: PathBuf,
    /// The file's bytes, when the sessions are created from them.
    bytes: Option<Vec<u8>>,
    /// The model staged with its weights as external data, when the
    /// sessions are created from that.
    staged: Option<Staged>,
}

impl ModelFile {
    /// Reads the file at `path` if it is small and self-contained; stages a
    /// larger one under `stage_in`, when given.
    pub(crate) fn read(path: &Path, stage_in: Option<&Path>) -> Result<ModelFile, BackendError> {
        let unreadable = |e: std::io::Error| BackendError::new("model_invalid", format!("{}: {e}", path.display()));
        let size = std::fs::metadata(path).map_err(unreadable)?.len();
        let (mut bytes, mut staged) = (None, None);
        if size <= READ_ONCE_LIMIT {
            bytes = Some(baton_core::short_reads::read_file(path).map_err(unreadable)?)
                .filter(|bytes| self_contained(bytes));
        } else if let Some(parent) = stage_in {
            staged = Staged::create(path, parent).unwrap_or_else(|reason| {
                // On a lowered loading thread: logged through the registry's agent.
                let shown = path.display().to_string();
                baton_core::agent::at_serving_priority(move || {
                    tracing::warn!(
                        path = %shown,
                        %reason,
                        "Staging the model's weights failed; ONNX Runtime reads the model file itself."
                    );
                });
                None
            });
        }
        Ok(ModelFile { path: path.to_path_buf(), bytes, staged })
    }

    /// The model file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// What ONNX Runtime should create each session from.
    pub(crate) fn source(&self) -> SessionSource<'_> {
        match (&self.bytes, &self.staged) {
            (Some(bytes), _) => SessionSource::Bytes(bytes),
            (None, Some(staged)) => SessionSource::File(staged.model()),
            (None, None) => SessionSource::File(&self.path),
        }
    }

    /// Whether the sessions are created from a staged copy.
    pub(crate) fn is_staged(&self) -> bool {
        self.staged.is_some()
    }

    /// Keeps the bytes, if any, for the validation that follows the load,
    /// and removes the staged copy, if any: the sessions exist, and map what
    /// they still use of it.
    pub(crate) fn keep(self) -> KeptFile {
        KeptFile { path: self.path, bytes: Mutex::new(self.bytes) }
    }
}

/// Whether the model parses and keeps all its weights in the file itself.
fn self_contained(bytes: &[u8]) -> bool {
    proto::parse(bytes)
        .is_ok_and(|model| !model.initializers.iter().any(|i| matches!(i.data, InitData::External { .. })))
}

/// The model file as validation reads it.
#[derive(Debug)]
pub(crate) enum Weights {
    /// All of it.
    Whole(Vec<u8>),
    /// All but the initializers' payloads, which are read from `file` one
    /// tensor at a time (see [`proto::read_skeleton`]).
    Skeleton {
        /// The file's bytes with the payloads left out.
        bytes: Vec<u8>,
        /// The file, to read the payloads from.
        file: File,
    },
}

impl Weights {
    /// The bytes to parse.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Weights::Whole(bytes) | Weights::Skeleton { bytes, .. } => bytes,
        }
    }

    /// Where the parsed model's payloads are.
    pub(crate) fn raw(&self) -> RawData<'_> {
        match self {
            Weights::Whole(bytes) => RawData::InBytes(bytes),
            Weights::Skeleton { file, .. } => RawData::InFile(file),
        }
    }

    /// A buffer with room for the largest payload read from the file, so
    /// that one allocation serves every tensor.
    pub(crate) fn scratch(&self, model: &OnnxModel) -> Vec<u8> {
        let largest = match self {
            Weights::Whole(_) => 0,
            Weights::Skeleton { .. } => {
                let len = |i: &proto::Initializer| if let InitData::Raw(r) = &i.data { r.len() } else { 0 };
                model.initializers.iter().map(len).max().unwrap_or(0)
            }
        };
        Vec::with_capacity(largest)
    }
}

/// The bytes a version was built from, until validation has taken them.
#[derive(Debug)]
pub(crate) struct KeptFile {
    path: PathBuf,
    bytes: Mutex<Option<Vec<u8>>>,
}

impl KeptFile {
    /// The model file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The bytes the sessions were built from, the first time; otherwise
    /// the file, read now without its weights' payloads (a version's weights
    /// are visited once, by validation, so later reads are rare).
    pub(crate) fn take(&self) -> std::io::Result<Weights> {
        let kept = self.bytes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(bytes) = kept {
            return Ok(Weights::Whole(bytes));
        }
        let file = File::open(&self.path)?;
        match proto::read_skeleton(&file, &self.path) {
            Ok(bytes) => Ok(Weights::Skeleton { bytes, file }),
            // Malformed: read whole, so that parsing reports what is wrong.
            Err(_) => baton_core::short_reads::read_file(&self.path).map(Weights::Whole),
        }
    }

    /// Whether the bytes are still held.
    #[cfg(test)]
    pub(crate) fn holds_bytes(&self) -> bool {
        self.bytes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlp::{Mlp, OnnxOptions, encode_mlp, write_model};

    fn write(dir: &Path, external: Option<&str>) -> PathBuf {
        write_model(dir, &Mlp::new(&[4, 2], 1), external)
    }

    #[test]
    fn a_self_contained_model_is_given_to_sessions_as_the_bytes_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), None);
        let file = ModelFile::read(&path, None).unwrap();
        match file.source() {
            SessionSource::Bytes(bytes) => assert_eq!(bytes, std::fs::read(&path).unwrap()),
            SessionSource::File(p) => panic!("created from the file {}", p.display()),
        }
    }

    #[test]
    fn a_model_with_external_data_is_given_to_sessions_as_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), Some("weights.bin"));
        let file = ModelFile::read(&path, None).unwrap();
        assert!(matches!(file.source(), SessionSource::File(p) if p == path));
    }

    #[test]
    fn an_unparsable_file_is_left_to_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, b"\xff\xff\xff not a model").unwrap();
        assert!(matches!(ModelFile::read(&path, None).unwrap().source(), SessionSource::File(_)));
    }

    #[test]
    fn a_large_model_is_given_to_sessions_as_its_path_and_read_again_for_validation() {
        let dir = tempfile::tempdir().unwrap();
        let width = 1100; // 4 × 1100 × 1100 bytes of weights: over the limit
        let (model, _) = encode_mlp(&Mlp::new(&[width, width], 1), &OnnxOptions::default());
        assert!(model.len() as u64 > READ_ONCE_LIMIT);
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, &model).unwrap();
        let file = ModelFile::read(&path, None).unwrap();
        assert!(matches!(file.source(), SessionSource::File(p) if p == path));
        let kept = file.keep();
        assert!(!kept.holds_bytes(), "a large file is held from the load to validation");
        match kept.take().unwrap() {
            Weights::Skeleton { bytes, .. } => {
                assert_eq!(bytes.len(), model.len());
                assert_eq!(proto::parse(&bytes).unwrap(), proto::parse(&model).unwrap());
            }
            Weights::Whole(_) => panic!("validation read the whole file"),
        }
    }

    #[test]
    fn a_large_model_is_staged_when_asked_and_read_by_the_engine_when_staging_fails() {
        let (dir, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (model, _) = encode_mlp(&Mlp::new(&[1100, 1100], 1), &OnnxOptions::default());
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, &model).unwrap();
        let file = ModelFile::read(&path, Some(tmp.path())).unwrap();
        assert!(file.is_staged());
        assert!(matches!(file.source(), SessionSource::File(p) if p.starts_with(tmp.path())));
        let kept = file.keep();
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "the staged copy outlives the load");
        assert_eq!(kept.path(), path);
        // Nowhere to stage: the engine reads the model file itself.
        let file = ModelFile::read(&path, Some(&dir.path().join("missing"))).unwrap();
        assert!(!file.is_staged());
        assert!(matches!(file.source(), SessionSource::File(p) if p == path));
    }

    #[test]
    fn validation_gets_the_bytes_read_then_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), None);
        let kept = ModelFile::read(&path, None).unwrap().keep();
        // The file changes after the load read it: the first visit still
        // sees what the sessions were built from.
        let first = std::fs::read(&path).unwrap();
        std::fs::write(&path, b"changed").unwrap();
        assert_eq!(kept.take().unwrap().bytes(), first);
        assert!(!kept.holds_bytes(), "the bytes outlive validation");
        // Not a model: read whole, so that parsing it names the problem.
        assert_eq!(kept.take().unwrap().bytes(), b"changed");
    }
}
