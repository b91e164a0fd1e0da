//! A model file read without its weights.
//!
//! Validation used to read the whole model file into memory and parse it, so
//! loading a version needed memory for the file on top of the sessions built
//! from it: a 480 MiB model's load peaked 480 MiB above what the version
//! then held. [`parse`](super::parse) never reads a `raw_data` payload; it
//! records where the payload is. So the file is read into a buffer of its
//! own length with the graph initializers' payloads left out (zeros that
//! were never written, which the kernel does not back with memory), the
//! buffer is parsed as the whole file would be, and each payload is read
//! from the file when its tensor is visited, into one buffer reused for
//! every tensor. Validation then needs memory for the model's structure and
//! its largest tensor, and the pages it fills are mostly ones it reuses.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{ProtoError, Result};

/// Where a message sits in the path to the payloads left out.
#[derive(Clone, Copy, PartialEq)]
enum Level {
    /// ModelProto.
    Model,
    /// ModelProto.graph.
    Graph,
    /// ModelProto.graph.initializer.
    Tensor,
}

/// Reads the model file `file` (at `path`, for errors) into a buffer of the
/// file's length that holds every byte except the `raw_data` payloads of the
/// graph's initializers, which stay zero. [`parse`](super::parse) reads the
/// same model from it as from the whole file; the payloads are then read
/// from the file at the ranges it reports ([`RawData::InFile`](super::RawData)).
/// The file is read from its first byte at explicit offsets, whatever its
/// own offset, which is left as it was.
pub fn read_skeleton(file: &File, path: &Path) -> Result<Vec<u8>> {
    let io = |source| ProtoError::Read { what: format!("the model file {}", path.display()), source };
    let len = file.metadata().map_err(io)?.len();
    let len = usize::try_from(len)
        .map_err(|_| ProtoError::Unsupported(format!("a model file of {len} bytes is too large to read")))?;
    // Zeroed by the allocator: a large buffer is fresh mapped memory, and
    // its pages cost nothing until written.
    let at = At { file, pos: 0 };
    let mut scan = Scan { file: BufReader::with_capacity(64 << 10, at), out: vec![0; len], pos: 0 };
    match scan.message(len, Level::Model) {
        Err(ProtoError::Read { source, .. }) => Err(io(source)),
        other => other.map(|()| scan.out),
    }
}

/// A file read at an offset of its own rather than the descriptor's, so
/// that a descriptor shared with others is read from its start.
struct At<'f> {
    file: &'f File,
    pos: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for At<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start of the file");
        self.pos = match to {
            SeekFrom::Start(n) => n,
            SeekFrom::Current(by) => self.pos.checked_add_signed(by).ok_or_else(invalid)?,
            SeekFrom::End(by) => self.file.metadata()?.len().checked_add_signed(by).ok_or_else(invalid)?,
        };
        Ok(self.pos)
    }
}

/// A cursor reading the file in order, into `out` at the same offsets.
struct Scan<'f> {
    file: BufReader<At<'f>>,
    out: Vec<u8>,
    pos: usize,
}

impl Scan<'_> {
    /// Reads the message ending at `end`, descending only into the fields on
    /// the path to the initializers' payloads.
    fn message(&mut self, end: usize, level: Level) -> Result<()> {
        while self.pos < end {
            let key = self.varint(end)?;
            let (field, wire) = (key >> 3, key & 7);
            match wire {
                0 => drop(self.varint(end)?),
                1 => self.copy(8, end)?,
                5 => self.copy(4, end)?,
                2 => {
                    let len = self.varint(end)?;
                    let len = usize::try_from(len).ok().filter(|&n| n <= end - self.pos).ok_or_else(truncated)?;
                    match (level, field) {
                        (Level::Model, 7) => self.message(self.pos + len, Level::Graph)?,
                        (Level::Graph, 5) => self.message(self.pos + len, Level::Tensor)?,
                        (Level::Tensor, 9) => self.skip(len)?,
                        _ => self.copy(len, end)?,
                    }
                }
                w => return Err(ProtoError::Malformed(format!("wire type {w} for field {field} of a model file"))),
            }
        }
        Ok(())
    }

    /// Copies the next `n` bytes, which must end by `end`.
    fn copy(&mut self, n: usize, end: usize) -> Result<()> {
        if n > end - self.pos {
            return Err(truncated());
        }
        let to = &mut self.out[self.pos..self.pos + n];
        // In pieces: a long field in one read would hold the loading
        // thread's CPU (baton_core::files::short_reads).
        baton_core::files::short_reads::read_exact(&mut self.file, to)
            .map_err(|source| ProtoError::Read { what: String::new(), source })?;
        self.pos += n;
        Ok(())
    }

    /// Passes over the next `n` bytes without reading them.
    fn skip(&mut self, n: usize) -> Result<()> {
        let by = i64::try_from(n).map_err(|_| truncated())?;
        self.file.seek_relative(by).map_err(|source| ProtoError::Read { what: String::new(), source })?;
        self.pos += n;
        Ok(())
    }

    /// Copies a varint and returns its value.
    fn varint(&mut self, end: usize) -> Result<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            self.copy(1, end)?;
            let b = self.out[self.pos - 1];
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(ProtoError::Malformed("a varint of a model file is longer than 10 bytes".into()))
    }
}

fn truncated() -> ProtoError {
    ProtoError::Truncated { context: "a model file".into() }
}
