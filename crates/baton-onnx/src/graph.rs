//! What an ONNX graph says of its tensors, for the engine-agnostic core:
//! the role of each weight ([`WeightRole`]), told from the operators that
//! consume it, and the values each integer input may take
//! ([`ranges`](Graph::input_ranges)), told from where it is used as an index.
//!
//! Both follow a value from the tensor or input it starts at through the
//! operators that only move, reshape or convert it (a transpose, a cast, a
//! slice) to the operators that use it. The operator tables below name the
//! standard ONNX operators and the fused ones ONNX Runtime's tools write.

mod ranges;

use std::collections::{HashMap, HashSet};

use baton_core::run::backend::WeightRole;

use crate::proto::{Initializer, Node, OnnxModel};

/// A model's graph, indexed by value name.
pub(crate) struct Graph<'m> {
    nodes: &'m [Node],
    /// Who reads each value: (node index, input slot).
    consumers: HashMap<&'m str, Vec<(usize, usize)>>,
    /// Initializers and `Constant` node values, by name.
    constants: HashMap<&'m str, &'m Initializer>,
}

impl<'m> Graph<'m> {
    /// Indexes `model`.
    pub(crate) fn new(model: &'m OnnxModel) -> Graph<'m> {
        let mut consumers: HashMap<&str, Vec<(usize, usize)>> = HashMap::new();
        for (index, node) in model.nodes.iter().enumerate() {
            for (slot, input) in node.inputs.iter().enumerate().filter(|(_, i)| !i.is_empty()) {
                consumers.entry(input.as_str()).or_default().push((index, slot));
            }
        }
        let constants = model
            .initializers
            .iter()
            .chain(model.nodes.iter().filter_map(|n| n.constant.as_ref()))
            .map(|t| (t.name.as_str(), t))
            .collect();
        Graph { nodes: &model.nodes, consumers, constants }
    }

    /// What the tensor `name` is for: [`WeightRole::Compute`] when it
    /// reaches a parameter input of a computing operator ([`is_parameter`])
    /// through operators that only move or convert it ([`moves_values`]).
    pub(crate) fn role(&self, name: &str) -> WeightRole {
        let mut seen = HashSet::new();
        let mut queue = vec![name];
        while let Some(value) = queue.pop() {
            if !seen.insert(value) {
                continue;
            }
            for &(index, slot) in self.consumers.get(value).into_iter().flatten() {
                let node = &self.nodes[index];
                if is_parameter(&node.op_type, slot) {
                    return WeightRole::Compute;
                }
                if moves_values(node, slot) {
                    queue.extend(node.outputs.iter().map(String::as_str));
                }
            }
        }
        WeightRole::Constant
    }

    /// The consumers of a value, with their nodes.
    fn uses(&self, value: &str) -> impl Iterator<Item = (&'m Node, usize)> + '_ {
        self.consumers.get(value).into_iter().flatten().map(|&(index, slot)| (&self.nodes[index], slot))
    }
}

/// Whether input `slot` of an `op` node is a parameter it computes with:
/// a matrix, a kernel, an embedding table, a recurrent cell's weights, a
/// normalization's scale, bias or statistics.
fn is_parameter(op: &str, slot: usize) -> bool {
    match op {
        "MatMul" | "Einsum" | "FusedMatMul" => true,
        "Gemm" => slot <= 2,
        "Conv" | "ConvTranspose" | "FusedConv" | "DeformConv" | "Attention" => matches!(slot, 1 | 2),
        // The data input: an embedding table.
        "Gather" => slot == 0,
        "LSTM" | "GRU" | "RNN" => matches!(slot, 1..=3 | 7),
        "LayerNormalization"
        | "InstanceNormalization"
        | "GroupNormalization"
        | "RMSNormalization"
        | "SimplifiedLayerNormalization" => matches!(slot, 1 | 2),
        "BatchNormalization" => matches!(slot, 1..=4),
        "SkipLayerNormalization" | "SkipSimplifiedLayerNormalization" => matches!(slot, 2..=4),
        "EmbedLayerNormalization" => matches!(slot, 2..=6),
        "PRelu" | "BiasGelu" | "FastGelu" => slot == 1,
        _ => false,
    }
}

/// Whether a node hands input `slot`'s values on unchanged, only moved,
/// selected, repeated or converted: what its outputs hold are that
/// input's values.
fn moves_values(node: &Node, slot: usize) -> bool {
    match node.op_type.as_str() {
        "Identity" | "Transpose" | "Flatten" | "Concat" | "DequantizeLinear" | "SpaceToDepth" | "DepthToSpace" => true,
        "Reshape" | "Squeeze" | "Unsqueeze" | "Expand" | "Slice" | "Tile" | "Split" | "CastLike" | "Pad" | "Gather"
        | "GatherElements" | "GatherND" | "Compress" | "ReverseSequence" => slot == 0,
        // To another integer type, or between floating-point types; not
        // to or from BOOL, which changes the values (see `ranges`).
        "Cast" => node.int("to") != Some(i64::from(crate::proto::elem::BOOL)),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
