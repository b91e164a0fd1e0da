//! A small ONNX model writer: graphs built node by node in code and
//! encoded with a hand-written protobuf encoder. baton's demo models and
//! test models are written with it ([`crate::mlp`], [`crate::encoder`]),
//! never downloaded.

use crate::proto::elem;

/// A protobuf message being encoded.
#[derive(Default)]
pub(crate) struct Msg(pub(crate) Vec<u8>);

impl Msg {
    fn raw_varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.raw_varint(u64::from(field) << 3 | u64::from(wire));
    }

    /// A varint field (int32/int64/enum; negatives take ten bytes, as protobuf does).
    pub(crate) fn int(&mut self, field: u32, v: i64) -> &mut Self {
        self.key(field, 0);
        self.raw_varint(v as u64);
        self
    }

    /// A 32-bit fixed-width field (a float).
    fn fixed32(&mut self, field: u32, bytes: [u8; 4]) -> &mut Self {
        self.key(field, 5);
        self.0.extend_from_slice(&bytes);
        self
    }

    /// A length-delimited field.
    pub(crate) fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Self {
        self.key(field, 2);
        self.raw_varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }

    /// A string field.
    pub(crate) fn str(&mut self, field: u32, s: &str) -> &mut Self {
        self.bytes(field, s.as_bytes())
    }

    /// An embedded message field.
    pub(crate) fn msg(&mut self, field: u32, m: &Msg) -> &mut Self {
        self.bytes(field, &m.0)
    }

    /// An embedded message field built by `f`.
    pub(crate) fn with(&mut self, field: u32, f: impl FnOnce(&mut Msg)) -> &mut Self {
        let mut m = Msg::default();
        f(&mut m);
        self.msg(field, &m)
    }
}

/// One dimension of a graph input or output.
#[derive(Clone, Copy, Debug)]
pub enum Dim<'a> {
    /// A fixed size.
    Fixed(i64),
    /// A named variable size (`dim_param`), e.g. `"batch"`.
    Named(&'a str),
}

/// A node attribute.
#[derive(Clone, Copy, Debug)]
pub enum Attr<'a> {
    /// An integer (`axis`, Cast's `to`).
    Int(&'a str, i64),
    /// A list of integers (`perm`).
    Ints(&'a str, &'a [i64]),
    /// A float (`epsilon`).
    Float(&'a str, f32),
    /// A tensor of an ONNX element type (see [`elem`]): dims and
    /// little-endian element bytes (a `Constant` node's `value`).
    Tensor(&'a str, i32, &'a [i64], &'a [u8]),
}

/// A TensorProto with raw little-endian data.
pub(crate) fn tensor(name: &str, elem_type: i32, dims: &[i64], data: &[u8]) -> Msg {
    let mut t = Msg::default();
    for &d in dims {
        t.int(1, d); // proto2 `repeated int64 dims`: unpacked
    }
    t.int(2, i64::from(elem_type)).str(8, name).bytes(9, data);
    t
}

/// ValueInfoProto for a tensor of an ONNX element type and these dims.
pub(crate) fn value_info(name: &str, elem_type: i32, dims: &[Dim<'_>]) -> Msg {
    let mut vi = Msg::default();
    vi.str(1, name).with(2, |ty| {
        ty.with(1, |tensor| {
            tensor.int(1, i64::from(elem_type)).with(2, |shape| {
                for dim in dims {
                    shape.with(1, |d| match dim {
                        Dim::Fixed(n) => {
                            d.int(1, *n);
                        }
                        Dim::Named(name) => {
                            d.str(2, name);
                        }
                    });
                }
            });
        });
    });
    vi
}

/// A graph being written. Nodes must come in an order where each one's
/// inputs are produced before it (as ONNX requires).
pub struct GraphWriter {
    graph: Msg,
    nodes: usize,
}

impl GraphWriter {
    /// An empty graph.
    pub fn new(name: &str) -> GraphWriter {
        let mut graph = Msg::default();
        graph.str(2, name);
        GraphWriter { graph, nodes: 0 }
    }

    /// Adds a node; returns its (first) output name, for chaining.
    pub fn node(&mut self, op: &str, inputs: &[&str], outputs: &[&str], attrs: &[Attr<'_>]) -> String {
        let mut n = Msg::default();
        for input in inputs {
            n.str(1, input);
        }
        for output in outputs {
            n.str(2, output);
        }
        n.str(3, &format!("/{op}_{}", self.nodes)).str(4, op);
        for attr in attrs {
            n.with(5, |a| attribute(a, attr));
        }
        self.nodes += 1;
        self.graph.msg(1, &n);
        outputs.first().map_or_else(String::new, |o| (*o).to_owned())
    }

    /// Adds a `Constant` node whose output `name` holds a tensor.
    pub fn constant(&mut self, name: &str, elem_type: i32, dims: &[i64], data: &[u8]) -> String {
        self.node("Constant", &[], &[name], &[Attr::Tensor("value", elem_type, dims, data)])
    }

    /// Adds an initializer with raw data.
    pub fn initializer(&mut self, name: &str, elem_type: i32, dims: &[i64], data: &[u8]) {
        self.graph.msg(5, &tensor(name, elem_type, dims, data));
    }

    /// Adds an initializer whose data is `length` bytes at `offset` of the
    /// external data file `location`.
    pub fn initializer_external(
        &mut self,
        name: &str,
        elem_type: i32,
        dims: &[i64],
        location: &str,
        offset: usize,
        length: usize,
    ) {
        let mut t = Msg::default();
        for &d in dims {
            t.int(1, d);
        }
        t.int(2, i64::from(elem_type)).str(8, name);
        for (key, value) in [("location", location), ("offset", &offset.to_string()), ("length", &length.to_string())] {
            t.with(13, |e| {
                e.str(1, key).str(2, value);
            });
        }
        t.int(14, 1);
        self.graph.msg(5, &t);
    }

    /// Adds an FP32 initializer.
    pub fn initializer_f32(&mut self, name: &str, dims: &[i64], values: &[f32]) {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.initializer(name, elem::FLOAT, dims, &data);
    }

    /// Adds an INT64 initializer.
    pub fn initializer_i64(&mut self, name: &str, dims: &[i64], values: &[i64]) {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.initializer(name, elem::INT64, dims, &data);
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, elem_type: i32, dims: &[Dim<'_>]) {
        self.graph.msg(11, &value_info(name, elem_type, dims));
    }

    /// Declares a graph output.
    pub fn output(&mut self, name: &str, elem_type: i32, dims: &[Dim<'_>]) {
        self.graph.msg(12, &value_info(name, elem_type, dims));
    }

    /// The ModelProto (IR version 8, default domain at `opset`).
    pub fn model(&self, opset: i64) -> Vec<u8> {
        model(&self.graph, opset)
    }
}

/// A ModelProto around `graph`: IR version 8, producer "baton", the
/// default domain at `opset`.
pub(crate) fn model(graph: &Msg, opset: i64) -> Vec<u8> {
    let mut model = Msg::default();
    model.int(1, 8).str(2, "baton").str(3, env!("CARGO_PKG_VERSION")).msg(7, graph).with(8, |op| {
        op.str(1, "").int(2, opset);
    });
    model.0
}

/// Writes an AttributeProto.
fn attribute(a: &mut Msg, attr: &Attr<'_>) {
    // AttributeProto.AttributeType: FLOAT 1, INT 2, TENSOR 4, INTS 7.
    match *attr {
        Attr::Int(name, v) => {
            a.str(1, name).int(3, v).int(20, 2);
        }
        Attr::Ints(name, values) => {
            a.str(1, name);
            for &v in values {
                a.int(8, v);
            }
            a.int(20, 7);
        }
        Attr::Float(name, v) => {
            a.str(1, name).fixed32(2, v.to_le_bytes()).int(20, 1);
        }
        Attr::Tensor(name, elem_type, dims, data) => {
            a.str(1, name).msg(5, &tensor("", elem_type, dims, data)).int(20, 4);
        }
    }
}
