//! How a MANIFEST names a file's content.
//!
//! Format 1 names it by the SHA-256 of the whole file, what `sha256sum`
//! prints. SHA-256 is a chain: one core computes it, at about 1.3–1.6 GB/s
//! here, so a 1 GiB weights file costs 0.7–0.8 s of verify however many
//! cores the machine has. Format 2 names a file of at most one piece
//! ([`PIECE_BYTES`], 16 MiB) by its SHA-256 as format 1 does, and a larger
//! file by the SHA-256 of its pieces' SHA-256 digests (32 bytes each, in
//! order): the pieces can be hashed on every core at once, and the result
//! is as hard to forge as SHA-256 itself. baton writes format 2 and reads
//! both.

use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::files::short_reads::PIECE;

/// The size of a format-2 piece: 16 MiB.
pub const PIECE_BYTES: u64 = 16 << 20;

/// How a manifest's digests are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// Format 1: SHA-256 of the whole file.
    Whole,
    /// Format 2: by pieces of [`PIECE_BYTES`] (see the module's comment).
    #[default]
    Pieces,
}

impl Format {
    /// The number on the manifest's first line.
    pub fn number(self) -> u32 {
        match self {
            Format::Whole => 1,
            Format::Pieces => 2,
        }
    }

    /// The format numbered `n`, if baton reads it.
    pub fn from_number(n: u32) -> Option<Format> {
        match n {
            1 => Some(Format::Whole),
            2 => Some(Format::Pieces),
            _ => None,
        }
    }

    /// The bytes each digest of the chain covers: a piece, or everything.
    pub(crate) fn piece(self) -> u64 {
        match self {
            Format::Whole => u64::MAX,
            Format::Pieces => PIECE_BYTES,
        }
    }
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest of a file from the SHA-256 of each of its pieces, in order
/// (one for format 1, or for a file of at most one piece).
pub(crate) fn combine(pieces: &[[u8; 32]]) -> String {
    match pieces {
        [] => hex(&Sha256::digest(b"")),
        [one] => hex(one),
        many => {
            let mut outer = Sha256::new();
            for piece in many {
                outer.update(piece);
            }
            hex(&outer.finalize())
        }
    }
}

/// A digest computed from bytes given in order, on one thread: for a
/// fetcher that receives a file's bytes one range after another.
#[derive(Clone, Debug)]
pub struct Hasher {
    piece: u64,
    current: Sha256,
    in_current: u64,
    done: Vec<[u8; 32]>,
}

impl Hasher {
    /// A digest of `format`, of no bytes yet.
    pub fn new(format: Format) -> Hasher {
        Hasher { piece: format.piece(), current: Sha256::new(), in_current: 0, done: Vec::new() }
    }

    /// Adds the next bytes of the file.
    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.in_current == self.piece {
                let full = std::mem::take(&mut self.current).finalize();
                self.done.push(full.into());
                self.in_current = 0;
            }
            let room = usize::try_from(self.piece - self.in_current).unwrap_or(usize::MAX);
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            self.current.update(now);
            self.in_current += now.len() as u64;
            bytes = rest;
        }
    }

    /// The digest of every byte given, as the manifest writes it.
    pub fn finish(mut self) -> String {
        if self.in_current > 0 || self.done.is_empty() {
            self.done.push(self.current.finalize().into());
        }
        combine(&self.done)
    }
}

/// The digest of an open file from its first byte to its end, and its
/// size; format 2's pieces are hashed on up to `threads` threads. Reads at
/// explicit offsets, [`PIECE`] bytes per system call.
pub fn of_file(file: &File, format: Format, threads: usize) -> std::io::Result<(String, u64)> {
    let size = file.metadata()?.len();
    let piece = format.piece();
    let count = size.div_ceil(piece).max(1);
    let threads = usize::try_from(count).unwrap_or(usize::MAX).min(threads.max(1));
    if threads == 1 {
        let mut hasher = Hasher::new(format);
        let read = read_range(file, 0, u64::MAX, |bytes| hasher.update(bytes))?;
        return Ok((hasher.finish(), read));
    }
    // Pieces taken in turn by each thread; the last piece must end where
    // the file ends when hashed, or the file changed.
    let next = AtomicU64::new(0);
    let digests = Mutex::new(vec![[0u8; 32]; count as usize]);
    let total = AtomicU64::new(0);
    std::thread::scope(|scope| {
        let work = || -> std::io::Result<()> {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok(());
                }
                let mut sha = Sha256::new();
                let read = read_range(file, i * piece, piece, |bytes| sha.update(bytes))?;
                total.fetch_add(read, Ordering::Relaxed);
                digests.lock().unwrap_or_else(|e| e.into_inner())[i as usize] = sha.finalize().into();
            }
        };
        let helpers: Vec<_> = (1..threads).map(|_| scope.spawn(work)).collect();
        let mine = work();
        helpers
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("a hashing thread panicked"))))?;
        mine
    })?;
    let digests = digests.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok((combine(&digests), total.into_inner()))
}

/// Reads up to `len` bytes of `file` from `at`, stopping at its end, and
/// hands them to `each` in reads of [`PIECE`] bytes; returns how many.
fn read_range(file: &File, at: u64, len: u64, mut each: impl FnMut(&[u8])) -> std::io::Result<u64> {
    let mut buf = vec![0u8; PIECE];
    let mut read = 0u64;
    while read < len {
        let want = usize::try_from(len - read).unwrap_or(usize::MAX).min(PIECE);
        match file.read_at(&mut buf[..want], at + read) {
            Ok(0) => break,
            Ok(n) => {
                each(&buf[..n]);
                read += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(bytes: &[u8]) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), bytes).unwrap();
        let file = File::open(dir.path().join("f")).unwrap();
        (dir, file)
    }

    #[test]
    fn format_1_is_sha256_of_the_file_and_format_2_agrees_up_to_one_piece() {
        let (_d, file) = file_of(b"abc");
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(of_file(&file, Format::Whole, 1).unwrap(), (abc.to_owned(), 3));
        assert_eq!(of_file(&file, Format::Pieces, 4).unwrap(), (abc.to_owned(), 3));
        let (_d, empty) = file_of(b"");
        let nothing = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(of_file(&empty, Format::Pieces, 2).unwrap(), (nothing.to_owned(), 0));
        assert_eq!(Hasher::new(Format::Pieces).finish(), nothing);
    }

    #[test]
    fn format_2_of_a_larger_file_is_the_digest_of_its_pieces_however_it_is_computed() {
        // Two whole pieces and a short third.
        let bytes: Vec<u8> = (0..(2 * PIECE_BYTES as usize + 1000)).map(|i| (i % 253) as u8).collect();
        let (_d, file) = file_of(&bytes);
        let pieces: Vec<[u8; 32]> = bytes.chunks(PIECE_BYTES as usize).map(|p| Sha256::digest(p).into()).collect();
        let mut outer = Sha256::new();
        pieces.iter().for_each(|p| outer.update(p));
        let expected = hex(&outer.finalize());
        for threads in [1, 2, 3, 8] {
            assert_eq!(of_file(&file, Format::Pieces, threads).unwrap(), (expected.clone(), bytes.len() as u64));
        }
        // Given in ranges that straddle the pieces' ends.
        let mut hasher = Hasher::new(Format::Pieces);
        bytes.chunks(7_000_001).for_each(|r| hasher.update(r));
        assert_eq!(hasher.finish(), expected);
        // Format 1 stays the plain digest, and differs.
        let whole = hex(&Sha256::digest(&bytes));
        assert_eq!(of_file(&file, Format::Whole, 4).unwrap().0, whole);
        assert_ne!(whole, expected);
        // Exactly one piece: the plain digest again.
        let (_d, one) = file_of(&bytes[..PIECE_BYTES as usize]);
        assert_eq!(of_file(&one, Format::Pieces, 2).unwrap().0, hex(&Sha256::digest(&bytes[..PIECE_BYTES as usize])));
    }
}
