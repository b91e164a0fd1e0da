//! A verified version: its files, each opened once, hashed through that
//! descriptor and kept open for the stages that follow.
//!
//! Verifying by path and loading by path again leaves a window: a file
//! swapped (renamed over) or rewritten between the two would be served
//! without ever being checked. So the verify stage opens every file once,
//! checks where it really is, hashes it through that descriptor, and hands
//! the open files on in a [`Verified`]. A backend reads its files through
//! them: a rename over the path afterwards no longer matters, since the
//! descriptor still refers to the file that was hashed. What a descriptor
//! cannot prevent is a write into that same file; [`VerifiedFile::unchanged`]
//! compares the file's size, modification and change times with those seen
//! when it was hashed, and a backend calls it once it has read what it needs.
//! The change time is set by the kernel on every write and cannot be set back
//! by a user; its resolution is the kernel's timestamp granularity (see
//! docs/hot-swap.md, "What the verify stage guarantees").
//!
//! Where a file really is: a file may be a symlink, and one that leads out
//! of the version directory would serve whatever it points at, which the
//! repository's owner may not control (and which may change without the
//! version's MANIFEST changing). Each file is opened, then its path is
//! resolved, and the file at the resolved path must be the file opened
//! (same device and inode) and lie below the version directory, itself
//! resolved. Symlinks that stay inside the version are accepted.

use std::fs::{File, Metadata, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::files::copied::{CopyDir, CopyPlan};
use crate::files::manifest::{self, MANIFEST, Manifest, VerifyError, VerifyOptions, io_err};
use crate::files::seal::Seal;

/// A version whose files matched its manifest, each still open.
#[derive(Debug)]
pub struct Verified {
    dir: PathBuf,
    manifest: Manifest,
    files: Vec<VerifiedFile>,
}

/// One file of a [`Verified`] version: the open file that was hashed, and
/// what it looked like then. Clones share the descriptor.
#[derive(Clone, Debug)]
pub struct VerifiedFile {
    path: String,
    file: Arc<File>,
    stamp: Stamp,
    sealed: bool,
    /// The directory of baton's the file was copied into while it was
    /// hashed, when it was ([`crate::files::copied`]); kept while the file is.
    copied: Option<Arc<CopyDir>>,
}

/// What identifies a file's content without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) size: u64,
    pub(crate) mtime: (i64, i64),
    pub(crate) ctime: (i64, i64),
}

impl Stamp {
    pub(crate) fn of(meta: &Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// What differs from `earlier`, if anything.
    fn differs_from(&self, earlier: &Stamp) -> Option<String> {
        if self.size != earlier.size {
            Some(format!("its size went from {} to {} bytes", earlier.size, self.size))
        } else if self.mtime != earlier.mtime {
            Some("it was written to (its modification time moved)".to_owned())
        } else if self.ctime != earlier.ctime {
            Some("its change time moved: it was written to, renamed over, deleted, linked or chmod'ed".to_owned())
        } else {
            None
        }
    }
}

/// A file of a version that one baton process verified and handed over to
/// another (a worker process), with its descriptor.
#[derive(Debug)]
pub struct HandedFile {
    /// The manifest path.
    pub path: String,
    /// The verified file, as the verifying process opened it.
    pub file: File,
    /// Whether baton wrote it itself ([`VerifiedFile::sealed`]).
    pub sealed: bool,
    /// The directory of copies it is in, when the verify stage copied it
    /// ([`VerifiedFile::copied_into`]); the verifying process removes it.
    pub copied_into: Option<PathBuf>,
}

impl Verified {
    /// A version another baton process verified, rebuilt from the files it
    /// handed over. Each file's identity is taken as it is now: from here
    /// on, [`VerifiedFile::unchanged`] says whether it moved since the
    /// handover (the verifying process checks the time before).
    pub fn handed_over(dir: PathBuf, manifest: Manifest, files: Vec<HandedFile>) -> std::io::Result<Verified> {
        let files = files
            .into_iter()
            .map(|handed| {
                let stamp = Stamp::of(&handed.file.metadata()?);
                let copied = handed.copied_into.map(|path| Arc::new(CopyDir::handed_over(path)));
                Ok(VerifiedFile {
                    path: handed.path,
                    file: Arc::new(handed.file),
                    stamp,
                    sealed: handed.sealed,
                    copied,
                })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Verified { dir, manifest, files })
    }

    /// The version directory, as the source gave it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest the files matched.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The manifest, closing every file.
    pub fn into_manifest(self) -> Manifest {
        self.manifest
    }

    /// A file by its manifest path (`/`-separated, relative to the version).
    pub fn file(&self, path: &str) -> Option<&VerifiedFile> {
        self.files.iter().find(|f| f.path == path)
    }

    /// Every file, in manifest order.
    pub fn files(&self) -> &[VerifiedFile] {
        &self.files
    }

    /// Removes the directory of the copies the verify stage made, if any,
    /// with their names: call it once the backend has built the version.
    /// The copies stay readable through their descriptors and mappings.
    pub fn remove_copies(&self) {
        self.files.iter().filter_map(|f| f.copied.as_ref()).for_each(|dir| dir.remove());
    }
}

impl VerifiedFile {
    /// The file's path relative to the version, as the manifest names it.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The open file. Read it at explicit offsets (`FileExt::read_at`), or
    /// seek first: clones share the file offset.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Its size when it was hashed.
    pub fn size(&self) -> u64 {
        self.stamp.size
    }

    /// The whole file, read through the verified descriptor in pieces
    /// ([`crate::files::short_reads`]). Call [`VerifiedFile::unchanged`] after
    /// reading to know that these are the bytes that were hashed.
    pub fn read_all(&self) -> std::io::Result<Vec<u8>> {
        read_whole(&self.file)
    }

    /// A path that opens this very file, whatever is at its name now
    /// (`/proc/self/fd/N`), for an engine that can only be given a path.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// Whether baton wrote the file itself and hashed it on the way, into a
    /// directory only baton writes: a store's cache (accepted by its seal,
    /// and unchanged since), or a copy the verify stage made
    /// ([`crate::files::copied`]). Such a file may be mapped where it is.
    pub fn sealed(&self) -> bool {
        self.sealed
    }

    /// The directory the file is in at its manifest path: the version's
    /// `dir`, or baton's directory of copies when the verify stage copied
    /// it there.
    pub fn folder<'a>(&'a self, dir: &'a Path) -> &'a Path {
        self.copied.as_ref().map_or(dir, |copied| copied.path())
    }

    /// The directory of copies the verify stage copied the file into, if it
    /// did ([`crate::files::copied`]).
    pub fn copied_into(&self) -> Option<&Path> {
        self.copied.as_ref().map(|copied| copied.path())
    }

    /// Whether the file still is as it was hashed: same size, modification
    /// and change times. Strict on purpose: the change time also moves when
    /// the file loses its name (another file renamed over it, a deletion),
    /// after which this descriptor would still read the hashed bytes; such a
    /// load is refused all the same, as one whose file was written to.
    /// A copy the verify stage made ([`crate::files::copied`]) is in a directory
    /// only baton writes, which the load removes: the change time that
    /// removal moves is not compared.
    pub fn unchanged(&self) -> Result<(), VerifyError> {
        let now = self.file.metadata().map_err(io_err(Path::new(&self.path)))?;
        let mut now = Stamp::of(&now);
        if self.copied.is_some() {
            now.ctime = self.stamp.ctime;
        }
        match now.differs_from(&self.stamp) {
            None => Ok(()),
            Some(what) => Err(VerifyError::Changed { path: self.path.clone(), when: "after it was verified", what }),
        }
    }
}

/// See [`manifest::verify_with`].
pub(crate) fn verify_dir(
    dir: &Path,
    options: &VerifyOptions,
    seal: Option<&Seal>,
    copy: Option<&CopyPlan<'_>>,
) -> Result<Verified, VerifyError> {
    let root = match std::fs::canonicalize(dir) {
        Ok(root) => root,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(VerifyError::Missing(dir.to_owned())),
        Err(e) => return Err(VerifyError::Io { path: dir.to_owned(), source: e }),
    };
    let (manifest_file, _) = match open_inside(&root, MANIFEST, options) {
        Err(VerifyError::FileMissing(_)) => return Err(VerifyError::Missing(dir.to_owned())),
        other => other?,
    };
    let manifest_path = root.join(MANIFEST);
    let bytes = read_whole(&manifest_file).map_err(io_err(&manifest_path))?;
    let text = String::from_utf8(bytes).map_err(|e| VerifyError::Io {
        path: manifest_path,
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    let manifest = manifest::parse(&text)?;
    let mut files = Vec::with_capacity(manifest.entries.len());
    let mut copies: Option<Arc<CopyDir>> = None;
    for entry in &manifest.entries {
        let (file, before) = open_inside(&root, &entry.path, options)?;
        if before.size != entry.size {
            return Err(VerifyError::SizeMismatch {
                path: entry.path.clone(),
                expected: entry.size,
                actual: before.size,
            });
        }
        let abs = root.join(&entry.path);
        // Hashed by whoever wrote it, and not touched since: not read again.
        let sealed = seal.and_then(|s| s.digest_of(&entry.path, &before)).map(str::to_owned);
        let wanted = copy.filter(|plan| sealed.is_none() && (plan.wanted)(&entry.path, entry.size));
        let (actual, file, stamp, copied) = match (sealed.clone(), wanted) {
            (Some(sealed), _) => (sealed, file, before, None),
            (None, Some(plan)) => {
                let home = match &copies {
                    Some(home) => Arc::clone(home),
                    None => {
                        Arc::clone(copies.insert(Arc::new(CopyDir::create(plan.parent).map_err(io_err(plan.parent))?)))
                    }
                };
                let (copy, actual, _) = home.copy(&entry.path, &file, manifest.format).map_err(io_err(&abs))?;
                unchanged_while_read(&file, &before, &entry.path, &abs)?;
                let stamp = Stamp::of(&copy.metadata().map_err(io_err(&abs))?);
                (actual, copy, stamp, Some(home))
            }
            (None, None) => {
                let threads = manifest::hashing_threads();
                let (actual, _) =
                    crate::files::digest::of_file(&file, manifest.format, threads).map_err(io_err(&abs))?;
                unchanged_while_read(&file, &before, &entry.path, &abs)?;
                (actual, file, before, None)
            }
        };
        if actual != entry.sha256 {
            return Err(VerifyError::DigestMismatch {
                path: entry.path.clone(),
                expected: entry.sha256.clone(),
                actual,
            });
        }
        let sealed = sealed.is_some() || copied.is_some();
        files.push(VerifiedFile { path: entry.path.clone(), file: Arc::new(file), stamp, sealed, copied });
    }
    for file in manifest::list_files(&root)? {
        if !manifest.entries.iter().any(|e| e.path == file) {
            return Err(VerifyError::Unlisted(file));
        }
    }
    Ok(Verified { dir: dir.to_owned(), manifest, files })
}

/// Checks that `file` is still as it was (`before`) after it was read
/// whole: a write while it was read would make the digest that of no
/// version.
fn unchanged_while_read(file: &File, before: &Stamp, rel: &str, abs: &Path) -> Result<(), VerifyError> {
    let after = Stamp::of(&file.metadata().map_err(io_err(abs))?);
    match after.differs_from(before) {
        Some(what) => Err(VerifyError::Changed { path: rel.to_owned(), when: "while it was verified", what }),
        None => Ok(()),
    }
}

/// Opens `root/rel` for reading and checks that it is a regular file and,
/// unless `options` allow otherwise, that it lies below `root` (which is
/// already resolved). The file is opened first and its resolved path
/// checked to hold that same file, so a path swapped between the check and
/// the open cannot slip through.
fn open_inside(root: &Path, rel: &str, options: &VerifyOptions) -> Result<(File, Stamp), VerifyError> {
    let abs = root.join(rel);
    // Non-blocking: opening a FIFO for reading would otherwise wait for a
    // writer, holding the loader forever.
    let file = match OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(&abs) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(VerifyError::FileMissing(rel.to_owned())),
        Err(e) => return Err(VerifyError::Io { path: abs, source: e }),
    };
    let meta = file.metadata().map_err(io_err(&abs))?;
    if !meta.is_file() {
        return Err(VerifyError::NotAFile(rel.to_owned()));
    }
    let stamp = Stamp::of(&meta);
    if !options.allow_symlinks_outside_version {
        let replaced = || VerifyError::Changed {
            path: rel.to_owned(),
            when: "while it was verified",
            what: "its path was replaced after it was opened".to_owned(),
        };
        let gone = |path: &Path, e: std::io::Error| match e.kind() {
            std::io::ErrorKind::NotFound => replaced(),
            _ => VerifyError::Io { path: path.to_owned(), source: e },
        };
        let target = std::fs::canonicalize(&abs).map_err(|e| gone(&abs, e))?;
        let at_target = std::fs::metadata(&target).map_err(|e| gone(&target, e))?;
        if (at_target.dev(), at_target.ino()) != (stamp.dev, stamp.ino) {
            return Err(replaced());
        }
        if !target.starts_with(root) {
            return Err(VerifyError::OutsideVersion { path: rel.to_owned(), target, root: root.to_owned() });
        }
    }
    Ok((file, stamp))
}

/// The whole of a file, from its first byte, at its length now.
fn read_whole(file: &File) -> std::io::Result<Vec<u8>> {
    let len = file.metadata()?.len();
    let too_large = |_| std::io::Error::other(format!("a file of {len} bytes is too large to read into memory"));
    let mut bytes = vec![0u8; usize::try_from(len).map_err(too_large)?];
    crate::files::short_reads::read_exact_at(file, &mut bytes, 0)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::files::manifest::{verify, verify_with, write};

    fn version() -> (tempfile::TempDir, PathBuf) {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("1");
        std::fs::create_dir_all(dir.join("blobs")).unwrap();
        std::fs::write(dir.join("blobs/model.bin"), b"model bytes").unwrap();
        (top, dir)
    }

    #[test]
    fn a_symlink_out_of_the_version_is_refused_unless_allowed() {
        let (top, dir) = version();
        std::fs::write(top.path().join("elsewhere.bin"), b"outside").unwrap();
        symlink(top.path().join("elsewhere.bin"), dir.join("model.onnx")).unwrap();
        write(&dir).unwrap();
        let error = verify(&dir).unwrap_err();
        assert_eq!(error.kind(), "outside_version", "{error}");
        let message = error.to_string();
        assert!(message.contains("'model.onnx'") && message.contains("elsewhere.bin"), "{message}");
        let allow = VerifyOptions { allow_symlinks_outside_version: true };
        let verified = verify_with(&dir, &allow).unwrap();
        assert_eq!(verified.file("model.onnx").unwrap().read_all().unwrap(), b"outside");
    }

    #[test]
    fn a_symlink_inside_the_version_is_accepted_and_a_relative_one_out_is_not() {
        let (top, dir) = version();
        symlink("blobs/model.bin", dir.join("model.onnx")).unwrap();
        write(&dir).unwrap();
        let verified = verify(&dir).unwrap();
        assert_eq!(verified.file("model.onnx").unwrap().read_all().unwrap(), b"model bytes");

        std::fs::write(top.path().join("secret"), b"x").unwrap();
        symlink("../../secret", dir.join("blobs/sneaky")).unwrap();
        write(&dir).unwrap();
        assert_eq!(verify(&dir).unwrap_err().kind(), "outside_version");
    }

    #[test]
    fn a_manifest_that_leads_out_is_refused_too() {
        let (top, dir) = version();
        write(&dir).unwrap();
        std::fs::rename(dir.join(MANIFEST), top.path().join("MANIFEST.real")).unwrap();
        symlink(top.path().join("MANIFEST.real"), dir.join(MANIFEST)).unwrap();
        assert_eq!(verify(&dir).unwrap_err().kind(), "outside_version");
    }

    #[test]
    fn a_sealed_file_is_not_read_again_until_it_changes() {
        let (_top, dir) = version();
        let written = write(&dir).unwrap();
        // The seal claims the manifest's digest for bytes that are not the
        // manifest's: verifying with it trusts the seal, without it reads.
        let path = dir.join("blobs/model.bin");
        std::fs::write(&path, b"other bytes").unwrap();
        let mut seal = Seal::new();
        seal.record("blobs/model.bin", &File::open(&path).unwrap(), &written.entries[0].sha256).unwrap();
        let fetched = crate::files::source::Fetched { dir: dir.clone(), seal: Some(seal) };
        let verified = manifest::verify_fetched(&fetched, &VerifyOptions::default()).expect("sealed, so not read");
        assert!(verified.file("blobs/model.bin").unwrap().sealed(), "accepted by its seal");
        assert_eq!(verify(&dir).unwrap_err().kind(), "digest_mismatch");
        // What no seal covers is hashed, and is not sealed.
        std::fs::write(&path, b"model bytes").unwrap();
        let unsealed = manifest::verify_fetched(&fetched, &VerifyOptions::default()).expect("read and hashed");
        assert!(unsealed.files().iter().all(|f| !f.sealed()));
        std::fs::write(&path, b"other bytes").unwrap();
        // Written to after sealing: read, and refused.
        std::fs::write(&path, b"other bytez").unwrap();
        let error = manifest::verify_fetched(&fetched, &VerifyOptions::default()).unwrap_err();
        assert_eq!(error.kind(), "digest_mismatch", "{error}");
        // A seal's digest that disagrees with the manifest is refused too.
        let mut seal = Seal::new();
        seal.record("blobs/model.bin", &File::open(&path).unwrap(), "00").unwrap();
        let fetched = crate::files::source::Fetched { dir: dir.clone(), seal: Some(seal) };
        let error = manifest::verify_fetched(&fetched, &VerifyOptions::default()).unwrap_err();
        assert!(error.to_string().contains("SHA-256 00,"), "{error}");
    }

    #[test]
    fn a_fifo_is_not_a_file_and_does_not_block() {
        let (_top, dir) = version();
        write(&dir).unwrap();
        std::fs::remove_file(dir.join("blobs/model.bin")).unwrap();
        let made = std::process::Command::new("mkfifo").arg(dir.join("blobs/model.bin")).status().unwrap();
        assert!(made.success());
        assert_eq!(verify(&dir).unwrap_err().kind(), "not_a_file");
    }

    #[test]
    fn the_verified_file_is_the_one_read_after_a_rename_over_it_and_any_change_is_seen() {
        let (_top, dir) = version();
        write(&dir).unwrap();
        let verified = verify(&dir).unwrap();
        let file = verified.file("blobs/model.bin").unwrap();
        file.unchanged().unwrap();
        // Another file renamed over the path: the descriptor reads the old
        // one, and the old one's change time moved as it lost its name.
        std::fs::write(dir.join("other"), b"other bytes").unwrap();
        std::fs::rename(dir.join("other"), dir.join("blobs/model.bin")).unwrap();
        assert_eq!(file.read_all().unwrap(), b"model bytes");
        assert_eq!(std::fs::read(file.fd_path()).unwrap(), b"model bytes", "opened again by its /proc path");
        assert!(file.unchanged().unwrap_err().to_string().contains("change time moved"));
        // A write of the same length into the hashed file itself.
        write(&dir).unwrap();
        let verified = verify(&dir).unwrap();
        let file = verified.file("blobs/model.bin").unwrap();
        std::fs::write(dir.join("blobs/model.bin"), b"other bytez").unwrap();
        let error = file.unchanged().unwrap_err();
        assert_eq!(error.kind(), "file_changed", "{error}");
        assert!(error.to_string().contains("after it was verified"), "{error}");
    }
}
