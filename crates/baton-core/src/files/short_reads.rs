//! File reads (and writes) in pieces short enough not to hold a CPU.
//!
//! A loading thread runs at the lowest CPU priority so that a serving
//! thread woken on its CPU takes that CPU at once. In user space it does;
//! inside a system call it does not on kernels built without kernel
//! preemption (`PREEMPT_NONE`): a `read` of a large range from the page
//! cache keeps the CPU until the kernel reaches one of its few scheduling
//! points, and the serving thread waits. Reads in short pieces give the
//! kernel such a point after each piece.
//!
//! So code that runs on a loading thread reads files through these
//! functions, at most [`PIECE`] bytes per system call; the cost is one
//! system call per piece. The measurements behind the piece size are in
//! docs/benchmarks-notebook.md, "Long reads".

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The most one system call reads: 128 KiB, the block the manifest's digest
/// already streams, and a size at which the wait beside the reader was that
/// of no reader at all.
pub const PIECE: usize = 128 << 10;

/// Fills `buf` from `file` at `offset`, [`PIECE`] by piece; like
/// [`FileExt::read_exact_at`], it fails with `UnexpectedEof` when the file
/// ends first.
pub fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    fill(buf, offset, |piece, at| file.read_at(piece, at))
}

/// Fills `buf` from `reader`, [`PIECE`] by piece; like [`Read::read_exact`],
/// it fails with `UnexpectedEof` when the reader ends first.
pub fn read_exact(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<()> {
    fill(buf, 0, |piece, _| reader.read(piece))
}

/// Writes all of `bytes` to `writer`, [`PIECE`] by piece: a write into the
/// page cache holds the CPU in the kernel as a read does, for longer (it
/// allocates the pages it fills).
pub fn write_all(writer: &mut impl std::io::Write, bytes: &[u8]) -> std::io::Result<()> {
    bytes.chunks(PIECE).try_for_each(|piece| writer.write_all(piece))
}

/// The whole file at `path`, read [`PIECE`] by piece (like [`std::fs::read`],
/// which asks for the whole file in one call).
pub fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = File::open(path)?;
    let hint = file.metadata().map(|m| m.len()).unwrap_or(0);
    read_to_end(&mut file, usize::try_from(hint).unwrap_or(0))
}

/// Everything `reader` gives, [`PIECE`] by piece, in a buffer first sized
/// for `hint` bytes. Once the buffer is full, a small read looks for more
/// before it grows, so a file of exactly `hint` bytes is not copied into a
/// buffer twice its size just to find its end.
fn read_to_end(reader: &mut impl Read, hint: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(hint);
    loop {
        let start = bytes.len();
        if start == bytes.capacity() {
            let mut probe = [0u8; 64];
            match reader.read(&mut probe) {
                Ok(0) => return Ok(bytes),
                Ok(n) => {
                    bytes.extend_from_slice(&probe[..n]);
                    bytes.reserve(PIECE);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            continue;
        }
        let piece = (bytes.capacity() - start).min(PIECE);
        bytes.resize(start + piece, 0);
        match reader.read(&mut bytes[start..]) {
            Ok(n) => bytes.truncate(start + n),
            Err(e) if e.kind() == ErrorKind::Interrupted => bytes.truncate(start),
            Err(e) => return Err(e),
        }
        if bytes.len() == start {
            return Ok(bytes);
        }
    }
}

/// Fills `buf` by calls of `read(piece, offset)`, none given more than
/// [`PIECE`] bytes, retrying interrupted calls.
fn fill(
    buf: &mut [u8],
    mut offset: u64,
    mut read: impl FnMut(&mut [u8], u64) -> std::io::Result<usize>,
) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let end = buf.len().min(done + PIECE);
        match read(&mut buf[done..end], offset) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                done += n;
                offset += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn file_of(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    #[test]
    fn no_call_asks_for_more_than_a_piece_and_short_reads_are_resumed() {
        let source = pattern(3 * PIECE + 5);
        let mut asked = Vec::new();
        let mut buf = vec![0u8; source.len() - 100];
        fill(&mut buf, 100, |piece, at| {
            asked.push(piece.len());
            // Return less than asked now and then, as a read may.
            let n = if asked.len() == 2 { piece.len() / 3 } else { piece.len() };
            let at = usize::try_from(at).unwrap();
            piece[..n].copy_from_slice(&source[at..at + n]);
            Ok(n)
        })
        .unwrap();
        assert_eq!(buf, source[100..]);
        assert!(asked.iter().all(|&n| n <= PIECE), "asked {asked:?}");
        assert!(asked.len() >= 4, "asked {asked:?}");
    }

    /// A reader that records how much each call asked for.
    struct Asked<'a> {
        source: &'a [u8],
        asked: Vec<usize>,
    }

    impl Read for Asked<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.asked.push(buf.len());
            self.source.read(buf)
        }
    }

    #[test]
    fn a_whole_file_is_read_a_piece_at_a_time() {
        let source = pattern(2 * PIECE + 9);
        let mut reader = Asked { source: &source, asked: Vec::new() };
        let bytes = read_to_end(&mut reader, source.len()).unwrap();
        assert_eq!(bytes, source);
        assert_eq!(bytes.capacity(), source.len(), "the buffer grew past the file");
        assert!(reader.asked.iter().all(|&n| n <= PIECE), "asked {:?}", reader.asked);
        assert_eq!(reader.asked.len(), 4, "three pieces and the end: {:?}", reader.asked);

        // Without a size hint (or past it), still in pieces, not in probes.
        let mut reader = Asked { source: &source, asked: Vec::new() };
        assert_eq!(read_to_end(&mut reader, 0).unwrap(), source);
        assert!(reader.asked.iter().all(|&n| n <= PIECE), "asked {:?}", reader.asked);
        assert!(reader.asked.len() <= 8, "asked {:?}", reader.asked);
    }

    #[test]
    fn interrupted_calls_are_retried_and_other_errors_returned() {
        let mut calls = 0;
        let mut buf = [0u8; 10];
        fill(&mut buf, 0, |piece, _| {
            calls += 1;
            if calls == 1 { Err(ErrorKind::Interrupted.into()) } else { Ok(piece.len()) }
        })
        .unwrap();
        assert_eq!(calls, 2);
        let failed = fill(&mut buf, 0, |_, _| Err(std::io::Error::other("disk gone")));
        assert_eq!(failed.unwrap_err().to_string(), "disk gone");
    }

    #[test]
    fn reads_from_files_give_the_bytes_and_fail_at_the_end() {
        let source = pattern(2 * PIECE + 77);
        let (_dir, path) = file_of(&source);
        assert_eq!(read_file(&path).unwrap(), source);

        let file = File::open(&path).unwrap();
        let mut buf = vec![0u8; PIECE + 3];
        read_exact_at(&file, &mut buf, 70).unwrap();
        assert_eq!(buf, source[70..70 + PIECE + 3]);
        let past = read_exact_at(&file, &mut buf, PIECE as u64 + 100);
        assert_eq!(past.unwrap_err().kind(), ErrorKind::UnexpectedEof);

        let mut reader = &file;
        let mut head = vec![0u8; PIECE + 1];
        read_exact(&mut reader, &mut head).unwrap();
        assert_eq!(head, source[..PIECE + 1]);

        let (_empty_dir, empty) = file_of(&[]);
        assert!(read_file(&empty).unwrap().is_empty());
    }
}
