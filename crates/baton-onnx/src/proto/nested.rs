//! External data anywhere but in the graph's own initializers.
//!
//! baton checks, copies and validates the external data of the main graph's
//! initializers ([`parse`](super::parse) reads those). A tensor elsewhere —
//! a node attribute, a subgraph of an `If` or `Loop`, a sparse
//! initializer, a function, training information — could also name an
//! external file, which ONNX Runtime would then read by itself, relative to
//! wherever it was told the model lies. [`nested_external_data`] finds such a
//! tensor so that the backend can refuse the model before ONNX Runtime sees
//! it.

use super::wire::{Reader, Val};
use super::{MAX_DEPTH, ProtoError, Result};

/// TensorProto.data_location, which ONNX Runtime reads to decide.
const DATA_LOCATION: u32 = 14;
const EXTERNAL: u64 = 1;

/// The name of the first tensor outside the main graph's initializers
/// that keeps its data in an external file, if any. `bytes` is a whole
/// model file or its [skeleton](super::read_skeleton).
pub fn nested_external_data(bytes: &[u8]) -> Result<Option<String>> {
    let mut r = Reader::new(bytes);
    while let Some((f, v)) = r.next("ModelProto")? {
        let found = match (f, v) {
            (7, Val::Bytes(g)) => graph(r.sub(g), true, 0)?,
            // FunctionProto
            (25, Val::Bytes(g)) => function(r.sub(g), 0)?,
            // TrainingInfoProto: initialization (1) and algorithm (2) graphs.
            (20, Val::Bytes(t)) => each(r.sub(t), "TrainingInfoProto", 0, |f, sub, depth| match f {
                1 | 2 => graph(sub, false, depth),
                _ => Ok(None),
            })?,
            _ => None,
        };
        if found.is_some() {
            return Ok(found);
        }
    }
    Ok(None)
}

/// Calls `visit` with every length-delimited field of the message in `r`
/// until one finds something.
fn each(
    mut r: Reader<'_>,
    ctx: &str,
    depth: usize,
    mut visit: impl FnMut(u32, Reader<'_>, usize) -> Result<Option<String>>,
) -> Result<Option<String>> {
    if depth > MAX_DEPTH {
        return Err(ProtoError::Unsupported(format!("{ctx} nested more than {MAX_DEPTH} deep")));
    }
    while let Some((f, v)) = r.next(ctx)? {
        if let Val::Bytes(range) = v
            && let Some(found) = visit(f, r.sub(range), depth + 1)?
        {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// GraphProto: nodes (1), initializers (5) unless `main`, sparse initializers (15).
fn graph(r: Reader<'_>, main: bool, depth: usize) -> Result<Option<String>> {
    each(r, "GraphProto", depth, |f, sub, depth| match f {
        1 => node(sub, depth),
        5 if !main => tensor(sub),
        15 => sparse(sub),
        _ => Ok(None),
    })
}

/// FunctionProto: nodes (7), attribute defaults (11).
fn function(r: Reader<'_>, depth: usize) -> Result<Option<String>> {
    each(r, "FunctionProto", depth, |f, sub, depth| match f {
        7 => node(sub, depth),
        11 => attribute(sub, depth),
        _ => Ok(None),
    })
}

/// NodeProto: attributes (5).
fn node(r: Reader<'_>, depth: usize) -> Result<Option<String>> {
    each(r, "NodeProto", depth, |f, sub, depth| if f == 5 { attribute(sub, depth) } else { Ok(None) })
}

/// AttributeProto: t (5), g (6), tensors (10), graphs (11), sparse_tensor (22), sparse_tensors (23).
fn attribute(r: Reader<'_>, depth: usize) -> Result<Option<String>> {
    each(r, "AttributeProto", depth, |f, sub, depth| match f {
        5 | 10 => tensor(sub),
        6 | 11 => graph(sub, false, depth),
        22 | 23 => sparse(sub),
        _ => Ok(None),
    })
}

/// SparseTensorProto: values (1) and indices (2).
fn sparse(r: Reader<'_>) -> Result<Option<String>> {
    each(r, "SparseTensorProto", 0, |f, sub, _| if f == 1 || f == 2 { tensor(sub) } else { Ok(None) })
}

/// TensorProto: its name (8) if it has external data.
fn tensor(mut r: Reader<'_>) -> Result<Option<String>> {
    const CTX: &str = "TensorProto";
    let (mut name, mut external) = (String::new(), false);
    while let Some((f, v)) = r.next(CTX)? {
        match f {
            8 => name = r.string(v, f, CTX)?,
            DATA_LOCATION => external = v.varint(f, CTX)? == EXTERNAL,
            _ => {}
        }
    }
    Ok(external.then(|| if name.is_empty() { "(unnamed)".to_owned() } else { name }))
}
