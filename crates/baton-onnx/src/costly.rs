//! MLPs that answer as a given [`Mlp`] does at a chosen cost: for the
//! latency guard's tests and benchmarks, a candidate "three times as
//! costly" as the stable version in real ONNX Runtime work, with the same
//! outputs.
//!
//! The graph repeats its input `rows` times (`Tile`), runs the MLP on every
//! copy, and averages the copies' outputs back (`Reshape`, `ReduceMean`):
//! the answer is the MLP's (up to float rounding, about 1e-7 relative), and
//! the work is `rows` rows of matrix multiplication per row asked for, with
//! the same weights. The weights stay as small as the MLP's, so the run's
//! time is arithmetic and grows with `rows` whatever the caches hold.

use crate::mlp::Mlp;
use crate::proto::elem;
use crate::writer::{Attr, Dim, GraphWriter};

/// Encodes `mlp` as an ONNX model (input `input`, output `output`, as
/// [`crate::mlp::encode_mlp`] names them) that runs every row it is given
/// `rows` times (at least once) for the same answer.
pub fn encode_costly(mlp: &Mlp, rows: usize) -> Vec<u8> {
    let rows = rows.max(1) as i64;
    let (width, out) = (mlp.input_width() as i64, mlp.output_width() as i64);
    let mut graph = GraphWriter::new("baton_costly_mlp");
    graph.initializer_i64("repeats", &[2], &[rows, 1]);
    graph.initializer_i64("split", &[3], &[rows, -1, out]);
    let mut x = graph.node("Tile", &["input", "repeats"], &["tiled"], &[]);
    let last = mlp.layers.len() - 1;
    for (i, layer) in mlp.layers.iter().enumerate() {
        let (inp, size) = (mlp.sizes[i] as i64, mlp.sizes[i + 1] as i64);
        let (w, b) = (format!("fc{i}.weight"), format!("fc{i}.bias"));
        graph.initializer_f32(&w, &[inp, size], &layer.weight);
        graph.initializer_f32(&b, &[size], &layer.bias);
        let product = graph.node("MatMul", &[&x, &w], &[&format!("fc{i}.matmul")], &[]);
        x = graph.node("Add", &[&product, &b], &[&format!("fc{i}.add")], &[]);
        if i != last {
            x = graph.node("Relu", &[&x], &[&format!("relu{i}")], &[]);
        }
    }
    let copies = graph.node("Reshape", &[&x, "split"], &["copies"], &[]);
    let axes = [Attr::Ints("axes", &[0]), Attr::Int("keepdims", 0)];
    graph.node("ReduceMean", &[&copies], &["output"], &axes);
    let batch = Dim::Named("batch");
    graph.input("input", elem::FLOAT, &[batch, Dim::Fixed(width)]);
    graph.output("output", elem::FLOAT, &[batch, Dim::Fixed(out)]);
    graph.model(13)
}
