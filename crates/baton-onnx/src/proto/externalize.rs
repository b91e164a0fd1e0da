//! A model rewritten so that its large weights are external data.
//!
//! ONNX Runtime maps external data into memory when it is aligned to a page
//! and builds a session without copying it; weights stored inline, in
//! `raw_data`, are copied as each session is built (measured by their page
//! faults, see `crate::staged`). [`externalize`] rewrites a model so that every large
//! graph initializer refers to a separate data file instead, and says where
//! in that file each payload belongs; the caller writes the file
//! (`crate::staged`). Everything else in the model is kept byte for byte.

use std::ops::Range;

use super::wire::{Reader, put_bytes, put_varint};
use super::{ProtoError, Result};

/// TensorProto fields the rewrite reads or writes.
const RAW_DATA: u32 = 9;
const EXTERNAL_DATA: u32 = 13;
const DATA_LOCATION: u32 = 14;
/// TensorProto.DataLocation.EXTERNAL.
const EXTERNAL: u64 = 1;

/// A model with its large weights moved out.
#[derive(Debug)]
pub struct Externalized {
    /// The rewritten model file.
    pub model: Vec<u8>,
    /// Where each moved payload goes, in the order of the data file.
    pub moves: Vec<Move>,
    /// The data file's length.
    pub data_len: u64,
}

/// One payload moved to the data file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    /// The payload's bytes in the original model file.
    pub from: Range<usize>,
    /// Its offset in the data file, a multiple of the alignment.
    pub to: u64,
}

/// Rewrites `bytes`, a whole model file or its [skeleton](super::read_skeleton),
/// so that each graph initializer whose `raw_data` payload has at least
/// `min_len` bytes refers to `location` instead, at an offset that is a
/// multiple of `align` (a power of two). Initializers that already have
/// external data, or any `external_data` entry, are kept as they are, as is
/// every other field of every message. Returns `None` when no payload is
/// large enough to move.
pub fn externalize(bytes: &[u8], location: &str, min_len: usize, align: u64) -> Result<Option<Externalized>> {
    let mut plan = Plan { location, min_len, align, moves: Vec::new(), data_len: 0 };
    let model = plan.model(Reader::new(bytes))?;
    Ok((!plan.moves.is_empty()).then_some(Externalized { model, moves: plan.moves, data_len: plan.data_len }))
}

struct Plan<'a> {
    location: &'a str,
    min_len: usize,
    align: u64,
    moves: Vec<Move>,
    data_len: u64,
}

impl Plan<'_> {
    /// ModelProto: the graph (field 7) rewritten, every other field copied.
    fn model(&mut self, r: Reader<'_>) -> Result<Vec<u8>> {
        replace_field(r, "ModelProto", 7, |graph| self.graph(graph).map(Some))
    }

    /// GraphProto: each initializer (field 5) rewritten, the rest copied.
    fn graph(&mut self, r: Reader<'_>) -> Result<Vec<u8>> {
        replace_field(r, "GraphProto", 5, |tensor| self.tensor(tensor))
    }

    /// TensorProto: `None` to keep it as it is; otherwise the tensor without
    /// `raw_data`, pointing at its payload's place in the data file.
    fn tensor(&mut self, r: Reader<'_>) -> Result<Option<Vec<u8>>> {
        const CTX: &str = "a graph initializer";
        let (mut raw, mut external) = (None, false);
        let mut scan = r.sub(r.pos..r.end);
        while let Some((f, v)) = scan.next(CTX)? {
            match f {
                RAW_DATA => raw = Some(v.bytes(f, CTX)?),
                EXTERNAL_DATA => external = true,
                DATA_LOCATION => external |= v.varint(f, CTX)? == EXTERNAL,
                _ => {}
            }
        }
        // The last raw_data wins, as it does for a protobuf parser.
        let Some(payload) = raw.filter(|p| p.len() >= self.min_len && !external) else {
            return Ok(None);
        };
        let to = self.data_len.next_multiple_of(self.align);
        let len = payload.len() as u64;
        let mut out = Vec::new();
        let mut fields = r;
        let mut start = fields.pos;
        while let Some((f, _)) = fields.next(CTX)? {
            if f != RAW_DATA {
                out.extend_from_slice(&fields.buf[start..fields.pos]);
            }
            start = fields.pos;
        }
        for (key, value) in
            [("location", self.location.to_owned()), ("offset", to.to_string()), ("length", len.to_string())]
        {
            let mut entry = Vec::new();
            put_bytes(&mut entry, 1, key.as_bytes());
            put_bytes(&mut entry, 2, value.as_bytes());
            put_bytes(&mut out, EXTERNAL_DATA, &entry);
        }
        put_varint(&mut out, u64::from(DATA_LOCATION) << 3);
        put_varint(&mut out, EXTERNAL);
        self.moves.push(Move { from: payload, to });
        self.data_len =
            to.checked_add(len).ok_or_else(|| ProtoError::Malformed("external data over 2^64 bytes".into()))?;
        Ok(Some(out))
    }
}

/// Copies the message in `r` field by field, except each length-delimited
/// `field`, which `rewrite` is given: `Some` bytes take its place, `None`
/// keeps it as it was.
fn replace_field(
    mut r: Reader<'_>,
    ctx: &str,
    field: u32,
    mut rewrite: impl FnMut(Reader<'_>) -> Result<Option<Vec<u8>>>,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut start = r.pos;
    while let Some((f, v)) = r.next(ctx)? {
        let rewritten = match f == field {
            true => rewrite(r.sub(v.bytes(f, ctx)?))?,
            false => None,
        };
        match rewritten {
            Some(bytes) => put_bytes(&mut out, f, &bytes),
            None => out.extend_from_slice(&r.buf[start..r.pos]),
        }
        start = r.pos;
    }
    Ok(out)
}
