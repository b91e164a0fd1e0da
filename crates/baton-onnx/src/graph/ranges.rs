//! The values an integer input may take, told from where the graph uses
//! it. An input that reaches the indices of a `Gather` over a table of
//! fixed size, unchanged, takes values in `[0, rows)`; one that is only
//! converted to floating point, compared or has its shape read takes any
//! value; anything else that may be an index or a shape, baton cannot
//! tell, and says where.

use std::collections::HashSet;

use baton_core::run::backend::{InputRange, ValueRange};

use super::{Graph, moves_values};
use crate::proto::{Node, OnnxModel, elem};

impl Graph<'_> {
    /// The range of every integer graph input of `model`.
    pub(crate) fn input_ranges(&self, model: &OnnxModel) -> Vec<InputRange> {
        model
            .graph_inputs
            .iter()
            .filter(|input| is_integer(input.elem_type))
            .map(|input| InputRange { name: input.name.clone(), range: self.range(&input.name) })
            .collect()
    }

    /// What the uses of input `name` allow.
    fn range(&self, name: &str) -> ValueRange {
        let mut seen = HashSet::new();
        // Each value with whether it still holds the input's values
        // unchanged, or values computed from them.
        let mut queue = vec![(name, false)];
        let mut high: Option<i64> = None;
        while let Some((value, computed)) = queue.pop() {
            if !seen.insert((value, computed)) {
                continue;
            }
            for (node, slot) in self.uses(value) {
                let follow = match self.use_of(node, slot, computed) {
                    Use::Free => continue,
                    Use::Below(rows) => {
                        high = Some(high.map_or(rows, |h| h.min(rows)));
                        continue;
                    }
                    Use::Unknown(why) => return ValueRange::Unknown(why),
                    Use::Follow { computed } => computed,
                };
                queue.extend(node.outputs.iter().map(|o| (o.as_str(), follow)));
            }
        }
        match high {
            Some(high) => ValueRange::Within { low: 0, high },
            None => ValueRange::Any,
        }
    }

    /// What input `slot` of `node` does with a value; `computed` when the
    /// value was computed from the input rather than holding its values.
    fn use_of(&self, node: &Node, slot: usize, computed: bool) -> Use {
        let op = node.op_type.as_str();
        let described = || format!("it is input {slot} of {op} node '{}'", node.name);
        if op == "Gather" && slot == 1 {
            if computed {
                return Use::Unknown(format!("{}, computed from the input's values", described()));
            }
            return match self.rows(node) {
                Some(rows) if rows > 0 => Use::Below(rows),
                _ => Use::Unknown(format!("{}, whose table's size is not fixed in the model", described())),
            };
        }
        if is_index_or_shape(op, slot) {
            return Use::Unknown(format!("{}, an index or a shape", described()));
        }
        match op {
            // Only the shape is read.
            "Shape" | "Size" => Use::Free,
            "Cast" if node.int("to").is_some_and(is_float) => Use::Free,
            "Cast" if node.int("to") == Some(i64::from(elem::BOOL)) => Use::Follow { computed: true },
            _ if moves_values(node, slot) => Use::Follow { computed },
            _ if computes(op) => Use::Follow { computed: true },
            // A value already computed from the input, in arithmetic
            // baton does not list (a softmax, a normalization): only the
            // index and shape inputs above matter.
            _ if computed => Use::Follow { computed: true },
            _ => Use::Unknown(format!("{}, an operator baton does not know", described())),
        }
    }

    /// The rows of the table a `Gather` node indexes along its axis, when
    /// the table is a constant.
    fn rows(&self, gather: &Node) -> Option<i64> {
        let table = self.constants.get(gather.inputs.first()?.as_str())?;
        let rank = table.dims.len() as i64;
        let axis = gather.int("axis").unwrap_or(0);
        let axis = if axis < 0 { axis + rank } else { axis };
        table.dims.get(usize::try_from(axis).ok()?).copied()
    }
}

/// One use of an integer input's values.
enum Use {
    /// Any value is fine here.
    Free,
    /// An index into this many rows.
    Below(i64),
    /// An index or a shape of unknown bounds.
    Unknown(String),
    /// The node's outputs carry the values on.
    Follow {
        /// Whether they are computed from the input rather than its values.
        computed: bool,
    },
}

/// Whether input `slot` of an `op` node is an index, a shape, an axis or
/// a count: used so, a value out of bounds makes the node fail. `Gather`'s
/// indices are told apart in [`Graph::use_of`].
fn is_index_or_shape(op: &str, slot: usize) -> bool {
    match op {
        "Range" => true,
        "ConstantOfShape" | "If" => slot == 0,
        "OneHot" | "Loop" => slot <= 1,
        "Reshape" | "Expand" | "Tile" | "Unsqueeze" | "Squeeze" | "Upsample" | "TopK" | "Split" | "Trilu"
        | "CumSum" | "GatherElements" | "GatherND" | "ScatterElements" | "ScatterND" | "Scatter" | "Compress"
        | "CenterCropPad" => slot == 1,
        "Slice" => (1..=4).contains(&slot),
        "Pad" | "Resize" => (1..=3).contains(&slot),
        "NonMaxSuppression" | "RoiAlign" => slot == 2,
        "MaxUnpool" => matches!(slot, 1 | 2),
        _ => op.starts_with("Reduce") && slot == 1,
    }
}

/// Whether an operator computes new values from its inputs (arithmetic,
/// comparison, logic, selection).
fn computes(op: &str) -> bool {
    matches!(
        op,
        "Add"
            | "Sub"
            | "Mul"
            | "Div"
            | "Mod"
            | "Neg"
            | "Abs"
            | "Min"
            | "Max"
            | "Clip"
            | "Sum"
            | "Mean"
            | "Pow"
            | "Sign"
            | "CumSum"
            | "ArgMax"
            | "ArgMin"
            | "Equal"
            | "Less"
            | "LessOrEqual"
            | "Greater"
            | "GreaterOrEqual"
            | "Not"
            | "And"
            | "Or"
            | "Xor"
            | "Where"
            | "BitShift"
            | "BitwiseAnd"
            | "BitwiseOr"
            | "BitwiseXor"
            | "BitwiseNot"
            | "NonZero"
            | "MatMul"
            | "MatMulInteger"
    ) || op.starts_with("Reduce")
}

/// ONNX integer element types.
fn is_integer(elem_type: i32) -> bool {
    use elem::*;
    matches!(elem_type, UINT8 | INT8 | UINT16 | INT16 | INT32 | INT64 | UINT32 | UINT64)
}

/// ONNX floating-point element types (bfloat16 is 16).
fn is_float(elem_type: i64) -> bool {
    matches!(i32::try_from(elem_type), Ok(elem::FLOAT | elem::FLOAT16 | elem::DOUBLE | 16))
}
