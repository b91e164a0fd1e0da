//! Protobuf wire-format primitives: a bounds-checked cursor, decoded field values,
//! and the two writers the rewrite in `externalize` needs.

use std::ops::Range;

use super::{ProtoError, Result};

/// One decoded field value.
#[derive(Clone, Debug)]
pub(super) enum Val {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(Range<usize>),
    Fixed32([u8; 4]),
}

impl Val {
    fn wire(&self) -> u8 {
        match self {
            Val::Varint(_) => 0,
            Val::Fixed64(_) => 1,
            Val::Bytes(_) => 2,
            Val::Fixed32(_) => 5,
        }
    }

    fn bad(&self, field: u32, ctx: &str, expected: &'static str) -> ProtoError {
        let (context, wire_type) = (ctx.to_string(), self.wire());
        ProtoError::BadWireType { context, field, wire_type, expected }
    }

    pub(super) fn varint(self, field: u32, ctx: &str) -> Result<u64> {
        match self {
            Val::Varint(v) => Ok(v),
            other => Err(other.bad(field, ctx, "varint (0)")),
        }
    }

    pub(super) fn bytes(self, field: u32, ctx: &str) -> Result<Range<usize>> {
        match self {
            Val::Bytes(r) => Ok(r),
            other => Err(other.bad(field, ctx, "length-delimited (2)")),
        }
    }
}

/// A cursor over `buf[pos..end]`; ranges it hands out index the whole `buf`.
pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
    pub(super) end: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0, end: buf.len() }
    }

    /// A reader over a sub-range previously returned by this reader.
    pub(super) fn sub(&self, r: Range<usize>) -> Reader<'a> {
        let end = r.end.min(self.buf.len());
        Reader { buf: self.buf, pos: r.start.min(end), end }
    }

    fn truncated(ctx: &str) -> ProtoError {
        ProtoError::Truncated { context: ctx.to_string() }
    }

    pub(super) fn varint(&mut self, ctx: &str) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = match self.buf.get(self.pos) {
                Some(&b) if self.pos < self.end => b,
                _ => return Err(Self::truncated(ctx)),
            };
            self.pos += 1;
            if i == 9 && b > 1 {
                return Err(ProtoError::Malformed(format!("varint overflows 64 bits in {ctx}")));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ProtoError::Malformed(format!("varint longer than 10 bytes in {ctx}")))
    }

    fn take(&mut self, n: usize, ctx: &str) -> Result<Range<usize>> {
        if n > self.end.saturating_sub(self.pos) {
            return Err(Self::truncated(ctx));
        }
        self.pos += n;
        Ok(self.pos - n..self.pos)
    }

    fn take_array<const N: usize>(&mut self, ctx: &str) -> Result<[u8; N]> {
        let r = self.take(N, ctx)?;
        self.buf.get(r).and_then(|s| s.try_into().ok()).ok_or_else(|| Self::truncated(ctx))
    }

    /// The next field, or `None` at the end of the message. Consumes the value.
    pub(super) fn next(&mut self, ctx: &str) -> Result<Option<(u32, Val)>> {
        if self.pos >= self.end {
            return Ok(None);
        }
        let key = self.varint(ctx)?;
        let field = u32::try_from(key >> 3).unwrap_or(0);
        if field == 0 || field >= 1 << 29 {
            return Err(ProtoError::Malformed(format!("invalid field number {} in {ctx}", key >> 3)));
        }
        let val = match key & 7 {
            0 => Val::Varint(self.varint(ctx)?),
            1 => Val::Fixed64(self.take_array(ctx)?),
            2 => {
                let len = self.varint(ctx)?;
                let len = usize::try_from(len).map_err(|_| Self::truncated(ctx))?;
                Val::Bytes(self.take(len, ctx)?)
            }
            5 => Val::Fixed32(self.take_array(ctx)?),
            w => {
                let what = if w == 3 || w == 4 { "groups are not supported" } else { "invalid" };
                return Err(ProtoError::Malformed(format!("wire type {w} ({what}) for field {field} in {ctx}")));
            }
        };
        Ok(Some((field, val)))
    }

    pub(super) fn string(&self, v: Val, field: u32, ctx: &str) -> Result<String> {
        let r = v.bytes(field, ctx)?;
        let bytes = self.buf.get(r).ok_or_else(|| Self::truncated(ctx))?;
        String::from_utf8(bytes.to_vec()).map_err(|_| ProtoError::InvalidUtf8 { context: ctx.to_string(), field })
    }

    /// A repeated varint field, packed or not.
    pub(super) fn varints(&self, v: Val, field: u32, ctx: &str, out: &mut Vec<u64>) -> Result<()> {
        match v {
            Val::Varint(x) => out.push(x),
            Val::Bytes(r) => {
                let mut p = self.sub(r);
                while p.pos < p.end {
                    out.push(p.varint(ctx)?);
                }
            }
            other => return Err(other.bad(field, ctx, "varint or packed")),
        }
        Ok(())
    }

    /// A repeated fixed-width field (float or double), packed or not, as raw LE bytes.
    pub(super) fn fixed(&self, v: Val, field: u32, ctx: &str, width: usize, out: &mut Vec<u8>) -> Result<()> {
        match (v, width) {
            (Val::Fixed32(b), 4) => out.extend_from_slice(&b),
            (Val::Fixed64(b), 8) => out.extend_from_slice(&b),
            (Val::Bytes(r), _) => {
                let bytes = self.buf.get(r).ok_or_else(|| Self::truncated(ctx))?;
                if bytes.len() % width != 0 {
                    let n = bytes.len();
                    let msg = format!("packed field {field} of {ctx}: {n} bytes is not a multiple of {width}");
                    return Err(ProtoError::Malformed(msg));
                }
                out.extend_from_slice(bytes);
            }
            (other, _) => return Err(other.bad(field, ctx, "fixed-width or packed")),
        }
        Ok(())
    }
}

/// Appends `v` as a varint.
pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a length-delimited field.
pub(super) fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_varint(out, u64::from(field) << 3 | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}
