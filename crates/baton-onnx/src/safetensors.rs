//! The safetensors format: a weights-only version's tensors.
//!
//! A safetensors file is an 8-byte little-endian header length `n`, `n`
//! bytes of JSON, then the tensors' bytes. The JSON object maps each
//! tensor's name to its `dtype`, `shape` and `data_offsets` (`[begin, end)`
//! relative to the first byte after the header); an optional
//! `__metadata__` entry maps strings to strings.
//!
//! [`Header::parse`] trusts nothing in the file: the header must be valid
//! JSON of that shape within [`MAX_HEADER`] bytes, each tensor described
//! once with at most [`MAX_RANK`] dimensions, every tensor's byte range
//! must lie inside the file, hold exactly `product(shape) × element size`
//! bytes and overlap no other tensor's, and the tensors must cover the
//! data exactly, with no byte before, between or after them. A file that
//! breaks any of these is refused with a message naming what is wrong;
//! nothing is read past the end of the buffer and no size is trusted
//! before it is checked.
//!
//! The header is parsed here rather than by the `safetensors` crate, whose
//! `SafeTensors::read_metadata` takes the whole file as one slice (it
//! checks the data's length against the slice's): baton reads only the
//! header through the verified file, before anything maps the weights.
//! It also accepts headers of up to 100 MB parsed into a map of shapes of
//! any rank, where this parser stops at 16 MiB and allocates a bounded
//! multiple of the header. The crate is the reference the fuzz target
//! checks this parser against: whatever it refuses, this refuses too.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::proto::elem;

/// The largest header accepted. A tensor's entry takes about 100 bytes,
/// so 16 MiB describes over 150,000 tensors, a hundred times what a large
/// model's file holds; a larger length is a damaged file, not a model.
/// Parsing costs at most about 12 bytes per byte of header.
pub const MAX_HEADER: u64 = 16 << 20;

/// The weights file of a weights-only version.
pub const WEIGHTS_FILE: &str = "weights.safetensors";

/// One tensor as the header describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name.
    pub name: String,
    /// The ONNX element type ([`elem`]) of its dtype.
    pub data_type: i32,
    /// Its dimensions.
    pub dims: Vec<i64>,
    /// Its bytes, as offsets in the whole file.
    pub range: Range<u64>,
}

/// A parsed and checked header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Every tensor, ordered by where its bytes begin.
    pub tensors: Vec<TensorInfo>,
    /// Where the data begins: 8 plus the header's length.
    pub data_start: u64,
    /// The `__metadata__` entries.
    pub metadata: BTreeMap<String, String>,
}

/// Why a safetensors file was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct HeaderError(pub String);

impl Header {
    /// Reads the header from the first bytes of a file of `file_len`
    /// bytes. `prefix` must hold at least the 8 length bytes; when it is
    /// shorter than the header, the error says how many bytes are needed
    /// ([`Header::needed`] reads them first).
    ///
    /// The JSON is read straight into typed descriptions, one entry at a
    /// time, never into a tree of values: what it allocates is bounded by
    /// a small multiple of the header's length, whatever the header holds
    /// (a shape is refused past [`MAX_RANK`] dimensions as it is read).
    pub fn parse(prefix: &[u8], file_len: u64) -> Result<Header, HeaderError> {
        let len = Header::needed(prefix, file_len)?;
        let Some(json) = prefix.get(8..len as usize) else {
            return Err(HeaderError(format!("the header needs {len} bytes but only {} were given", prefix.len())));
        };
        let data_start = len;
        let place = Place { data_start, data_len: file_len - data_start };
        let mut reader = serde_json::Deserializer::from_slice(json);
        let mut header =
            serde::Deserializer::deserialize_any(&mut reader, HeaderVisitor(place)).map_err(|e| refused(&e))?;
        reader.end().map_err(|e| HeaderError(format!("the header is not valid JSON: {e}")))?;
        header.tensors.sort_by_key(|t| (t.range.start, t.range.end));
        for pair in header.tensors.windows(2) {
            if pair[1].range.start < pair[0].range.end {
                return Err(HeaderError(format!("tensors '{}' and '{}' overlap", pair[0].name, pair[1].name)));
            }
        }
        // Every data byte belongs to a tensor: the format has no holes (they
        // could carry another file's content), as the reference reader
        // requires.
        let hole = |from: u64, to: u64| {
            HeaderError(format!("the data bytes [{from}, {to}) belong to no tensor; a safetensors file has no holes"))
        };
        let mut covered = 0;
        for tensor in &header.tensors {
            let begin = tensor.range.start - data_start;
            if begin != covered {
                return Err(hole(covered, begin));
            }
            covered = tensor.range.end - data_start;
        }
        if covered != place.data_len {
            return Err(hole(covered, place.data_len));
        }
        let mut names: Vec<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(HeaderError(format!("tensor '{}' is described twice", pair[0])));
        }
        Ok(header)
    }

    /// How many bytes from the start of the file the header takes (its
    /// 8 length bytes included), checked against the file's length.
    pub fn needed(prefix: &[u8], file_len: u64) -> Result<u64, HeaderError> {
        let Some(bytes) = prefix.get(..8) else {
            return Err(HeaderError(format!("the file has {file_len} bytes, fewer than the 8 of a header length")));
        };
        let mut le = [0u8; 8];
        le.copy_from_slice(bytes);
        let n = u64::from_le_bytes(le);
        if n > MAX_HEADER {
            return Err(HeaderError(format!("the header claims {n} bytes, more than the {MAX_HEADER} accepted")));
        }
        if n + 8 > file_len {
            return Err(HeaderError(format!("the header claims {n} bytes but the file has only {file_len}")));
        }
        Ok(n + 8)
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// The most dimensions a tensor may have: ONNX Runtime's kernels stop at
/// 8, and no weight of a served model has more.
pub const MAX_RANK: usize = 8;

/// A parse error as the refusal says it: a message of ours (a tensor
/// that is wrong) as it is, a syntax error as invalid JSON.
fn refused(e: &serde_json::Error) -> HeaderError {
    match e.classify() {
        serde_json::error::Category::Data => {
            let message = e.to_string();
            // serde_json appends the position to a message of ours.
            HeaderError(message.split(" at line ").next().unwrap_or(&message).to_owned())
        }
        _ => HeaderError(format!("the header is not valid JSON: {e}")),
    }
}

/// Where a file's tensor data lies, to check each tensor against.
#[derive(Clone, Copy)]
struct Place {
    data_start: u64,
    data_len: u64,
}

/// Reads the header's object entry by entry.
struct HeaderVisitor(Place);

impl<'de> serde::de::Visitor<'de> for HeaderVisitor {
    type Value = Header;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the header is not a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Header, A::Error> {
        let mut header = Header { data_start: self.0.data_start, ..Header::default() };
        while let Some(name) = map.next_key::<String>()? {
            if name == "__metadata__" {
                header.metadata = map.next_value::<Metadata>()?.0;
                continue;
            }
            let raw: RawTensor = map.next_value()?;
            header.tensors.push(tensor(name, raw, self.0).map_err(|e| serde::de::Error::custom(e.0))?);
        }
        Ok(header)
    }
}

/// `__metadata__`: strings to strings.
struct Metadata(BTreeMap<String, String>);

impl<'de> serde::Deserialize<'de> for Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Metadata, D::Error> {
        BTreeMap::<String, String>::deserialize(d)
            .map(Metadata)
            .map_err(|_| serde::de::Error::custom("__metadata__ must map strings to strings"))
    }
}

/// One tensor's entry as the file has it, before any check.
#[derive(serde::Deserialize)]
struct RawTensor {
    dtype: Option<String>,
    shape: Option<Dims>,
    data_offsets: Option<Offsets>,
}

/// A shape: at most [`MAX_RANK`] sizes, refused as soon as one more comes.
struct Dims(Vec<u64>);

impl<'de> serde::Deserialize<'de> for Dims {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Dims, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Dims;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a shape: an array of sizes")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Dims, A::Error> {
                let mut dims = Vec::new();
                while let Some(d) = seq.next_element::<serde_json::Number>()? {
                    if dims.len() == MAX_RANK {
                        return Err(serde::de::Error::custom(format!("more than {MAX_RANK} dimensions")));
                    }
                    let size = d
                        .as_u64()
                        .filter(|&d| d <= i64::MAX as u64)
                        .ok_or_else(|| serde::de::Error::custom(format!("dimension {d} is not a size")))?;
                    dims.push(size);
                }
                Ok(Dims(dims))
            }
        }
        d.deserialize_seq(Visitor)
    }
}

/// `data_offsets`: exactly `[begin, end]`.
struct Offsets(u64, u64);

impl<'de> serde::Deserialize<'de> for Offsets {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Offsets, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Offsets;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("data_offsets as [begin, end]")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Offsets, A::Error> {
                let bad = || serde::de::Error::custom("data_offsets must be two byte offsets [begin, end]");
                let begin = seq.next_element::<u64>().map_err(|_| bad())?.ok_or_else(bad)?;
                let end = seq.next_element::<u64>().map_err(|_| bad())?.ok_or_else(bad)?;
                if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    return Err(bad());
                }
                Ok(Offsets(begin, end))
            }
        }
        d.deserialize_seq(Visitor)
    }
}

/// Checks one tensor's entry against the file.
fn tensor(name: String, raw: RawTensor, place: Place) -> Result<TensorInfo, HeaderError> {
    let refuse = |m: String| HeaderError(format!("tensor '{name}': {m}"));
    let dtype = raw.dtype.ok_or_else(|| refuse("no dtype".to_owned()))?;
    let (data_type, size) = dtype_of(&dtype).ok_or_else(|| refuse(format!("dtype {dtype} is not one baton serves")))?;
    let Dims(shape) = raw.shape.ok_or_else(|| refuse("no shape".to_owned()))?;
    let Offsets(begin, end) = raw.data_offsets.ok_or_else(|| refuse("data_offsets must be [begin, end]".to_owned()))?;
    let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    let elements = elements.ok_or_else(|| refuse("its shape overflows".to_owned()))?;
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    if begin > end || end > place.data_len {
        return Err(refuse(format!("its bytes [{begin}, {end}) are not within the {} data bytes", place.data_len)));
    }
    let expected = elements.checked_mul(size).ok_or_else(|| refuse("its size overflows".to_owned()))?;
    if end - begin != expected {
        return Err(refuse(format!("{dtype} {dims:?} needs {expected} bytes, data_offsets give {}", end - begin)));
    }
    let range = place.data_start + begin..place.data_start + end;
    Ok(TensorInfo { name, data_type, dims, range })
}

/// Each safetensors dtype baton serves: its name, ONNX element type and
/// element size.
const DTYPES: [(&str, i32, u64); 12] = [
    ("F32", elem::FLOAT, 4),
    ("F16", elem::FLOAT16, 2),
    ("F64", elem::DOUBLE, 8),
    ("I8", elem::INT8, 1),
    ("U8", elem::UINT8, 1),
    ("I16", elem::INT16, 2),
    ("U16", elem::UINT16, 2),
    ("I32", elem::INT32, 4),
    ("U32", elem::UINT32, 4),
    ("I64", elem::INT64, 8),
    ("U64", elem::UINT64, 8),
    ("BOOL", elem::BOOL, 1),
];

/// The ONNX element type and element size of a safetensors dtype.
fn dtype_of(dtype: &str) -> Option<(i32, u64)> {
    DTYPES.iter().find(|d| d.0 == dtype).map(|d| (d.1, d.2))
}

/// The safetensors dtype of an ONNX element type.
pub fn dtype_name(data_type: i32) -> Option<&'static str> {
    DTYPES.iter().find(|d| d.1 == data_type).map(|d| d.0)
}

/// Writes a safetensors file of `tensors` (name, ONNX element type,
/// dimensions, little-endian bytes), in the order given, the header padded
/// with spaces so that the data starts at a multiple of 8. For tests,
/// benchmarks and `baton package`.
pub fn encode(tensors: &[(&str, i32, &[i64], &[u8])]) -> Result<Vec<u8>, HeaderError> {
    let mut entries = serde_json::Map::new();
    let mut at = 0u64;
    for (name, data_type, dims, bytes) in tensors {
        let dtype = dtype_name(*data_type).ok_or_else(|| HeaderError(format!("'{name}': no safetensors dtype")))?;
        let end = at + bytes.len() as u64;
        entries.insert(
            (*name).to_owned(),
            serde_json::json!({ "dtype": dtype, "shape": dims, "data_offsets": [at, end] }),
        );
        at = end;
    }
    let mut json = serde_json::to_vec(&entries).map_err(|e| HeaderError(e.to_string()))?;
    while (json.len() + 8) % 8 != 0 {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len() + at as usize);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    for (_, _, _, bytes) in tensors {
        out.extend_from_slice(bytes);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str, data: usize) -> Vec<u8> {
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(json.as_bytes());
        out.resize(out.len() + data, 0);
        out
    }

    fn parse(bytes: &[u8]) -> Result<Header, HeaderError> {
        Header::parse(bytes, bytes.len() as u64)
    }

    #[test]
    fn what_is_encoded_parses_back_with_offsets_in_the_file() {
        let (a, b) = ([1u8; 24], [2u8; 8]);
        let bytes = encode(&[("w", elem::FLOAT, &[2, 3], &a), ("b", elem::INT64, &[1], &b)]).unwrap();
        let header = parse(&bytes).unwrap();
        assert_eq!(header.data_start % 8, 0);
        let w = header.get("w").unwrap();
        assert_eq!((w.data_type, w.dims.as_slice()), (elem::FLOAT, &[2i64, 3][..]));
        assert_eq!(&bytes[w.range.start as usize..w.range.end as usize], &a);
        let b_info = header.get("b").unwrap();
        assert_eq!(&bytes[b_info.range.start as usize..b_info.range.end as usize], &b);
        assert_eq!(header.tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["w", "b"]);
    }

    #[test]
    fn damaged_headers_are_refused_with_the_reason() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![1, 2, 3], "fewer than the 8"),
            (u64::MAX.to_le_bytes().to_vec(), "more than the"),
            ((100u64).to_le_bytes().to_vec(), "file has only 8"),
            (file("{not json", 0), "not valid JSON"),
            (file("[1,2]", 0), "not a JSON object"),
            (file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 4), "not within the 4 data bytes"),
            (file(r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, 8), "needs 12 bytes"),
            (
                file(
                    r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                    12,
                ),
                "overlap",
            ),
            (file(r#"{"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,1]}}"#, 1), "not one baton serves"),
            (file(r#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#, 4), "not a size"),
            (file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#, 8), "not within"),
            (
                file(r#"{"w":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,1]}}"#, 1),
                "overflows",
            ),
            (file(r#"{"__metadata__":{"k":1}}"#, 0), "strings to strings"),
            (
                file(r#"{"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}"#, 4),
                "more than 8 dimensions",
            ),
            (file(r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#, 8), "two byte offsets"),
            (file(r#"{"w":{"shape":[1],"data_offsets":[0,4]}}"#, 4), "no dtype"),
            (
                file(
                    r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                    8,
                ),
                "described twice",
            ),
            (file(r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x"#, 4), "not valid JSON"),
            // Bytes no tensor describes: the format has none (they could
            // hide another file's content), and the reference reader
            // refuses them.
            (
                file(
                    r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#,
                    12,
                ),
                "bytes [4, 8) belong to no tensor",
            ),
            (file(r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#, 8), "bytes [0, 4) belong to no tensor"),
            (
                file(r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#, 12),
                "bytes [4, 12) belong to no tensor",
            ),
            (file(r#"{}"#, 1), "bytes [0, 1) belong to no tensor"),
        ];
        for (bytes, expected) in cases {
            let e = parse(&bytes).unwrap_err();
            assert!(e.0.contains(expected), "{expected:?} not in {e}");
        }
    }

    #[test]
    fn metadata_is_kept_and_not_taken_for_a_tensor() {
        let header = parse(&file(r#"{"__metadata__":{"format":"pt"}}"#, 0)).unwrap();
        assert_eq!(header.metadata.get("format").map(String::as_str), Some("pt"));
        assert!(header.tensors.is_empty());
    }
}
