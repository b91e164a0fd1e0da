//! Files of a version copied, while they are hashed, into a directory only
//! baton writes, so that a backend may map the copy.
//!
//! A backend maps some files as they are: a weights file whose tensors the
//! engine reads in place. A file of a repository must not be mapped under a
//! live version, since whoever can write it can truncate it, and touching a
//! mapped page past the new end kills the process. Copying it at load after
//! hashing it at verify reads it twice, so the verify stage does both in one
//! pass: each block is read once, then hashed on one thread while another
//! writes it. The digest is of the bytes written, so the copy is the file
//! that was verified, and it is handed on as a sealed file: a backend maps
//! it where it is.
//!
//! The copies of one load are in one directory under the temporary
//! directory, `baton-copied-<pid>-<n>`, removed when the last verified file
//! that refers to it is dropped: a backend keeps them for as long as the
//! version lives, as the mapping keeps the file's blocks. A server killed while loading leaves its directory; the next start
//! removes those of processes no longer running ([`crate::files::scratch`]).

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Error, ErrorKind, Result};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use sha2::{Digest, Sha256};

use crate::files::digest::Format;
use crate::files::short_reads::PIECE;

/// What a copied directory's name begins with, followed by the pid.
pub const PREFIX: &str = "baton-copied-";

/// Distinguishes the copied directories of one process.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Which files of a version the verify stage copies while it hashes them.
pub struct CopyPlan<'a> {
    /// Where the copies' directory is made (the temporary directory).
    pub parent: &'a Path,
    /// Whether the file at a manifest path, of a size, is copied.
    pub wanted: &'a dyn Fn(&str, u64) -> bool,
}

/// A directory of copies, removed when dropped.
#[derive(Debug)]
pub struct CopyDir {
    path: PathBuf,
    removed: AtomicBool,
}

impl CopyDir {
    /// A new, empty directory under `parent`, readable by baton's user only.
    pub(crate) fn create(parent: &Path) -> Result<CopyDir> {
        let name = format!("{PREFIX}{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let path = parent.join(name);
        DirBuilder::new().mode(0o700).create(&path)?;
        Ok(CopyDir { path, removed: AtomicBool::new(false) })
    }

    /// Removes the directory and the copies' names, once the engine has
    /// opened or mapped what it needs: the copies' blocks live on for as
    /// long as a descriptor or a mapping holds them, and go when the
    /// process does, however it ends.
    pub(crate) fn remove(&self) {
        if self.removed.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            // Removed on a lowered loading thread: logged through the registry's agent.
            let dir = self.path.display().to_string();
            crate::threads::agent::at_serving_priority(move || {
                tracing::warn!(%dir, error = %e, "A directory of verified copies could not be removed.");
            });
        }
    }

    /// A directory of copies another baton process made and will remove:
    /// this one only points at it, and never removes it.
    pub(crate) fn handed_over(path: PathBuf) -> CopyDir {
        CopyDir { path, removed: AtomicBool::new(true) }
    }

    /// The directory: a copied file is at its manifest path below it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Copies `src` to `rel` below the directory, hashing what it writes
    /// as `format` says; returns the copy, opened for reading, and the
    /// digest and size of its bytes.
    pub(crate) fn copy(&self, rel: &str, src: &File, format: Format) -> Result<(File, String, u64)> {
        let dest_path = self.path.join(rel);
        if let Some(parent) = dest_path.parent() {
            DirBuilder::new().mode(0o700).recursive(true).create(parent)?;
        }
        let dest = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&dest_path)?;
        // Format 1 is one chain of SHA-256: copy_hashing gives it one hasher.
        let (digest, size) = copy_hashing(src, &dest, format, crate::files::manifest::hashing_threads())?;
        drop(dest);
        Ok((File::open(&dest_path)?, digest, size))
    }
}

impl Drop for CopyDir {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The block one pass reads, hashes and writes at a time; a format-2
/// piece is a whole number of blocks.
const BLOCK: usize = 4 << 20;

/// A block handed to a hasher: which piece it belongs to, and its bytes.
type Block = (u64, Arc<Vec<u8>>);

/// Copies `src` from its first byte to its end into `dest`, and returns the
/// digest (of `format`) and size of what was written. This thread reads
/// and writes; `hashers` other threads hash the blocks they are handed,
/// each the whole pieces given to it (format 1 has one piece: one hasher).
/// Every system call moves at most [`PIECE`] bytes, so that no thread holds
/// a CPU in the kernel for long ([`crate::files::short_reads`]).
pub(crate) fn copy_hashing(src: &File, dest: &File, format: Format, hashers: usize) -> Result<(String, u64)> {
    let piece = format.piece();
    let hashers = if piece == u64::MAX { 1 } else { hashers.max(1) };
    // Two blocks in flight per hasher, and one being read.
    let buffers = 2 * hashers + 1;
    let (returned_tx, returned) = sync_channel::<Arc<Vec<u8>>>(buffers);
    std::thread::scope(|scope| {
        let mut senders = Vec::with_capacity(hashers);
        let mut threads = Vec::with_capacity(hashers);
        for _ in 0..hashers {
            let (to_hasher, blocks) = sync_channel::<Block>(2);
            let back = returned_tx.clone();
            let thread = std::thread::Builder::new()
                .name("baton-hash".to_owned())
                .spawn_scoped(scope, move || hash_pieces(blocks, &back))?;
            senders.push(to_hasher);
            threads.push(thread);
        }
        drop(returned_tx);
        let copied = copy_blocks(src, dest, piece, &senders, &returned, buffers);
        drop(senders);
        let mut pieces = Vec::new();
        for thread in threads {
            pieces.extend(thread.join().map_err(|_| Error::other("a hashing thread panicked"))?);
        }
        let size = copied?;
        pieces.sort_unstable_by_key(|(index, _)| *index);
        let digests: Vec<[u8; 32]> = pieces.into_iter().map(|(_, digest)| digest).collect();
        Ok((crate::files::digest::combine(&digests), size))
    })
}

/// A hasher's work: the SHA-256 of each piece whose blocks it is handed,
/// in order, returning each block once hashed.
fn hash_pieces(blocks: Receiver<Block>, back: &SyncSender<Arc<Vec<u8>>>) -> Vec<(u64, [u8; 32])> {
    let mut done = Vec::new();
    let mut current: Option<(u64, Sha256)> = None;
    for (index, block) in blocks {
        match &mut current {
            Some((at, sha)) if *at == index => sha.update(&block[..]),
            _ => {
                if let Some((at, sha)) = current.take() {
                    done.push((at, sha.finalize().into()));
                }
                let mut sha = Sha256::new();
                sha.update(&block[..]);
                current = Some((index, sha));
            }
        }
        // The copier may have stopped on an error: nobody to return it to.
        let _ = back.send(block);
    }
    if let Some((at, sha)) = current {
        done.push((at, sha.finalize().into()));
    }
    done
}

/// The reading and writing half of [`copy_hashing`]: piece `i` goes to
/// hasher `i % hashers`.
fn copy_blocks(
    src: &File,
    dest: &File,
    piece: u64,
    hashers: &[SyncSender<Block>],
    returned: &Receiver<Arc<Vec<u8>>>,
    buffers: usize,
) -> Result<u64> {
    let gone = || Error::other("a hashing thread stopped");
    let (mut size, mut made) = (0u64, 0);
    loop {
        let mut buf = if made < buffers {
            made += 1;
            vec![0u8; BLOCK]
        } else {
            // Hashed, and this thread's handle was dropped after its write.
            Arc::try_unwrap(returned.recv().map_err(|_| gone())?)
                .map_err(|_| Error::other("a block is still shared"))?
        };
        buf.resize(BLOCK, 0);
        let n = fill(src, &mut buf, size)?;
        if n == 0 {
            return Ok(size);
        }
        buf.truncate(n);
        let block = Arc::new(buf);
        let index = size / piece;
        let hasher = &hashers[(index % hashers.len() as u64) as usize];
        hasher.send((index, Arc::clone(&block))).map_err(|_| gone())?;
        for (i, bytes) in block.chunks(PIECE).enumerate() {
            dest.write_all_at(bytes, size + (i * PIECE) as u64)?;
        }
        size += n as u64;
        if n < BLOCK {
            return Ok(size);
        }
    }
}

/// Reads into `buf` from `file` at `offset` until `buf` is full or the file
/// ends; returns how much was read.
fn fill(file: &File, buf: &mut [u8], offset: u64) -> Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let end = (done + PIECE).min(buf.len());
        match file.read_at(&mut buf[done..end], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_holds_the_bytes_and_the_digest_is_theirs() {
        let top = tempfile::tempdir().unwrap();
        // Several pieces of several blocks, and a short last one.
        let len = 2 * crate::files::digest::PIECE_BYTES as usize + BLOCK + 12_345;
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let src_path = top.path().join("src.bin");
        std::fs::write(&src_path, &bytes).unwrap();
        let dir = CopyDir::create(top.path()).unwrap();
        let src = File::open(&src_path).unwrap();
        let (copy, digest, size) = dir.copy("nested/w.bin", &src, Format::Whole).unwrap();
        assert_eq!(size, bytes.len() as u64);
        assert_eq!(digest, crate::files::manifest::digest_file(&src_path).unwrap().0);
        // Format 2, by several hashers: the digest of the pieces.
        for hashers in [1, 2, 3] {
            let dest = tempfile::tempfile().unwrap();
            let (pieces, _) = copy_hashing(&src, &dest, Format::Pieces, hashers).unwrap();
            assert_eq!(pieces, crate::files::digest::of_file(&src, Format::Pieces, 1).unwrap().0, "{hashers} hashers");
        }
        let mut read = Vec::new();
        std::io::Read::read_to_end(&mut &copy, &mut read).unwrap();
        assert!(read == bytes, "the copy differs");
        let path = dir.path().to_owned();
        assert!(path.join("nested/w.bin").is_file());
        drop(dir);
        assert!(!path.exists(), "removed when dropped");
    }

    #[test]
    fn an_empty_file_copies_to_an_empty_file() {
        let top = tempfile::tempdir().unwrap();
        std::fs::write(top.path().join("empty"), b"").unwrap();
        let dir = CopyDir::create(top.path()).unwrap();
        let (_, digest, size) =
            dir.copy("empty", &File::open(top.path().join("empty")).unwrap(), Format::Pieces).unwrap();
        assert_eq!((digest.as_str(), size), ("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", 0));
    }
}
