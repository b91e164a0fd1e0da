//! `MANIFEST`: the list of every file of a version with its size and
//! digest, written last so that its presence marks a complete version.
//!
//! ```text
//! baton-manifest 2
//! 3f1c…e2  1048576  model.onnx
//! 9a0b…17  4096     warmup/batch1.json
//! end 2
//! ```
//!
//! The number on the first line says how the digests are computed
//! ([`crate::files::digest`]): 1, the SHA-256 of each file; 2, the same for a file
//! of up to 16 MiB and a digest of its 16 MiB pieces' SHA-256 for a larger
//! one, which several cores compute at once. baton writes 2 and reads both.
//! The closing `end N` line makes a manifest that was cut short (a partial
//! copy, a crashed writer) detectable: without it the version is refused.

use std::fs::File;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use thiserror::Error;

pub use crate::files::digest::Format;
pub use crate::files::verified::{Verified, VerifiedFile};

/// The file name of a version's manifest.
pub const MANIFEST: &str = "MANIFEST";
/// The first line, before the format's number.
const HEADER: &str = "baton-manifest";

/// One file of a version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the version directory, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Lower-case hex digest, computed as the manifest's [`Format`] says:
    /// SHA-256 of the file, or of its pieces' SHA-256 for a file of more
    /// than one piece in format 2.
    pub sha256: String,
}

/// A parsed manifest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    /// How the digests are computed.
    pub format: Format,
    /// Every file of the version, sorted by path.
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// Total bytes of all files.
    pub fn total_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }
}

/// Why a version failed verification.
#[derive(Debug, Error)]
pub enum VerifyError {
    /// No MANIFEST file.
    #[error("no MANIFEST in {0}; run `baton package {0}` once its files are complete")]
    Missing(PathBuf),
    /// The manifest lacks its closing line or its count disagrees.
    #[error("MANIFEST is incomplete: {0}")]
    Incomplete(String),
    /// A line that is not `sha256 size path`.
    #[error("MANIFEST line {line}: {reason}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A listed file does not exist.
    #[error("file '{0}' is listed in MANIFEST but missing")]
    FileMissing(String),
    /// A file's size differs from the manifest (a truncated copy, usually).
    #[error("file '{path}' has {actual} bytes, MANIFEST says {expected}")]
    SizeMismatch {
        /// The file.
        path: String,
        /// Size in the manifest.
        expected: u64,
        /// Size on disk.
        actual: u64,
    },
    /// A file's content differs from the manifest.
    #[error("file '{path}' has SHA-256 {actual}, MANIFEST says {expected}")]
    DigestMismatch {
        /// The file.
        path: String,
        /// Digest in the manifest.
        expected: String,
        /// Digest of the file.
        actual: String,
    },
    /// A file in the version directory that the manifest does not list.
    #[error("file '{0}' is not listed in MANIFEST")]
    Unlisted(String),
    /// A file reached through a symlink that leaves the version directory.
    #[error(
        "file '{path}' resolves to {}, outside the version directory {}; \
         set [policy] allow_symlinks_outside_version = true in model.toml to accept it",
        target.display(), root.display()
    )]
    OutsideVersion {
        /// The file, as the manifest names it.
        path: String,
        /// Where it really is.
        target: PathBuf,
        /// The version directory, symlinks resolved.
        root: PathBuf,
    },
    /// A listed path that is not a regular file (a directory, a FIFO, a device).
    #[error("'{0}' is not a regular file")]
    NotAFile(String),
    /// A file changed while it was verified, or after, before it was loaded.
    #[error("file '{path}' changed {when}: {what}")]
    Changed {
        /// The file.
        path: String,
        /// When the change was seen: while verifying, or before loading.
        when: &'static str,
        /// What differs.
        what: String,
    },
    /// Reading failed.
    #[error("reading {path}: {source}")]
    Io {
        /// What was read.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl VerifyError {
    /// Stable kind string for metrics and responses.
    pub fn kind(&self) -> &'static str {
        match self {
            VerifyError::Missing(_) => "manifest_missing",
            VerifyError::Incomplete(_) => "manifest_incomplete",
            VerifyError::Malformed { .. } => "manifest_malformed",
            VerifyError::FileMissing(_) => "file_missing",
            VerifyError::SizeMismatch { .. } => "size_mismatch",
            VerifyError::DigestMismatch { .. } => "digest_mismatch",
            VerifyError::Unlisted(_) => "unlisted_file",
            VerifyError::OutsideVersion { .. } => "outside_version",
            VerifyError::NotAFile(_) => "not_a_file",
            VerifyError::Changed { .. } => "file_changed",
            VerifyError::Io { .. } => "io",
        }
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> VerifyError + '_ {
    move |source| VerifyError::Io { path: path.to_owned(), source }
}

/// SHA-256 and size of the file at `path` (a format-1 digest).
pub fn digest_file(path: &Path) -> std::io::Result<(String, u64)> {
    digest_open(&File::open(path)?)
}

/// SHA-256 and size of an open file from its first byte to its end (a
/// format-1 digest), read at explicit offsets (the file's own offset is
/// left alone, so the descriptor can be shared).
pub fn digest_open(file: &File) -> std::io::Result<(String, u64)> {
    crate::files::digest::of_file(file, Format::Whole, 1)
}

/// The threads a digest of format 2 takes: the machine's cores, up to 4.
pub(crate) fn hashing_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Every regular file below `dir` except the manifest, as sorted relative paths.
pub(crate) fn list_files(dir: &Path) -> Result<Vec<String>, VerifyError> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        for entry in std::fs::read_dir(&abs).map_err(io_err(&abs))? {
            let entry = entry.map_err(io_err(&abs))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let child = rel.join(&name);
            let kind = entry.file_type().map_err(io_err(&abs))?;
            if kind.is_dir() {
                stack.push(child);
            } else if !(rel.as_os_str().is_empty() && (name == MANIFEST || name.starts_with(".MANIFEST"))) {
                out.push(child.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Writes `dir/MANIFEST` for every file in `dir`, in format 2: to a
/// temporary name first, then renamed, so a reader never sees a partial
/// manifest.
pub fn write(dir: &Path) -> Result<Manifest, VerifyError> {
    write_as(dir, Format::Pieces)
}

/// [`write`] in `format`: format 1 for tools that expect `sha256sum`'s
/// digests.
pub fn write_as(dir: &Path, format: Format) -> Result<Manifest, VerifyError> {
    let mut manifest = Manifest { format, entries: Vec::new() };
    for path in list_files(dir)? {
        let abs = dir.join(&path);
        let file = File::open(&abs).map_err(io_err(&abs))?;
        let (sha256, size) = crate::files::digest::of_file(&file, format, hashing_threads()).map_err(io_err(&abs))?;
        manifest.entries.push(Entry { path, size, sha256 });
    }
    let tmp = dir.join(".MANIFEST.tmp");
    let mut file = File::create(&tmp).map_err(io_err(&tmp))?;
    file.write_all(render(&manifest).as_bytes()).map_err(io_err(&tmp))?;
    file.sync_all().map_err(io_err(&tmp))?;
    let dest = dir.join(MANIFEST);
    std::fs::rename(&tmp, &dest).map_err(io_err(&dest))?;
    Ok(manifest)
}

/// The manifest's text.
pub fn render(manifest: &Manifest) -> String {
    let mut text = format!("{HEADER} {}\n", manifest.format.number());
    for e in &manifest.entries {
        text.push_str(&format!("{}  {}  {}\n", e.sha256, e.size, e.path));
    }
    text.push_str(&format!("end {}\n", manifest.entries.len()));
    text
}

/// Parses manifest text.
pub fn parse(text: &str) -> Result<Manifest, VerifyError> {
    let mut lines = text.lines().enumerate();
    let format = match lines.next() {
        Some((_, first)) => {
            let number = first.strip_prefix(HEADER).and_then(|n| n.strip_prefix(' ')).and_then(|n| n.parse().ok());
            number.and_then(Format::from_number).ok_or_else(|| VerifyError::Malformed {
                line: 1,
                reason: format!("expected '{HEADER} 1' or '{HEADER} 2', got '{first}'"),
            })?
        }
        None => return Err(VerifyError::Incomplete("the file is empty".into())),
    };
    let mut manifest = Manifest { format, entries: Vec::new() };
    for (i, line) in lines {
        let line_no = i + 1;
        if let Some(count) = line.strip_prefix("end ") {
            let count: usize = count
                .trim()
                .parse()
                .map_err(|_| VerifyError::Malformed { line: line_no, reason: "bad count after 'end'".into() })?;
            if count != manifest.entries.len() {
                return Err(VerifyError::Incomplete(format!(
                    "'end' says {count} files, {} are listed",
                    manifest.entries.len()
                )));
            }
            if text.lines().count() != line_no {
                return Err(VerifyError::Malformed { line: line_no + 1, reason: "text after 'end'".into() });
            }
            return Ok(manifest);
        }
        manifest.entries.push(parse_entry(line).map_err(|reason| VerifyError::Malformed { line: line_no, reason })?);
    }
    Err(VerifyError::Incomplete("no closing 'end' line; the manifest was cut short".into()))
}

fn parse_entry(line: &str) -> Result<Entry, String> {
    let mut parts = line.splitn(3, "  ");
    let (Some(sha256), Some(size), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("expected 'sha256  size  path'".into());
    };
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
        return Err(format!("'{sha256}' is not a lower-case hex SHA-256"));
    }
    let size = size.trim().parse().map_err(|_| format!("'{size}' is not a size"))?;
    let path = path.trim().to_owned();
    let safe = !path.is_empty() && Path::new(&path).components().all(|c| matches!(c, Component::Normal(_)));
    if !safe {
        return Err(format!("path '{path}' must be relative and stay inside the version"));
    }
    Ok(Entry { path, size, sha256: sha256.to_owned() })
}

/// Whether `dir` holds a manifest that is complete (parses, with its closing
/// line). Files are not hashed; this is the cheap test for "is this a
/// version yet", used when scanning a repository.
pub fn is_complete(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join(MANIFEST)).is_ok_and(|t| parse(&t).is_ok())
}

/// How strictly [`verify_with`] treats where a version's files really are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifyOptions {
    /// Accept files reached through a symlink that leaves the version
    /// directory (`[policy] allow_symlinks_outside_version` in `model.toml`).
    /// Off by default: such a file is refused as `outside_version`.
    pub allow_symlinks_outside_version: bool,
}

/// [`verify_with`] with the default options: no file may lie outside the
/// version directory.
pub fn verify(dir: &Path) -> Result<Verified, VerifyError> {
    verify_with(dir, &VerifyOptions::default())
}

/// Verifies every file of `dir` against its manifest: that it lies inside
/// the version directory (unless `options` allow symlinks out), is a
/// regular file, its size, then its SHA-256; and that no file is present
/// that the manifest does not list. Each file is opened once, and the
/// returned [`Verified`] keeps it open, so that what is loaded afterwards
/// is read from the very file that was hashed (see [`crate::files::verified`]).
pub fn verify_with(dir: &Path, options: &VerifyOptions) -> Result<Verified, VerifyError> {
    crate::files::verified::verify_dir(dir, options, None, None)
}

/// [`verify_with`] on what a source fetched: a file its fetcher hashed while
/// writing it, and that has not changed since (its [`crate::files::seal::Seal`]),
/// is not read again; every other check is made as for any version.
pub fn verify_fetched(
    fetched: &crate::files::source::Fetched,
    options: &VerifyOptions,
) -> Result<Verified, VerifyError> {
    crate::files::verified::verify_dir(&fetched.dir, options, fetched.seal.as_ref(), None)
}

/// [`verify_fetched`], copying the files `plan` wants that no seal covers
/// into a directory of baton's while they are hashed, in one pass
/// ([`crate::files::copied`]): those files of the returned version are the copies.
pub fn verify_copying(
    fetched: &crate::files::source::Fetched,
    options: &VerifyOptions,
    plan: &crate::files::copied::CopyPlan<'_>,
) -> Result<Verified, VerifyError> {
    crate::files::verified::verify_dir(&fetched.dir, options, fetched.seal.as_ref(), Some(plan))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.onnx"), b"model bytes").unwrap();
        std::fs::create_dir(dir.path().join("warmup")).unwrap();
        std::fs::write(dir.path().join("warmup/a.json"), b"{}").unwrap();
        dir
    }

    #[test]
    fn written_manifest_verifies_and_lists_every_file() {
        let dir = version_dir();
        let written = write(dir.path()).unwrap();
        let paths: Vec<&str> = written.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["model.onnx", "warmup/a.json"]);
        assert_eq!(verify(dir.path()).unwrap().manifest(), &written);
        assert!(is_complete(dir.path()));
    }

    #[test]
    fn both_formats_are_written_and_read_and_each_verifies_its_own_digests() {
        let dir = tempfile::tempdir().unwrap();
        // Larger than a piece, so that the two formats' digests differ.
        let bytes: Vec<u8> =
            (0..(crate::files::digest::PIECE_BYTES as usize + 7)).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(dir.path().join("weights.bin"), &bytes).unwrap();
        let one = write_as(dir.path(), Format::Whole).unwrap();
        let text = std::fs::read_to_string(dir.path().join(MANIFEST)).unwrap();
        assert!(text.starts_with("baton-manifest 1\n"), "{text}");
        assert_eq!(one.entries[0].sha256, digest_file(&dir.path().join("weights.bin")).unwrap().0, "sha256sum's");
        assert_eq!(verify(dir.path()).unwrap().manifest(), &one);
        let two = write(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(MANIFEST)).unwrap();
        assert!(text.starts_with("baton-manifest 2\n"), "{text}");
        assert_ne!(one.entries[0].sha256, two.entries[0].sha256);
        assert_eq!(verify(dir.path()).unwrap().manifest(), &two);
        // Format 1's digest under format 2's header is refused, naming the file.
        let swapped = text.replace(&two.entries[0].sha256, &one.entries[0].sha256);
        std::fs::write(dir.path().join(MANIFEST), swapped).unwrap();
        assert_eq!(verify(dir.path()).unwrap_err().kind(), "digest_mismatch");
        std::fs::write(dir.path().join(MANIFEST), text.replace("baton-manifest 2", "baton-manifest 3")).unwrap();
        assert_eq!(verify(dir.path()).unwrap_err().kind(), "manifest_malformed");
    }

    #[test]
    fn each_kind_of_damage_is_named() {
        let dir = version_dir();
        assert!(matches!(verify(dir.path()), Err(VerifyError::Missing(_))));
        write(dir.path()).unwrap();
        std::fs::write(dir.path().join("model.onnx"), b"model bytez").unwrap();
        assert_eq!(verify(dir.path()).unwrap_err().kind(), "digest_mismatch");
        std::fs::write(dir.path().join("model.onnx"), b"model").unwrap();
        assert_eq!(verify(dir.path()).unwrap_err().kind(), "size_mismatch");
        std::fs::remove_file(dir.path().join("model.onnx")).unwrap();
        assert_eq!(verify(dir.path()).unwrap_err().kind(), "file_missing");
        std::fs::write(dir.path().join("model.onnx"), b"model bytes").unwrap();
        std::fs::write(dir.path().join("extra.bin"), b"x").unwrap();
        assert_eq!(verify(dir.path()).unwrap_err().kind(), "unlisted_file");
    }

    #[test]
    fn a_cut_manifest_is_incomplete() {
        let dir = version_dir();
        write(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(MANIFEST)).unwrap();
        let cut = &text[..text.rfind("end").unwrap()];
        std::fs::write(dir.path().join(MANIFEST), cut).unwrap();
        assert_eq!(verify(dir.path()).unwrap_err().kind(), "manifest_incomplete");
        assert!(!is_complete(dir.path()));
        std::fs::write(dir.path().join(MANIFEST), "").unwrap();
        assert_eq!(verify(dir.path()).unwrap_err().kind(), "manifest_incomplete");
    }

    #[test]
    fn paths_may_not_escape_the_version() {
        let zero = "0".repeat(64);
        for path in ["../x", "/etc/passwd", "a/../../b"] {
            let text = format!("{HEADER} 2\n{zero}  1  {path}\nend 1\n");
            assert_eq!(parse(&text).unwrap_err().kind(), "manifest_malformed", "{path}");
        }
    }
}
