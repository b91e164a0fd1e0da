//! Roles and ranges read from the encoder's graph and from small graphs
//! built for one case each.

use baton_core::run::backend::{InputRange, ValueRange, WeightRole};

use super::Graph;
use crate::encoder::Encoder;
use crate::proto::{self, elem};
use crate::writer::{Attr, Dim, GraphWriter};

fn roles_and_ranges(model: &[u8], names: &[&str]) -> (Vec<WeightRole>, Vec<InputRange>) {
    let model = proto::parse(model).unwrap();
    let graph = Graph::new(&model);
    (names.iter().map(|n| graph.role(n)).collect(), graph.input_ranges(&model))
}

fn range(ranges: &[InputRange], name: &str) -> ValueRange {
    ranges.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no range for {name}: {ranges:?}")).range.clone()
}

#[test]
fn the_encoders_weights_and_inputs_are_read_as_exported() {
    let compute = [
        "embeddings.word_embeddings.weight",
        "embeddings.token_type_embeddings.weight",
        "embeddings.position_embeddings.weight",
        "embeddings.LayerNorm.weight",
        "embeddings.LayerNorm.bias",
        "encoder.layer.0.attention.self.query.weight",
        "encoder.layer.0.output.dense.weight",
        "pooler.dense.weight",
    ];
    let constant = ["fmin", "causal_mask", "one", "scale", "slice_end", "embeddings.position_ids", "pooler.dense.bias"];
    let names: Vec<&str> = compute.iter().chain(&constant).copied().collect();
    let (roles, ranges) = roles_and_ranges(&Encoder::new(1).encode(), &names);
    for (name, role) in names.iter().zip(&roles) {
        let want = if compute.contains(name) { WeightRole::Compute } else { WeightRole::Constant };
        assert_eq!(*role, want, "{name}");
    }
    assert_eq!(range(&ranges, "input_ids"), ValueRange::Within { low: 0, high: 1000 });
    assert_eq!(range(&ranges, "token_type_ids"), ValueRange::Within { low: 0, high: 2 });
    assert_eq!(range(&ranges, "attention_mask"), ValueRange::Any, "only converted to float");
}

/// A graph of one INT64 input `i` `[n]` and one FP32 input `x` `[4, 3]`,
/// with nodes added by `build`, returning `y`.
fn graph(build: impl FnOnce(&mut GraphWriter)) -> Vec<u8> {
    let mut g = GraphWriter::new("case");
    g.input("i", elem::INT64, &[Dim::Named("n")]);
    g.input("x", elem::FLOAT, &[Dim::Fixed(4), Dim::Fixed(3)]);
    g.initializer_f32("table", &[4, 3], &[0.5; 12]);
    build(&mut g);
    g.output("y", elem::FLOAT, &[Dim::Named("n"), Dim::Fixed(3)]);
    g.model(17)
}

/// Nodes added to [`graph`].
type Build = Box<dyn Fn(&mut GraphWriter)>;

#[test]
fn an_index_is_bounded_only_when_its_table_is_fixed_and_it_arrives_unchanged() {
    let cases: [(&str, Build, Option<i64>); 6] = [
        (
            "through a cast and a reshape",
            Box::new(|g| {
                g.node("Cast", &["i"], &["c"], &[Attr::Int("to", i64::from(elem::INT32))]);
                g.constant("flat", elem::INT64, &[1], &(-1i64).to_le_bytes());
                g.node("Reshape", &["c", "flat"], &["r"], &[]);
                g.node("Gather", &["table", "r"], &["y"], &[]);
            }),
            Some(4),
        ),
        (
            "along axis 1 of a constant table",
            Box::new(|g| {
                g.node("Gather", &["table", "i"], &["y"], &[Attr::Int("axis", -1)]);
            }),
            Some(3),
        ),
        (
            "plus an offset",
            Box::new(|g| {
                g.constant("offset", elem::INT64, &[], &2i64.to_le_bytes());
                g.node("Add", &["i", "offset"], &["shifted"], &[]);
                g.node("Gather", &["table", "shifted"], &["y"], &[]);
            }),
            None,
        ),
        (
            "into a table that is an input",
            Box::new(|g| {
                g.node("Gather", &["x", "i"], &["y"], &[]);
            }),
            None,
        ),
        (
            "as a shape",
            Box::new(|g| {
                g.node("Reshape", &["x", "i"], &["y"], &[]);
            }),
            None,
        ),
        (
            "into an operator baton does not know",
            Box::new(|g| {
                g.node("SomeCustomOp", &["i"], &["y"], &[]);
            }),
            None,
        ),
    ];
    for (case, build, rows) in cases {
        let (_, ranges) = roles_and_ranges(&graph(build), &[]);
        match (range(&ranges, "i"), rows) {
            (ValueRange::Within { low: 0, high }, Some(rows)) => assert_eq!(high, rows, "{case}"),
            (ValueRange::Unknown(why), None) => assert!(why.contains("node '/"), "{case}: {why}"),
            (other, _) => panic!("{case}: {other:?}"),
        }
        assert_eq!(ranges.len(), 1, "{case}: only integer inputs have a range");
    }
}

#[test]
fn values_used_as_values_may_be_anything() {
    let model = graph(|g| {
        g.node("Shape", &["i"], &["s"], &[]);
        g.node("Cast", &["i"], &["f"], &[Attr::Int("to", i64::from(elem::FLOAT))]);
        g.node("Equal", &["i", "i"], &["e"], &[]);
        g.node("Cast", &["e"], &["ef"], &[Attr::Int("to", i64::from(elem::FLOAT))]);
        g.node("Gather", &["table", "i"], &["y"], &[]);
    });
    let (_, ranges) = roles_and_ranges(&model, &[]);
    assert_eq!(range(&ranges, "i"), ValueRange::Within { low: 0, high: 4 }, "the one index use bounds it");
}

#[test]
fn a_weight_reached_through_moves_is_a_compute_weight() {
    let model = graph(|g| {
        // Tied weights: the table multiplied through a transpose; a mask
        // buffer sliced and added.
        g.node("Transpose", &["table"], &["table_t"], &[Attr::Ints("perm", &[1, 0])]);
        g.node("MatMul", &["x", "table_t"], &["scores"], &[]);
        g.initializer_f32("mask", &[1, 4], &[0.0, f32::MIN, 0.0, 0.0]);
        g.constant("zero", elem::INT64, &[1], &0i64.to_le_bytes());
        g.constant("two", elem::INT64, &[1], &2i64.to_le_bytes());
        g.node("Slice", &["mask", "zero", "two"], &["mask_s"], &[]);
        g.node("Add", &["scores", "mask_s"], &["y"], &[]);
    });
    let (roles, _) = roles_and_ranges(&model, &["table", "mask", "zero", "unused"]);
    assert_eq!(roles, [WeightRole::Compute, WeightRole::Constant, WeightRole::Constant, WeightRole::Constant]);
}
