//! Graph nodes: what baton reads of them to tell what each weight is for
//! and which values an input may take ([`crate::graph`]).

use super::wire::Reader;
use super::{InitData, Initializer, MAX_DEPTH, ProtoError, Result, elem, parse_tensor};

/// A graph node (NodeProto), with the attributes baton reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Operator type, e.g. `MatMul`.
    pub op_type: String,
    /// Node name (may be empty).
    pub name: String,
    /// Input value names; an empty name is an omitted optional input.
    pub inputs: Vec<String>,
    /// Output value names.
    pub outputs: Vec<String>,
    /// Integer attributes, e.g. Gather's `axis`, Cast's `to`.
    pub ints: Vec<(String, i64)>,
    /// For a `Constant` node, the tensor it produces (from its `value`,
    /// `value_float(s)` or `value_int(s)` attribute), named after its output.
    pub constant: Option<Initializer>,
}

impl Node {
    /// An integer attribute.
    pub fn int(&self, name: &str) -> Option<i64> {
        self.ints.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
}

/// Parses a NodeProto. Nodes of subgraphs (the bodies of `If`, `Loop`,
/// `Scan`) are appended to `nested`: they use the outer graph's values too.
/// `depth` counts the subgraphs around the node; past [`MAX_DEPTH`] the
/// model is refused, as reading on would overflow the thread's stack.
pub(super) fn parse_node(mut r: Reader<'_>, idx: usize, nested: &mut Vec<Node>, depth: usize) -> Result<Node> {
    let ctx = format!("node #{idx}");
    if depth > MAX_DEPTH {
        return Err(ProtoError::Unsupported(format!("{ctx}: subgraphs nested more than {MAX_DEPTH} deep")));
    }
    let mut node = Node {
        op_type: String::new(),
        name: String::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
        ints: Vec::new(),
        constant: None,
    };
    let mut constant = None;
    while let Some((f, v)) = r.next(&ctx)? {
        match f {
            1 => node.inputs.push(r.string(v, f, &ctx)?),
            2 => node.outputs.push(r.string(v, f, &ctx)?),
            3 => node.name = r.string(v, f, &ctx)?,
            4 => node.op_type = r.string(v, f, &ctx)?,
            5 => {
                let attribute = parse_attribute(r.sub(v.bytes(f, &ctx)?), &ctx, nested, depth)?;
                match attribute {
                    Attribute::Int(name, value) => node.ints.push((name, value)),
                    Attribute::Constant(tensor) => constant = Some(tensor),
                    Attribute::Other => {}
                }
            }
            _ => {}
        }
    }
    if node.op_type == "Constant"
        && let (Some(mut tensor), Some(output)) = (constant, node.outputs.first())
    {
        tensor.name = output.clone();
        node.constant = Some(tensor);
    }
    Ok(node)
}

/// What an attribute gives baton.
enum Attribute {
    /// A named integer (`i`).
    Int(String, i64),
    /// The value of a `Constant` node.
    Constant(Initializer),
    /// Nothing baton reads.
    Other,
}

/// Parses an AttributeProto of a node `depth` subgraphs deep.
fn parse_attribute(mut r: Reader<'_>, node: &str, nested: &mut Vec<Node>, depth: usize) -> Result<Attribute> {
    let ctx = format!("an attribute of {node}");
    let (mut name, mut int, mut float) = (String::new(), None, None);
    let (mut tensor, mut floats, mut ints) = (None, Vec::new(), Vec::new());
    while let Some((f, v)) = r.next(&ctx)? {
        match f {
            1 => name = r.string(v, f, &ctx)?,
            2 => r.fixed(v, f, &ctx, 4, float.get_or_insert_with(Vec::new))?,
            3 => int = Some(v.varint(f, &ctx)? as i64),
            5 => tensor = Some(parse_tensor(r.sub(v.bytes(f, &ctx)?), &ctx)?),
            6 => parse_subgraph(r.sub(v.bytes(f, &ctx)?), nested, depth + 1)?,
            7 => r.fixed(v, f, &ctx, 4, &mut floats)?,
            8 => r.varints(v, f, &ctx, &mut ints)?,
            11 => parse_subgraph(r.sub(v.bytes(f, &ctx)?), nested, depth + 1)?,
            _ => {}
        }
    }
    let inline = |data_type, dims: Vec<i64>, bytes: Vec<u8>| {
        Attribute::Constant(Initializer { name: String::new(), data_type, dims, data: InitData::Inline(bytes) })
    };
    let int64s = |values: &[u64]| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    Ok(match (name.as_str(), int, float, tensor) {
        ("value", _, _, Some(tensor)) => Attribute::Constant(tensor),
        ("value_float", _, Some(bytes), _) => inline(elem::FLOAT, Vec::new(), bytes),
        ("value_floats", ..) => inline(elem::FLOAT, vec![(floats.len() / 4) as i64], floats),
        ("value_int", Some(v), ..) => inline(elem::INT64, Vec::new(), int64s(&[v as u64])),
        ("value_ints", ..) => inline(elem::INT64, vec![ints.len() as i64], int64s(&ints)),
        (_, Some(v), ..) => Attribute::Int(name, v),
        _ => Attribute::Other,
    })
}

/// Appends the nodes of a subgraph (GraphProto), `depth` deep, to `nested`.
fn parse_subgraph(mut r: Reader<'_>, nested: &mut Vec<Node>, depth: usize) -> Result<()> {
    const CTX: &str = "a subgraph";
    while let Some((f, v)) = r.next(CTX)? {
        if f == 1 {
            let idx = nested.len();
            let mut inner = Vec::new();
            let node = parse_node(r.sub(v.bytes(f, CTX)?), idx, &mut inner, depth)?;
            nested.push(node);
            nested.append(&mut inner);
        }
    }
    Ok(())
}
