//! A small hand-written reader for the protobuf wire format, covering only the parts of
//! ONNX's `onnx.proto` that baton needs: graph inputs/outputs, initializers, and the
//! nodes' operators, inputs, outputs and a few attributes.
//!
//! The reader never panics on malformed input: every length is checked against the bytes
//! that remain, and unknown fields of every wire type are skipped.

use std::collections::HashSet;
use std::fs::File;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

/// Element types of onnx TensorProto.DataType that we name.
pub mod elem {
    /// 32-bit IEEE float.
    pub const FLOAT: i32 = 1;
    /// Unsigned 8-bit integer.
    pub const UINT8: i32 = 2;
    /// Signed 8-bit integer.
    pub const INT8: i32 = 3;
    /// Unsigned 16-bit integer.
    pub const UINT16: i32 = 4;
    /// Signed 16-bit integer.
    pub const INT16: i32 = 5;
    /// Signed 32-bit integer.
    pub const INT32: i32 = 6;
    /// Signed 64-bit integer.
    pub const INT64: i32 = 7;
    /// Variable-length string.
    pub const STRING: i32 = 8;
    /// Boolean, one byte per element.
    pub const BOOL: i32 = 9;
    /// 16-bit IEEE float.
    pub const FLOAT16: i32 = 10;
    /// 64-bit IEEE float.
    pub const DOUBLE: i32 = 11;
    /// Unsigned 32-bit integer.
    pub const UINT32: i32 = 12;
    /// Unsigned 64-bit integer.
    pub const UINT64: i32 = 13;
}

/// bfloat16; not named in [`elem`] but sized and decoded like FLOAT16.
const BFLOAT16: i32 = 16;

/// What baton reads from an ONNX ModelProto.
#[derive(Clone, Debug, PartialEq)]
pub struct OnnxModel {
    /// ModelProto.ir_version.
    pub ir_version: i64,
    /// Graph inputs, excluding those that are also initializers (old IR versions).
    pub graph_inputs: Vec<ValueInfo>,
    /// Graph outputs.
    pub graph_outputs: Vec<ValueInfo>,
    /// Graph initializers (weights).
    pub initializers: Vec<Initializer>,
    /// Graph nodes, followed by those of the subgraphs they hold.
    pub nodes: Vec<Node>,
}

/// A graph input or output.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueInfo {
    /// Value name.
    pub name: String,
    /// Element type (see [`elem`]); 0 when the type is not a tensor or not given.
    pub elem_type: i32,
    /// Shape: `dim_value`, or -1 for `dim_param` / unknown; `None` if no shape is given.
    pub dims: Option<Vec<i64>>,
}

/// A graph initializer (TensorProto).
#[derive(Clone, Debug, PartialEq)]
pub struct Initializer {
    /// Tensor name.
    pub name: String,
    /// Element type (see [`elem`]).
    pub data_type: i32,
    /// Tensor dimensions.
    pub dims: Vec<i64>,
    /// Where the tensor's data lives.
    pub data: InitData,
}

/// Where an initializer's data lives.
#[derive(Clone, Debug, PartialEq)]
pub enum InitData {
    /// raw_data field: byte range inside the model file bytes passed to [`parse`].
    Raw(Range<usize>),
    /// Typed repeated fields (float_data, int32_data, int64_data, double_data, uint64_data)
    /// decoded to little-endian bytes of the tensor's element type. Empty for STRING tensors
    /// and for element types this reader does not size.
    Inline(Vec<u8>),
    /// data_location == EXTERNAL.
    External {
        /// File path relative to the model's directory.
        location: String,
        /// Byte offset in the file (default 0).
        offset: u64,
        /// Byte length (default: to the end of the file).
        length: Option<u64>,
    },
}

/// Errors from reading an ONNX model.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The input ended in the middle of a value.
    #[error("truncated protobuf data in {context}")]
    Truncated {
        /// The message or field being read.
        context: String,
    },
    /// A known field arrived with a wire type it cannot have.
    #[error("field {field} of {context} has wire type {wire_type}, expected {expected}")]
    BadWireType {
        /// The message being read.
        context: String,
        /// Field number.
        field: u32,
        /// Wire type found.
        wire_type: u8,
        /// Wire type expected.
        expected: &'static str,
    },
    /// A string field is not valid UTF-8.
    #[error("invalid UTF-8 in field {field} of {context}")]
    InvalidUtf8 {
        /// The message being read.
        context: String,
        /// Field number.
        field: u32,
    },
    /// The data is structurally wrong.
    #[error("malformed ONNX model: {0}")]
    Malformed(String),
    /// Valid, but something baton does not handle.
    #[error("unsupported ONNX content: {0}")]
    Unsupported(String),
    /// Reading the model file, or a tensor's data from it, failed.
    #[error("cannot read {what}: {source}")]
    Read {
        /// What was being read.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Reading an external data file failed.
    #[error("cannot read external data file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, ProtoError>;

/// Messages nested deeper than this (subgraphs in subgraphs) are refused
/// rather than followed: each level takes stack, and a megabyte of nesting
/// would overflow a thread's.
const MAX_DEPTH: usize = 64;

mod externalize;
mod nested;
mod node;
mod skeleton;
mod wire;

pub use externalize::{Externalized, FileLength, Move, Origin, Placement, externalize, point_at};
pub use nested::nested_external_data;
pub use node::Node;
pub use skeleton::read_skeleton;

use wire::Reader;

#[cfg(test)]
mod tests;

/// Parses the parts of an ONNX ModelProto that baton needs.
pub fn parse(bytes: &[u8]) -> Result<OnnxModel> {
    let mut r = Reader::new(bytes);
    let mut model = OnnxModel {
        ir_version: 0,
        graph_inputs: Vec::new(),
        graph_outputs: Vec::new(),
        initializers: Vec::new(),
        nodes: Vec::new(),
    };
    let mut has_graph = false;
    const CTX: &str = "ModelProto";
    while let Some((f, v)) = r.next(CTX)? {
        match f {
            1 => model.ir_version = v.varint(f, CTX)? as i64,
            // A repeated singular message merges; for our repeated fields that means appending.
            7 => {
                let g = r.sub(v.bytes(f, CTX)?);
                parse_graph(g, &mut model)?;
                has_graph = true;
            }
            _ => {}
        }
    }
    if !has_graph {
        return Err(ProtoError::Malformed("ModelProto has no graph (field 7)".into()));
    }
    let names: HashSet<&str> = model.initializers.iter().map(|i| i.name.as_str()).collect();
    model.graph_inputs.retain(|v| !names.contains(v.name.as_str()));
    Ok(model)
}

fn parse_graph(mut r: Reader<'_>, model: &mut OnnxModel) -> Result<()> {
    const CTX: &str = "GraphProto";
    let mut nested = Vec::new();
    while let Some((f, v)) = r.next(CTX)? {
        match f {
            1 => {
                let idx = model.nodes.len();
                model.nodes.push(node::parse_node(r.sub(v.bytes(f, CTX)?), idx, &mut nested, 0)?);
            }
            5 => {
                let idx = model.initializers.len();
                let what = format!("initializer #{idx}");
                model.initializers.push(parse_tensor(r.sub(v.bytes(f, CTX)?), &what)?);
            }
            11 => {
                let idx = model.graph_inputs.len();
                let vi = parse_value_info(r.sub(v.bytes(f, CTX)?), "graph input", idx)?;
                model.graph_inputs.push(vi);
            }
            12 => {
                let idx = model.graph_outputs.len();
                let vi = parse_value_info(r.sub(v.bytes(f, CTX)?), "graph output", idx)?;
                model.graph_outputs.push(vi);
            }
            _ => {}
        }
    }
    model.nodes.append(&mut nested);
    Ok(())
}

fn parse_value_info(mut r: Reader<'_>, what: &str, idx: usize) -> Result<ValueInfo> {
    let mut ctx = format!("{what} #{idx}");
    let mut vi = ValueInfo { name: String::new(), elem_type: 0, dims: None };
    while let Some((f, v)) = r.next(&ctx)? {
        match f {
            1 => {
                vi.name = r.string(v, f, &ctx)?;
                ctx = format!("{what} '{}'", vi.name);
            }
            2 => {
                // TypeProto: only tensor_type (1) matters.
                let mut t = r.sub(v.bytes(f, &ctx)?);
                while let Some((f, v)) = t.next(&ctx)? {
                    if f == 1 {
                        parse_tensor_type(t.sub(v.bytes(f, &ctx)?), &ctx, &mut vi)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(vi)
}

fn parse_tensor_type(mut r: Reader<'_>, ctx: &str, vi: &mut ValueInfo) -> Result<()> {
    while let Some((f, v)) = r.next(ctx)? {
        match f {
            1 => vi.elem_type = v.varint(f, ctx)? as i32,
            2 => {
                // TensorShapeProto: repeated Dimension dim = 1.
                let dims = vi.dims.get_or_insert_with(Vec::new);
                let mut s = r.sub(v.bytes(f, ctx)?);
                while let Some((f, v)) = s.next(ctx)? {
                    if f != 1 {
                        continue;
                    }
                    let mut d = s.sub(v.bytes(f, ctx)?);
                    let mut dim = -1;
                    while let Some((f, v)) = d.next(ctx)? {
                        match f {
                            1 => dim = v.varint(f, ctx)? as i64,
                            2 => dim = d.string(v, f, ctx).map(|_| -1)?,
                            _ => {}
                        }
                    }
                    dims.push(dim);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Which typed repeated field carries a data type's values.
#[derive(Clone, Copy, PartialEq)]
enum Src {
    Float,
    Int32,
    Int64,
    Double,
    Uint64,
    None,
}

/// Parses a TensorProto; `what` names it in errors until its name is read.
fn parse_tensor(mut r: Reader<'_>, what: &str) -> Result<Initializer> {
    let mut ctx = what.to_owned();
    let (mut name, mut data_type, mut dims) = (String::new(), 0i32, Vec::new());
    let (mut floats, mut doubles) = (Vec::new(), Vec::new());
    let (mut i32s, mut i64s, mut u64s) = (Vec::new(), Vec::new(), Vec::new());
    let (mut raw, mut strings, mut ext, mut location) = (None, false, Vec::new(), 0u64);
    while let Some((f, v)) = r.next(&ctx)? {
        match f {
            1 => r.varints(v, f, &ctx, &mut dims)?,
            2 => data_type = v.varint(f, &ctx)? as i32,
            4 => r.fixed(v, f, &ctx, 4, &mut floats)?,
            5 => r.varints(v, f, &ctx, &mut i32s)?,
            6 => {
                v.bytes(f, &ctx)?;
                strings = true;
            }
            7 => r.varints(v, f, &ctx, &mut i64s)?,
            8 => {
                name = r.string(v, f, &ctx)?;
                if !name.is_empty() {
                    ctx = format!("initializer '{name}'");
                }
            }
            9 => raw = Some(v.bytes(f, &ctx)?),
            10 => r.fixed(v, f, &ctx, 8, &mut doubles)?,
            11 => r.varints(v, f, &ctx, &mut u64s)?,
            13 => {
                let mut e = r.sub(v.bytes(f, &ctx)?);
                let (mut key, mut value) = (String::new(), String::new());
                while let Some((f, v)) = e.next(&ctx)? {
                    match f {
                        1 => key = e.string(v, f, &ctx)?,
                        2 => value = e.string(v, f, &ctx)?,
                        _ => {}
                    }
                }
                ext.push((key, value));
            }
            14 => location = v.varint(f, &ctx)?,
            _ => {}
        }
    }
    let dims = dims.into_iter().map(|d| d as i64).collect();
    let data = if location == 1 {
        let (mut loc, mut offset, mut length) = (None, 0, None);
        for (k, v) in ext {
            let num = |v: &str| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| ProtoError::Malformed(format!("{ctx}: external data {k} '{v}' is not a number")))
            };
            match k.as_str() {
                "offset" => offset = num(&v)?,
                "length" => length = Some(num(&v)?),
                "location" => loc = Some(v),
                _ => {}
            }
        }
        let location =
            loc.ok_or_else(|| ProtoError::Malformed(format!("{ctx}: external data without a 'location' key")))?;
        InitData::External { location, offset, length }
    } else if let Some(range) = raw {
        InitData::Raw(range)
    } else {
        use elem::*;
        let src = match data_type {
            FLOAT => Src::Float,
            DOUBLE => Src::Double,
            INT32 | INT16 | UINT16 | FLOAT16 | BFLOAT16 | INT8 | UINT8 | BOOL => Src::Int32,
            INT64 => Src::Int64,
            UINT32 | UINT64 => Src::Uint64,
            _ => Src::None,
        };
        let present = [
            (Src::Float, !floats.is_empty(), "float_data"),
            (Src::Int32, !i32s.is_empty(), "int32_data"),
            (Src::Int64, !i64s.is_empty(), "int64_data"),
            (Src::Double, !doubles.is_empty(), "double_data"),
            (Src::Uint64, !u64s.is_empty(), "uint64_data"),
            (Src::None, strings && data_type != STRING, "string_data"),
        ];
        let known = src != Src::None || data_type == STRING;
        if let Some((_, _, field)) = present.iter().find(|(s, p, _)| *p && *s != src && known) {
            let msg = format!("{ctx}: data_type {data_type} cannot carry {field}");
            return Err(ProtoError::Malformed(msg));
        }
        let le = |vals: Vec<u64>, width: usize| -> Vec<u8> {
            vals.iter().flat_map(|v| v.to_le_bytes().into_iter().take(width)).collect()
        };
        InitData::Inline(match src {
            Src::Float => floats,
            Src::Double => doubles,
            // Each int32_data element narrowed (or widened) to the tensor's element width;
            // taking the low little-endian bytes of the u64 does both.
            Src::Int32 => le(i32s, elem_size(data_type).unwrap_or(4)),
            Src::Int64 => le(i64s, 8),
            Src::Uint64 => le(u64s, elem_size(data_type).unwrap_or(8)),
            Src::None => Vec::new(),
        })
    };
    Ok(Initializer { name, data_type, dims, data })
}

/// Size in bytes of one element of `data_type`, or `None` for STRING and unnamed types
/// (BFLOAT16 is also sized, as 2).
pub fn elem_size(data_type: i32) -> Option<usize> {
    use elem::*;
    Some(match data_type {
        UINT8 | INT8 | BOOL => 1,
        UINT16 | INT16 | FLOAT16 | BFLOAT16 => 2,
        FLOAT | INT32 | UINT32 => 4,
        INT64 | DOUBLE | UINT64 => 8,
        _ => return None,
    })
}

/// Where the `raw_data` payloads of a parsed model are.
#[derive(Clone, Copy, Debug)]
pub enum RawData<'a> {
    /// In the bytes given to [`parse`]: the whole model file.
    InBytes(&'a [u8]),
    /// In the model file, at the ranges [`parse`] reported: the bytes given
    /// to it came from [`read_skeleton`].
    InFile(&'a File),
}

/// Where [`initializer_bytes`] finds external data files.
#[derive(Clone, Copy)]
pub enum ExternalFiles<'a> {
    /// Opened by path, relative to the model's directory (symlinks followed).
    Dir(&'a Path),
    /// Already open, looked up by the location as the model writes it;
    /// `None` for a location that names no such file.
    Open(&'a dyn Fn(&str) -> Option<&'a File>),
}

impl<'a> From<&'a Path> for ExternalFiles<'a> {
    fn from(dir: &'a Path) -> Self {
        ExternalFiles::Dir(dir)
    }
}

impl std::fmt::Debug for ExternalFiles<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExternalFiles::Dir(dir) => f.debug_tuple("Dir").field(dir).finish(),
            ExternalFiles::Open(_) => f.write_str("Open(..)"),
        }
    }
}

/// Returns the tensor's little-endian element bytes, checking that the length equals
/// product(dims) × element size. Data read from a file (`raw` in a file, external data)
/// goes into `scratch`, which can be reused for the next tensor. External data is found
/// through `external`; locations that are absolute or contain a `..` component are
/// rejected. STRING tensors and element types without an [`elem_size`] return
/// [`ProtoError::Unsupported`] ("string tensors not supported for validation").
pub fn initializer_bytes<'a, 'f>(
    init: &'a Initializer,
    raw: RawData<'a>,
    external: impl Into<ExternalFiles<'f>>,
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8]> {
    let external = external.into();
    let what = format!("initializer '{}'", init.name);
    let dt = init.data_type;
    if dt == elem::STRING {
        let msg = format!("{what}: string tensors not supported for validation");
        return Err(ProtoError::Unsupported(msg));
    }
    let size = elem_size(dt)
        .ok_or_else(|| ProtoError::Unsupported(format!("{what}: data type {dt} not supported for validation")))?;
    let expected = init
        .dims
        .iter()
        .try_fold(size, |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
        .ok_or_else(|| ProtoError::Malformed(format!("{what}: invalid dims {:?}", init.dims)))?;
    let outside =
        |r: &Range<usize>| ProtoError::Malformed(format!("{what}: raw_data range {r:?} is outside the model"));
    let bytes: &[u8] = match (&init.data, raw) {
        (InitData::Raw(r), RawData::InBytes(model_bytes)) => model_bytes.get(r.clone()).ok_or_else(|| outside(r))?,
        (InitData::Raw(r), RawData::InFile(file)) => {
            // [`parse`] checked the range against the file's length.
            let offset = u64::try_from(r.start).map_err(|_| outside(r))?;
            let what = format!("the data of {what} from the model file");
            read_at(file, offset, r.len(), scratch).map_err(|source| ProtoError::Read { what, source })?;
            scratch
        }
        (InitData::Inline(v), _) => v,
        (InitData::External { location, offset, length }, _) => {
            read_external(&what, location, *offset, *length, external, expected, scratch)?;
            scratch
        }
    };
    if bytes.len() != expected {
        let (n, dims) = (bytes.len(), &init.dims);
        let msg = format!("{what}: has {n} bytes of data, dims {dims:?} of type {dt} need {expected}");
        return Err(ProtoError::Malformed(msg));
    }
    Ok(bytes)
}

/// An external data location as a `/`-separated path relative to the
/// model's directory (`./` parts dropped), or `None` when it is not a plain
/// relative path that stays inside that directory: empty, absolute, a drive
/// or share, or with a `..` part.
pub fn relative_location(loc: &str) -> Option<String> {
    let parts: Vec<&str> = loc.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    (location_ok(loc) && !parts.is_empty()).then(|| parts.join("/"))
}

/// Whether an external data location is a plain relative path that stays in the model dir.
fn location_ok(loc: &str) -> bool {
    let drive = loc.as_bytes().get(1) == Some(&b':');
    let bad = loc.is_empty()
        || drive
        || loc.starts_with(['/', '\\'])
        || loc.contains('\0')
        || loc.split(['/', '\\']).any(|s| s == "..");
    !bad && Path::new(loc).components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

fn read_external(
    what: &str,
    location: &str,
    offset: u64,
    length: Option<u64>,
    external: ExternalFiles<'_>,
    expected: usize,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    if !location_ok(location) {
        let msg =
            format!("{what}: external data location '{location}' must be a relative path inside the model directory");
        return Err(ProtoError::Malformed(msg));
    }
    let opened;
    let (path, file) = match external {
        ExternalFiles::Dir(dir) => {
            let path = dir.join(location);
            opened = File::open(&path).map_err(|source| ProtoError::Io { path: path.clone(), source })?;
            (path, &opened)
        }
        ExternalFiles::Open(find) => {
            let file = find(location).ok_or_else(|| {
                ProtoError::Malformed(format!("{what}: external data location '{location}' names no file of the model"))
            })?;
            (PathBuf::from(location), file)
        }
    };
    let io = |source| ProtoError::Io { path: path.clone(), source };
    let file_len = file.metadata().map_err(io)?.len();
    let len = length.unwrap_or(file_len.saturating_sub(offset));
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        let msg =
            format!("{what}: external data {location} offset {offset} length {len} is past its end ({file_len} bytes)");
        return Err(ProtoError::Malformed(msg));
    }
    if len != expected as u64 {
        let msg = format!("{what}: external data has {len} bytes, its dims and type need {expected}");
        return Err(ProtoError::Malformed(msg));
    }
    read_at(file, offset, expected, scratch).map_err(io)
}

/// Reads `len` bytes of `file` at `offset` into `scratch`, replacing what it
/// held, in pieces: a tensor read in one call would keep the loading thread
/// on its CPU for milliseconds ([`baton_core::files::short_reads`]).
fn read_at(file: &File, offset: u64, len: usize, scratch: &mut Vec<u8>) -> std::io::Result<()> {
    scratch.clear();
    scratch.resize(len, 0);
    baton_core::files::short_reads::read_exact_at(file, scratch, offset)
}
