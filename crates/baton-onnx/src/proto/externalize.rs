//! A model rewritten so that its large weights are external data.
//!
//! ONNX Runtime maps external data into memory when it is aligned to a page
//! and builds a session without copying it; weights stored inline, in
//! `raw_data`, are copied as each session is built (measured by their page
//! faults, see `crate::staged`). [`externalize`] rewrites a model so that every large
//! graph initializer refers to a separate data file instead, and says where
//! in that file each payload belongs; the caller writes the file
//! (`crate::staged`). Asked to, it also moves the initializers that already
//! have external data into that one file, so that ONNX Runtime reads only
//! what baton copied there. Everything else in the model is kept byte for
//! byte.

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
    /// Where the payload's bytes are now.
    pub from: Origin,
    /// Its offset in the data file, a multiple of the alignment.
    pub to: u64,
}

/// Where a moved payload comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The `raw_data` bytes at this range of the model file.
    Inline(Range<usize>),
    /// A range of an external data file, named as the model names it.
    External {
        /// The location, as written in the model.
        location: String,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

impl Move {
    /// The payload's length in bytes.
    pub fn len(&self) -> u64 {
        match &self.from {
            Origin::Inline(range) => (range.end - range.start) as u64,
            Origin::External { len, .. } => *len,
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The length of an external data file, by its location as the model writes
/// it; `None` when there is no such file.
pub type FileLength<'a> = &'a dyn Fn(&str) -> Option<u64>;

/// Rewrites `bytes`, a whole model file or its [skeleton](super::read_skeleton),
/// so that each graph initializer whose `raw_data` payload has at least
/// `min_len` bytes refers to `location` instead, at an offset that is a
/// multiple of `align` (a power of two). With `external`, which gives the
/// length of each external data file, each initializer whose data is
/// external (`data_location` EXTERNAL) moves there too, whatever its size;
/// without it, such initializers are kept as they are. An initializer with
/// `external_data` entries but inline data is kept, as is every other field
/// of every message. Returns `None` when nothing moves.
pub fn externalize(
    bytes: &[u8],
    location: &str,
    min_len: usize,
    align: u64,
    external: Option<FileLength<'_>>,
) -> Result<Option<Externalized>> {
    let mut plan = Plan { location, min_len, align, external, moves: Vec::new(), data_len: 0 };
    let model = plan.model(Reader::new(bytes))?;
    Ok((!plan.moves.is_empty()).then_some(Externalized { model, moves: plan.moves, data_len: plan.data_len }))
}

struct Plan<'a> {
    location: &'a str,
    min_len: usize,
    align: u64,
    external: Option<FileLength<'a>>,
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
    /// `raw_data` or its old external data entries, pointing at its
    /// payload's place in the data file.
    fn tensor(&mut self, r: Reader<'_>) -> Result<Option<Vec<u8>>> {
        const CTX: &str = "a graph initializer";
        let (mut raw, mut entries, mut external) = (None, Vec::new(), false);
        let mut scan = r.sub(r.pos..r.end);
        while let Some((f, v)) = scan.next(CTX)? {
            match f {
                RAW_DATA => raw = Some(v.bytes(f, CTX)?),
                EXTERNAL_DATA => entries.push(v.bytes(f, CTX)?),
                DATA_LOCATION => external = v.varint(f, CTX)? == EXTERNAL,
                _ => {}
            }
        }
        let from = if external {
            let Some(lengths) = self.external else { return Ok(None) };
            external_origin(&scan, &entries, lengths)?
        } else {
            // The last raw_data wins, as it does for a protobuf parser.
            match raw.filter(|p| p.len() >= self.min_len && entries.is_empty()) {
                Some(payload) => Origin::Inline(payload),
                None => return Ok(None),
            }
        };
        let moved = Move { from, to: self.data_len.next_multiple_of(self.align) };
        let (to, len) = (moved.to, moved.len());
        let mut out = Vec::new();
        let mut fields = r;
        let mut start = fields.pos;
        while let Some((f, _)) = fields.next(CTX)? {
            if ![RAW_DATA, EXTERNAL_DATA, DATA_LOCATION].contains(&f) {
                out.extend_from_slice(&fields.buf[start..fields.pos]);
            }
            start = fields.pos;
        }
        put_external(&mut out, self.location, to, len);
        self.moves.push(moved);
        self.data_len =
            to.checked_add(len).ok_or_else(|| ProtoError::Malformed("external data over 2^64 bytes".into()))?;
        Ok(Some(out))
    }
}

/// Appends `external_data` entries for `len` bytes at `offset` of
/// `location`, and `data_location` EXTERNAL, to a TensorProto's fields.
fn put_external(out: &mut Vec<u8>, location: &str, offset: u64, len: u64) {
    for (key, value) in [("location", location.to_owned()), ("offset", offset.to_string()), ("length", len.to_string())]
    {
        let mut entry = Vec::new();
        put_bytes(&mut entry, 1, key.as_bytes());
        put_bytes(&mut entry, 2, value.as_bytes());
        put_bytes(out, EXTERNAL_DATA, &entry);
    }
    put_varint(out, u64::from(DATA_LOCATION) << 3);
    put_varint(out, EXTERNAL);
}

/// Where a tensor's bytes are, by its name: `(offset, length)` in a file.
pub type Placement<'a> = &'a dyn Fn(&str) -> Option<(u64, u64)>;

/// Rewrites a whole model file so that each graph initializer `placement`
/// places refers to those bytes of `location` instead of its own data,
/// whatever form that data had (raw, typed fields or external). Every other
/// field of every message is kept byte for byte. For a weights-only
/// version: its graph's initializers come from its weights file.
pub fn point_at(bytes: &[u8], location: &str, placement: Placement<'_>) -> Result<Vec<u8>> {
    replace_field(Reader::new(bytes), "ModelProto", 7, |graph| {
        replace_field(graph, "GraphProto", 5, |tensor| placed_tensor(tensor, location, placement)).map(Some)
    })
}

/// A TensorProto pointed at its placed bytes; `None` when it is not placed.
fn placed_tensor(r: Reader<'_>, location: &str, placement: Placement<'_>) -> Result<Option<Vec<u8>>> {
    const CTX: &str = "a graph initializer";
    /// TensorProto.name, and the fields that hold data.
    const NAME: u32 = 8;
    const DATA_FIELDS: [u32; 9] = [4, 5, 6, 7, RAW_DATA, 10, 11, EXTERNAL_DATA, DATA_LOCATION];
    let mut scan = r.sub(r.pos..r.end);
    let mut name = None;
    while let Some((f, v)) = scan.next(CTX)? {
        if f == NAME {
            name = Some(scan.string(v, f, CTX)?);
        }
    }
    // An absent name reads as the empty one, as the reader reads it.
    let Some((offset, len)) = placement(name.as_deref().unwrap_or_default()) else { return Ok(None) };
    let mut out = Vec::new();
    let mut fields = r;
    let mut start = fields.pos;
    while let Some((f, _)) = fields.next(CTX)? {
        if !DATA_FIELDS.contains(&f) {
            out.extend_from_slice(&fields.buf[start..fields.pos]);
        }
        start = fields.pos;
    }
    put_external(&mut out, location, offset, len);
    Ok(Some(out))
}

/// Where an initializer's external data is, from its `external_data`
/// entries (`location`, `offset`, `length`), checked against the file's length.
fn external_origin(r: &Reader<'_>, entries: &[Range<usize>], lengths: FileLength<'_>) -> Result<Origin> {
    const CTX: &str = "an external data entry";
    let (mut location, mut offset, mut len) = (None, 0u64, None);
    for entry in entries {
        let mut e = r.sub(entry.clone());
        let (mut key, mut value) = (String::new(), String::new());
        while let Some((f, v)) = e.next(CTX)? {
            match f {
                1 => key = e.string(v, f, CTX)?,
                2 => value = e.string(v, f, CTX)?,
                _ => {}
            }
        }
        let number =
            || value.trim().parse::<u64>().map_err(|_| ProtoError::Malformed(format!("external data {key} '{value}'")));
        match key.as_str() {
            "location" => location = Some(value.clone()),
            "offset" => offset = number()?,
            "length" => len = Some(number()?),
            _ => {}
        }
    }
    let location = location.ok_or_else(|| ProtoError::Malformed("external data without a 'location' key".into()))?;
    let file_len = lengths(&location)
        .ok_or_else(|| ProtoError::Malformed(format!("external data file '{location}' is not a file of the model")))?;
    let len = len.unwrap_or(file_len.saturating_sub(offset));
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(ProtoError::Malformed(format!(
            "external data in '{location}' at offset {offset}, length {len}, is past its end ({file_len} bytes)"
        )));
    }
    Ok(Origin::External { location, offset, len })
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
