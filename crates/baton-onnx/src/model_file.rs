//! The model file, read once per load when it is small, always through the
//! files the verify stage hashed.
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
//! created raises a load's peak memory by far more than it saves
//! (docs/benchmarks-notebook.md, "Fresh memory"). It is read
//! without its weights' payloads ([`proto::read_skeleton`]), which is enough
//! to parse it; its weights are staged for ONNX Runtime to map ([`Staged`]),
//! or, when that is off or fails, ONNX Runtime reads the file, through
//! `/proc/self/fd/N`, the descriptor the verify stage hashed. Validation then
//! reads the skeleton again once the sessions exist, and each payload into
//! one reused buffer when its tensor is visited.
//!
//! Every read goes through the verified descriptors ([`Verified`]): a file
//! renamed over `model.onnx` or a data file after the verify stage is never
//! read. Before anything reaches ONNX Runtime, the model is parsed and its
//! external data checked: each initializer's `location` must be a relative
//! path to a file of the version (`external_data_outside_version`,
//! `external_data_missing`), and no other tensor may have external data
//! (`external_data_unsupported`), since ONNX Runtime would look those up by
//! name itself. A model with external data is staged, its payloads
//! copied from the verified data files, so that the names ONNX Runtime looks
//! up lead to what was verified; unless its external data is one file that
//! a source of baton's wrote and sealed into a directory only baton writes
//! (a store's cache), which is mapped where it is ([`InPlace`]). A file baton cannot parse is refused
//! (`model_invalid`): validation would refuse it anyway, and ONNX Runtime
//! is never given a model whose external data baton has not seen.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use baton_core::files::manifest::VerifyError;
use baton_core::files::verified::{Verified, VerifiedFile};
use baton_core::run::backend::BackendError;

use crate::proto::{self, InitData, OnnxModel, RawData};
use crate::shared::Placed;
use crate::staged::{InPlace, Input, ModelBytes, Staged};

/// The largest model file read once for all sessions and validation: the
/// size of the buffer ONNX Runtime reads a file through.
pub(crate) const READ_ONCE_LIMIT: u64 = 4 << 20;

/// Where the sessions of a version are created from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SessionSource<'a> {
    /// The model file's bytes, read once.
    Bytes(&'a [u8]),
    /// A file: the staged model, or the verified model file by its
    /// `/proc/self/fd` path.
    File(&'a Path),
}

/// The model file and its external data files, as the verify stage opened them.
#[derive(Clone, Debug)]
pub(crate) struct Files {
    model: VerifiedFile,
    /// The model file's path, for messages.
    name: PathBuf,
    /// External data files, by location as the model writes it.
    external: BTreeMap<String, VerifiedFile>,
}

impl Files {
    /// The model file's path, for messages.
    pub(crate) fn name(&self) -> &Path {
        &self.name
    }

    /// An external data file by its location as the model writes it.
    pub(crate) fn external(&self, location: &str) -> Option<&File> {
        self.external.get(location).map(VerifiedFile::file)
    }

    /// Whether every file is still as the verify stage hashed it.
    pub(crate) fn unchanged(&self) -> Result<(), VerifyError> {
        self.model.unchanged()?;
        self.external.values().try_for_each(VerifiedFile::unchanged)
    }
}

/// `model.onnx` as one load read it.
#[derive(Debug)]
pub(crate) struct ModelFile {
    files: Files,
    /// The file's bytes, when it is small: the sessions are created from
    /// them unless it is staged, and validation visits them.
    bytes: Option<Vec<u8>>,
    /// The model staged with its weights as external data, when the
    /// sessions are created from that.
    staged: Option<Staged>,
    /// The model's external data mapped where it is, when its one data
    /// file is baton's own: the sessions are created from the bytes.
    in_place: Option<InPlace>,
    /// The verified model file's `/proc/self/fd` path.
    fd_path: PathBuf,
    /// Whether the bytes are a weights-only version's graph as rewritten
    /// to take its weights file's tensors, which the file on disk is not.
    rewritten: bool,
}

impl ModelFile {
    /// Reads `model.onnx` of a verified version and checks its external
    /// data; stages it under `temp` when it has external data, or when it is
    /// large and `stage_weights` is on.
    pub(crate) fn read(version: &Verified, temp: &Path, stage_weights: bool) -> Result<ModelFile, BackendError> {
        let weights_only = crate::weights_only::graph(version)?;
        let rewritten = weights_only.is_some();
        let (name, model, whole, mut bytes) = match weights_only {
            Some(graph) => (graph.name, graph.file, true, graph.bytes),
            None => {
                let name = version.dir().join(crate::MODEL_FILE);
                let invalid = |e: &dyn std::fmt::Display| model_invalid(&name, e);
                let model =
                    version.file(crate::MODEL_FILE).ok_or_else(|| invalid(&"not a file of the version"))?.clone();
                let whole = model.size() <= READ_ONCE_LIMIT;
                let bytes = match whole {
                    true => model.read_all().map_err(|e| invalid(&e))?,
                    false => proto::read_skeleton(model.file(), &name).map_err(|e| invalid(&e))?,
                };
                (name, model, whole, bytes)
            }
        };
        let invalid = |e: &dyn std::fmt::Display| model_invalid(&name, e);
        let parsed = proto::parse(&bytes).map_err(|e| invalid(&e))?;
        if let Some(tensor) = proto::nested_external_data(&bytes).map_err(|e| invalid(&e))? {
            return Err(BackendError::new(
                "external_data_unsupported",
                format!(
                    "{}: tensor '{tensor}' keeps its data in an external file but is not one of the graph's \
                     initializers (it is in a subgraph, an attribute, a sparse initializer or a function); \
                     baton checks and loads the external data of the graph's initializers only",
                    name.display()
                ),
            ));
        }
        let files = Files { model, external: external_files(version, &parsed, &name)?, name };
        let has_external = !files.external.is_empty();
        let mut staged = None;
        // External data in one file baton wrote itself (a store's cache) is
        // mapped where it is: no copy.
        let sealed = files.external.iter().next().filter(|(_, f)| whole && files.external.len() == 1 && f.sealed());
        let in_place = match sealed {
            Some((location, data)) => {
                InPlace::new(&bytes, location, data, version.dir()).map_err(|e| model_invalid(&files.name, &e))?
            }
            None => None,
        };
        if in_place.is_none() && (has_external || (!whole && stage_weights)) {
            let model_bytes = match whole {
                true => ModelBytes::Whole(&bytes),
                false => ModelBytes::Skeleton(std::mem::take(&mut bytes)),
            };
            let external = |location: &str| files.external(location);
            let input = Input {
                bytes: model_bytes,
                file: files.model.file(),
                name: &files.name,
                external: &external,
                move_inline: stage_weights,
            };
            match Staged::create(input, temp) {
                Ok(done) => staged = done,
                Err(reason) if has_external => {
                    let message = format!(
                        "{}: staging the model's external data failed, and ONNX Runtime may read external data \
                         only from a copy baton made of the verified files: {reason}",
                        files.name.display()
                    );
                    return Err(BackendError::new("staging_failed", message));
                }
                Err(reason) => {
                    // On a lowered loading thread: logged through the registry's agent.
                    let shown = files.name.display().to_string();
                    baton_core::threads::agent::at_serving_priority(move || {
                        tracing::warn!(
                            path = %shown,
                            %reason,
                            "Staging the model's weights failed; ONNX Runtime reads the verified model file itself."
                        );
                    });
                }
            }
        }
        if has_external && staged.is_none() && in_place.is_none() {
            return Err(BackendError::new("staging_failed", format!("{}: nothing was staged", files.name.display())));
        }
        let fd_path = files.model.fd_path();
        Ok(ModelFile { files, bytes: whole.then_some(bytes), staged, in_place, fd_path, rewritten })
    }

    /// The model file's path, for messages.
    pub(crate) fn path(&self) -> &Path {
        self.files.name()
    }

    /// What ONNX Runtime should create each session from.
    pub(crate) fn source(&self) -> SessionSource<'_> {
        match (&self.staged, &self.bytes) {
            (Some(staged), _) => SessionSource::File(staged.model()),
            (None, Some(bytes)) => SessionSource::Bytes(bytes),
            (None, None) => SessionSource::File(&self.fd_path),
        }
    }

    /// Whether the sessions are created from a staged copy.
    pub(crate) fn is_staged(&self) -> bool {
        self.staged.is_some()
    }

    /// Whether the external data is mapped where it is.
    pub(crate) fn is_in_place(&self) -> bool {
        self.in_place.is_some()
    }

    /// The data file the sessions' tensors are mapped from, its length,
    /// and where each tensor is in it: the staged copy's, or the file
    /// itself when it is mapped in place.
    pub(crate) fn mapped(&self) -> Option<(&File, u64, &[Placed])> {
        if let Some(in_place) = &self.in_place {
            return Some((&in_place.data.0, in_place.data.1, &in_place.placed));
        }
        let staged = self.staged.as_ref()?;
        staged.data().map(|(file, len)| (file, *len, staged.placed()))
    }

    /// Where ONNX Runtime looks for external data, when it is given the
    /// model's bytes of a version mapped in place.
    pub(crate) fn external_folder(&self) -> Option<&Path> {
        self.in_place.as_ref().map(|i| i.folder.as_path())
    }

    /// Whether every file read is still as the verify stage hashed it.
    pub(crate) fn unchanged(&self) -> Result<(), VerifyError> {
        self.files.unchanged()
    }

    /// Keeps the bytes, if any, for the validation that follows the load,
    /// and removes the staged copy, if any: the sessions exist, and map what
    /// they still use of it.
    pub(crate) fn keep(self) -> KeptFile {
        KeptFile { files: self.files, bytes: Mutex::new(self.bytes), rewritten: self.rewritten }
    }
}

/// A model file baton cannot read or parse (`model_invalid`).
fn model_invalid(name: &Path, e: &dyn std::fmt::Display) -> BackendError {
    BackendError::new("model_invalid", format!("{}: {e}", name.display()))
}

/// The external data files of `model`'s initializers, each a file of the
/// verified version, by location as the model writes it.
fn external_files(
    version: &Verified,
    model: &OnnxModel,
    name: &Path,
) -> Result<BTreeMap<String, VerifiedFile>, BackendError> {
    let mut files = BTreeMap::new();
    for init in &model.initializers {
        let InitData::External { location, .. } = &init.data else { continue };
        if files.contains_key(location) {
            continue;
        }
        let refused = |kind, why: &str| {
            let (name, tensor) = (name.display(), &init.name);
            BackendError::new(kind, format!("{name}: initializer '{tensor}' keeps its data in '{location}', {why}"))
        };
        let relative = proto::relative_location(location).ok_or_else(|| {
            refused(
                "external_data_outside_version",
                "which leaves the version directory: a location must be a relative path without '..'",
            )
        })?;
        let file = version
            .file(&relative)
            .ok_or_else(|| refused("external_data_missing", "which is not a file of the version's MANIFEST"))?;
        files.insert(location.clone(), file.clone());
    }
    Ok(files)
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
        /// The verified file, to read the payloads from.
        file: VerifiedFile,
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
            Weights::Skeleton { file, .. } => RawData::InFile(file.file()),
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

/// The files and bytes a version was built from, kept for validation.
#[derive(Debug)]
pub(crate) struct KeptFile {
    files: Files,
    bytes: Mutex<Option<Vec<u8>>>,
    /// Keep the bytes for every read (see [`ModelFile`]'s field).
    rewritten: bool,
}

impl KeptFile {
    /// The model file and its external data files.
    pub(crate) fn files(&self) -> &Files {
        &self.files
    }

    /// The bytes the sessions were built from, the first time; otherwise
    /// the verified file, read now without its weights' payloads (a
    /// version's weights are visited once, by validation, so later reads
    /// are rare).
    pub(crate) fn take(&self) -> std::io::Result<Weights> {
        let mut held = self.bytes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let kept = if self.rewritten { held.clone() } else { held.take() };
        drop(held);
        if let Some(bytes) = kept {
            return Ok(Weights::Whole(bytes));
        }
        let file = self.files.model.clone();
        match proto::read_skeleton(file.file(), &self.files.name) {
            Ok(bytes) => Ok(Weights::Skeleton { bytes, file }),
            // Malformed: read whole, so that parsing reports what is wrong.
            Err(_) => file.read_all().map(Weights::Whole),
        }
    }

    /// Whether this is a weights-only version.
    pub(crate) fn is_weights_only(&self) -> bool {
        self.rewritten
    }

    /// Whether the bytes are still held.
    #[cfg(test)]
    pub(crate) fn holds_bytes(&self) -> bool {
        self.bytes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).is_some()
    }
}

#[cfg(test)]
mod tests {
    use baton_core::files::manifest;

    use super::*;
    use crate::mlp::{Mlp, OnnxOptions, encode_mlp, write_model};

    fn write(dir: &Path, external: Option<&str>) -> PathBuf {
        write_model(dir, &Mlp::new(&[4, 2], 1), external)
    }

    /// Seals `dir` as a version and verifies it.
    fn verified(dir: &Path) -> Verified {
        manifest::write(dir).unwrap();
        manifest::verify(dir).unwrap()
    }

    /// A model of more than [`READ_ONCE_LIMIT`] bytes, written to `dir`.
    fn large(dir: &Path) -> Vec<u8> {
        let width = 1100; // 4 × 1100 × 1100 bytes of weights: over the limit
        let (model, _) = encode_mlp(&Mlp::new(&[width, width], 1), &OnnxOptions::default());
        assert!(model.len() as u64 > READ_ONCE_LIMIT);
        std::fs::write(dir.join("model.onnx"), &model).unwrap();
        model
    }

    #[test]
    fn a_self_contained_model_is_given_to_sessions_as_the_verified_bytes() {
        let (dir, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let path = write(dir.path(), None);
        let original = std::fs::read(&path).unwrap();
        let version = verified(dir.path());
        // Another model renamed over the path after the verify stage.
        let other = dir.path().join("other.onnx");
        std::fs::write(&other, encode_mlp(&Mlp::new(&[4, 2], 2), &OnnxOptions::default()).0).unwrap();
        std::fs::rename(&other, &path).unwrap();
        let file = ModelFile::read(&version, tmp.path(), true).unwrap();
        match file.source() {
            SessionSource::Bytes(bytes) => assert_eq!(bytes, original),
            SessionSource::File(p) => panic!("created from the file {}", p.display()),
        }
        assert_eq!(file.unchanged().unwrap_err().kind(), "file_changed", "the rename is still noticed");
    }

    #[test]
    fn a_model_with_external_data_is_staged_from_the_verified_files_even_without_stage_weights() {
        let (dir, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write(dir.path(), Some("weights.bin"));
        let version = verified(dir.path());
        let file = ModelFile::read(&version, tmp.path(), false).unwrap();
        assert!(file.is_staged());
        let SessionSource::File(staged) = file.source() else { panic!("a staged model is given as a file") };
        assert!(staged.starts_with(tmp.path()));
        let rewritten = proto::parse(&std::fs::read(staged).unwrap()).unwrap();
        for init in &rewritten.initializers {
            let InitData::External { location, .. } = &init.data else { panic!("{} moved", init.name) };
            assert_eq!(location, "weights.bin", "read from the staged directory, not the version");
        }
        file.unchanged().unwrap();
        drop(file);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "the staged copy outlives the load");
    }

    #[test]
    fn external_data_outside_the_version_or_not_in_it_is_refused_before_anything_is_staged() {
        for (location, kind) in [
            ("../weights.bin", "external_data_outside_version"),
            ("/tmp/weights.bin", "external_data_outside_version"),
            ("sub/../../weights.bin", "external_data_outside_version"),
            ("MANIFEST", "external_data_missing"),
        ] {
            let (top, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let dir = top.path().join("1");
            std::fs::create_dir(&dir).unwrap();
            let options = OnnxOptions { external_data: Some(location.into()), ..OnnxOptions::default() };
            std::fs::write(dir.join("model.onnx"), encode_mlp(&Mlp::new(&[4, 2], 1), &options).0).unwrap();
            let version = verified(&dir);
            let error = ModelFile::read(&version, tmp.path(), true).unwrap_err();
            assert_eq!(error.kind, kind, "{location}: {}", error.message);
            assert!(error.message.contains(location), "{}", error.message);
            assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "{location}: something was staged");
        }
    }

    #[test]
    fn an_unparsable_file_is_refused() {
        let (dir, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(dir.path().join("model.onnx"), b"\xff\xff\xff not a model").unwrap();
        let error = ModelFile::read(&verified(dir.path()), tmp.path(), true).unwrap_err();
        assert_eq!(error.kind, "model_invalid", "{}", error.message);
    }

    #[test]
    fn a_large_model_unstaged_is_given_to_sessions_as_its_descriptor_and_read_again_for_validation() {
        let (dir, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let model = large(dir.path());
        let version = verified(dir.path());
        let file = ModelFile::read(&version, tmp.path(), false).unwrap();
        let SessionSource::File(path) = file.source() else { panic!("a large file is not held") };
        assert!(path.starts_with("/proc/self/fd"), "{}", path.display());
        assert_eq!(std::fs::read(path).unwrap(), model);
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
        large(dir.path());
        let version = verified(dir.path());
        let file = ModelFile::read(&version, tmp.path(), true).unwrap();
        assert!(file.is_staged());
        assert!(matches!(file.source(), SessionSource::File(p) if p.starts_with(tmp.path())));
        let kept = file.keep();
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "the staged copy outlives the load");
        assert_eq!(kept.files().name(), dir.path().join("model.onnx"));
        // Nowhere to stage: the engine reads the verified model file itself.
        let file = ModelFile::read(&version, &dir.path().join("missing"), true).unwrap();
        assert!(!file.is_staged());
        assert!(matches!(file.source(), SessionSource::File(p) if p.starts_with("/proc/self/fd")));
    }

    #[test]
    fn validation_gets_the_bytes_read_then_the_verified_file() {
        let (dir, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let path = write(dir.path(), None);
        let kept = ModelFile::read(&verified(dir.path()), tmp.path(), true).unwrap().keep();
        // The file is written to after the load read it: the first visit
        // still sees what the sessions were built from.
        let first = std::fs::read(&path).unwrap();
        std::fs::write(&path, b"changed").unwrap();
        assert_eq!(kept.take().unwrap().bytes(), first);
        assert!(!kept.holds_bytes(), "the bytes outlive validation");
        // Not a model: read whole, so that parsing it names the problem;
        // and the change is seen.
        assert_eq!(kept.take().unwrap().bytes(), b"changed");
        assert_eq!(kept.files().unchanged().unwrap_err().kind(), "file_changed");
    }
}
