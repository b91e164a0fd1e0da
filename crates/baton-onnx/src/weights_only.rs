//! Weights-only versions: a graph and a safetensors file.
//!
//! A version directory holding `weights.safetensors` is a weights-only
//! version: the graph it uses is its `graph.onnx` (written by `baton
//! package --graph-from`, which takes it from an earlier version or any
//! ONNX file), and every tensor of the weights file replaces the graph's
//! initializer of the same name. Before anything reaches ONNX Runtime,
//! each tensor's name, type and shape are checked against the graph, and
//! the graph is rewritten in memory so that those initializers refer to
//! the tensors' bytes in the weights file, as external data. From there
//! the version loads like any model with external data: staged from the
//! verified files, mapped, shared by the sessions.
//!
//! The graph is shipped in the version rather than referred to in another
//! one: it is a few kilobytes, and a version that depends on no other can
//! be moved, copied and deleted alone.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;

use baton_core::files::verified::{Verified, VerifiedFile};
use baton_core::run::backend::BackendError;

use crate::proto::{self, InitData};
use crate::safetensors::{Header, WEIGHTS_FILE};

/// The graph file of a weights-only version.
pub const GRAPH_FILE: &str = "graph.onnx";

/// The largest graph file read: a graph carries no large weights.
const MAX_GRAPH: u64 = 256 << 20;

/// A weights-only version's graph, ready to load.
pub(crate) struct Graph {
    /// The graph file, as the verify stage opened it.
    pub(crate) file: VerifiedFile,
    /// Its path, for messages.
    pub(crate) name: PathBuf,
    /// The graph with the weights file's tensors as its initializers' data.
    pub(crate) bytes: Vec<u8>,
}

/// The graph of `version` if it is a weights-only version, checked against
/// its weights file and rewritten to use it; `None` for a full model.
pub(crate) fn graph(version: &Verified) -> Result<Option<Graph>, BackendError> {
    let Some(weights) = version.file(WEIGHTS_FILE) else { return Ok(None) };
    let weights_name = version.dir().join(WEIGHTS_FILE);
    let name = version.dir().join(GRAPH_FILE);
    let invalid =
        |kind: &'static str, e: &dyn std::fmt::Display| BackendError::new(kind, format!("{}: {e}", name.display()));
    let file = version.file(GRAPH_FILE).ok_or_else(|| {
        invalid(
            "graph_missing",
            &format!("a version with {WEIGHTS_FILE} needs its graph in {GRAPH_FILE} (see baton package --graph-from)"),
        )
    })?;
    if file.size() > MAX_GRAPH {
        return Err(invalid("model_invalid", &format!("{} bytes is too large for a graph", file.size())));
    }
    let bytes = file.read_all().map_err(|e| invalid("io", &e))?;
    let header = read_header(weights.file(), weights.size())
        .map_err(|e| BackendError::new("weights_invalid", format!("{}: {e}", weights_name.display())))?;
    let model = proto::parse(&bytes).map_err(|e| invalid("model_invalid", &e))?;
    check(&header, &model).map_err(|(tensor, problem)| {
        BackendError::refused_tensor("weights_mismatch", tensor, format!("{}: {problem}", weights_name.display()))
    })?;
    let bytes = pointed(&bytes, &header).map_err(|e| invalid("model_invalid", &e))?;
    Ok(Some(Graph { file: file.clone(), name, bytes }))
}

/// `graph` with the initializers the weights file holds pointed at it.
fn pointed(graph: &[u8], header: &Header) -> Result<Vec<u8>, proto::ProtoError> {
    let placed: HashMap<&str, (u64, u64)> =
        header.tensors.iter().map(|t| (t.name.as_str(), (t.range.start, t.range.end - t.range.start))).collect();
    proto::point_at(graph, WEIGHTS_FILE, &|name| placed.get(name).copied())
}

/// The graph file of a weights-only version, for `baton package
/// --graph-from`: `graph` (a whole ONNX model file, such as an earlier
/// version's `model.onnx`) with every initializer the safetensors file
/// `weights` holds taken from it, after the checks a load makes.
pub fn graph_for_weights(graph: &[u8], weights: &File) -> Result<Vec<u8>, String> {
    let len = weights.metadata().map_err(|e| e.to_string())?.len();
    let header = read_header(weights, len)?;
    let model = proto::parse(graph).map_err(|e| e.to_string())?;
    check(&header, &model).map_err(|(_, problem)| problem)?;
    pointed(graph, &header).map_err(|e| e.to_string())
}

/// Reads and checks the header of a weights file of `len` bytes.
fn read_header(weights: &File, len: u64) -> Result<Header, String> {
    let mut prefix = vec![0u8; 8.min(len as usize)];
    baton_core::files::short_reads::read_exact_at(weights, &mut prefix, 0).map_err(|e| e.to_string())?;
    let needed = Header::needed(&prefix, len).map_err(|e| e.to_string())?;
    prefix.resize(needed as usize, 0);
    baton_core::files::short_reads::read_exact_at(weights, &mut prefix, 0).map_err(|e| e.to_string())?;
    Header::parse(&prefix, len).map_err(|e| e.to_string())
}

/// Every tensor of the weights file must be an initializer of the graph
/// with the same type and shape, and every initializer of the graph must
/// have data: its own, or a tensor of the weights file. `Err` names the
/// tensor and says what disagrees.
fn check(header: &Header, model: &proto::OnnxModel) -> Result<(), (String, String)> {
    let graph: HashMap<&str, &proto::Initializer> = model.initializers.iter().map(|i| (i.name.as_str(), i)).collect();
    for tensor in &header.tensors {
        let name = tensor.name.clone();
        let Some(init) = graph.get(tensor.name.as_str()) else {
            return Err((name, format!("tensor '{}' is not an initializer of the graph", tensor.name)));
        };
        if init.data_type != tensor.data_type {
            let (file, graph) = (type_name(tensor.data_type), type_name(init.data_type));
            return Err((
                name,
                format!("tensor '{}' is {file} in the weights file but {graph} in the graph", tensor.name),
            ));
        }
        if init.dims != tensor.dims {
            return Err((
                name,
                format!(
                    "tensor '{}' has shape {:?} in the weights file but {:?} in the graph",
                    tensor.name, tensor.dims, init.dims
                ),
            ));
        }
    }
    for init in &model.initializers {
        let empty = match &init.data {
            InitData::Raw(range) => range.is_empty() && init.dims.iter().product::<i64>() != 0,
            InitData::Inline(bytes) => {
                bytes.is_empty() && proto::elem_size(init.data_type).is_some() && init.dims.iter().product::<i64>() != 0
            }
            InitData::External { location, .. } => location == WEIGHTS_FILE,
        };
        if empty && header.get(&init.name).is_none() {
            return Err((
                init.name.clone(),
                format!("initializer '{}' of the graph has no data and is not in the weights file", init.name),
            ));
        }
    }
    Ok(())
}

fn type_name(data_type: i32) -> String {
    crate::safetensors::dtype_name(data_type).map_or_else(|| format!("ONNX type {data_type}"), str::to_owned)
}
