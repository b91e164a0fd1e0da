//! Reading features.toml: every refusal names the feature (or graph
//! input) and the key; and the check of the graph inputs it gives
//! against the graph's.

mod common;

use baton_core::signature::{Signature, TensorSpec};
use baton_core::tensor::DataType;
use baton_processing::features::{FeatureError, FeatureSpec};
use common::{CTR, ctr};

/// A file of one FP32 feature `x` feeding `dense`, with `extra` lines
/// added to its table.
fn one(extra: &str) -> String {
    format!("[[feature]]\nname = \"x\"\ndatatype = \"FP32\"\ngraph_input = \"dense\"\n{extra}\n")
}

/// A file of one BYTES feature `c` feeding `ids`, with `extra` lines.
fn categorical(extra: &str) -> String {
    format!("[[feature]]\nname = \"c\"\ndatatype = \"BYTES\"\ngraph_input = \"ids\"\n{extra}\n")
}

/// The refusal of `text`, checked to be `feature_spec_invalid`.
fn refused(text: &str) -> String {
    let e = FeatureSpec::parse(text).expect_err(text);
    assert_eq!(e.kind(), "feature_spec_invalid", "{e}");
    assert!(!e.is_client_error());
    e.to_string()
}

#[track_caller]
fn assert_refused(text: &str, message: &str) {
    assert_eq!(refused(text), format!("features.toml: {message}"), "for:\n{text}");
}

/// Each `(extra, message)`: `file(extra)` is refused with `message`.
#[track_caller]
fn refusals(file: fn(&str) -> String, cases: &[(&str, &str)]) {
    for (extra, message) in cases {
        assert_refused(&file(extra), message);
    }
}

const HASH: &str = r#"hash_strings = { hash = "murmur3_x86_32", seed = 0, buckets = 10 }"#;

#[test]
fn unknown_keys_are_refused_where_they_are() {
    assert_refused(
        &one("scale_to_z_score = { mean = 1.0, stdev = 2.0 }"),
        "feature 'x': scale_to_z_score: unknown field `stdev`, expected `mean` or `std`",
    );
    assert_refused(
        &one("normalize = true"),
        "feature 'x': unknown key 'normalize'; a feature takes name, datatype, graph_input, default, clip, \
         scale_to_z_score, scale_by_min_max, bucketize, hash_strings",
    );
    assert_refused(
        &format!("version = 2\n{}", one("")),
        "file: unknown key 'version'; the file has [[feature]] and [graph_input.NAME] tables",
    );
    let e = refused(&format!("{}[graph_input.dense]\nshape = [-1, 1]\n", one("")));
    assert!(e.starts_with("features.toml: graph_input 'dense': unknown field `shape`"), "{e}");
    assert_refused("[[feature]]\nname = \"x\"\ndatatype = \"FP32\"\n", "feature 'x': graph_input is required");
    assert_refused("[[feature]]\ndatatype = \"FP32\"\ngraph_input = \"d\"\n", "feature #1: name is required");
    assert_refused(&one("").replace("\"x\"", "1"), "feature #1: name: invalid type: integer `1`, expected a string");
    let e = refused(&one("").replace("FP32", "FLOAT"));
    assert!(e.starts_with("features.toml: feature 'x': datatype: unknown variant `FLOAT`, expected one of"), "{e}");
    assert_refused(
        &one("default = true"),
        "feature 'x': default: expected a number (numeric feature) or a string (categorical feature)",
    );
}

#[test]
fn non_finite_parameters_are_refused() {
    refusals(
        one,
        &[
            (
                "scale_to_z_score = { mean = nan, std = 1.0 }",
                "feature 'x': scale_to_z_score.mean must be finite, got NaN",
            ),
            (
                "scale_to_z_score = { mean = 0.0, std = inf }",
                "feature 'x': scale_to_z_score.std must be finite, got inf",
            ),
            (
                "scale_by_min_max = { min = -inf, max = 1.0 }",
                "feature 'x': scale_by_min_max.min must be finite, got -inf",
            ),
            (
                "scale_by_min_max = { min = 0.0, max = 1.0, output_max = nan }",
                "feature 'x': scale_by_min_max.output_max must be finite, got NaN",
            ),
            ("bucketize = { boundaries = [0.0, inf] }", "feature 'x': bucketize.boundaries[1] must be finite, got inf"),
            ("default = nan", "feature 'x': default must be finite, got NaN"),
            ("clip = { min = nan }", "feature 'x': clip.min must be finite, got NaN"),
        ],
    );
}

#[test]
fn empty_and_inverted_ranges_are_refused() {
    refusals(
        one,
        &[
            ("scale_to_z_score = { mean = 0.0, std = 0.0 }", "feature 'x': scale_to_z_score.std must be > 0, got 0"),
            ("scale_to_z_score = { mean = 0.0, std = -1 }", "feature 'x': scale_to_z_score.std must be > 0, got -1"),
            (
                "scale_by_min_max = { min = 2.0, max = 2.0 }",
                "feature 'x': scale_by_min_max.min (2) must be below scale_by_min_max.max (2)",
            ),
            (
                "scale_by_min_max = { min = 0, max = 1, output_min = 1, output_max = -1 }",
                "feature 'x': scale_by_min_max.output_min (1) must be below scale_by_min_max.output_max (-1)",
            ),
            ("clip = { min = 5.0, max = 1.0 }", "feature 'x': clip.min (5) must be below clip.max (1)"),
            ("clip = {}", "feature 'x': clip: give min, max or both"),
        ],
    );
}

#[test]
fn boundaries_must_increase_strictly() {
    refusals(
        one,
        &[
            (
                "bucketize = { boundaries = [0, 10, 5] }",
                "feature 'x': bucketize.boundaries must increase strictly: boundaries[2] = 5 follows 10",
            ),
            (
                "bucketize = { boundaries = [1, 1] }",
                "feature 'x': bucketize.boundaries must increase strictly: boundaries[1] = 1 follows 1",
            ),
            (
                "bucketize = { boundaries = [] }",
                "feature 'x': bucketize.boundaries is empty: give at least one boundary (two buckets)",
            ),
        ],
    );
}

#[test]
fn hashing_needs_a_known_hash_and_one_to_2_pow_32_buckets() {
    refusals(
        categorical,
        &[
            (
                r#"hash_strings = { hash = "murmur3_x86_32", seed = 0, buckets = 0 }"#,
                "feature 'c': hash_strings.buckets must be 1 to 4294967296 (2^32), got 0",
            ),
            (
                r#"hash_strings = { hash = "murmur3_x86_32", seed = 0, buckets = 4294967297 }"#,
                "feature 'c': hash_strings.buckets must be 1 to 4294967296 (2^32), got 4294967297",
            ),
            (
                r#"hash_strings = { hash = "farmhash", seed = 0, buckets = 10 }"#,
                "feature 'c': hash_strings.hash: unknown hash 'farmhash'; baton has 'murmur3_x86_32'",
            ),
            (
                r#"hash_strings = { hash = "murmur3_x86_32", buckets = 10 }"#,
                "feature 'c': hash_strings: missing field `seed`",
            ),
            (
                r#"hash_strings = { hash = "murmur3_x86_32", seed = -1, buckets = 10 }"#,
                "feature 'c': hash_strings: invalid value: integer `-1`, expected u32",
            ),
        ],
    );
}

#[test]
fn transforms_must_fit_the_feature_type() {
    assert_refused(&categorical(""), "feature 'c': hash_strings: a BYTES feature needs it, to become an id");
    assert_refused(
        &categorical(&format!("{HASH}\nclip = {{ max = 1.0 }}")),
        "feature 'c': clip: only numeric features are clipped",
    );
    assert_refused(
        &categorical("bucketize = { boundaries = [1] }"),
        "feature 'c': bucketize: a BYTES feature is categorical; it takes hash_strings",
    );
    assert_refused(
        &categorical(&format!("{HASH}\ndefault = 3")),
        "feature 'c': default: a BYTES feature's default is text, got 3",
    );
    assert_refused(&one(HASH), "feature 'x': hash_strings: a FP32 feature is numeric; hashing takes BYTES");
    assert_refused(
        &one("default = \"none\""),
        "feature 'x': default: a numeric feature's default is a number, got 'none'",
    );
    assert_refused(
        &one("scale_to_z_score = { mean = 0, std = 1 }\nbucketize = { boundaries = [1] }"),
        "feature 'x': scale_to_z_score and bucketize: a feature has at most one transform",
    );
    assert_refused(
        &one("").replace("FP32", "INT32"),
        "feature 'x': datatype INT32: a feature is FP32, FP64 or INT64 (numeric) or BYTES (categorical)",
    );
}

#[test]
fn names_and_graph_inputs_are_checked() {
    assert_refused("", "file: no [[feature]] table: declare at least one feature");
    assert_refused("feature = 3", "file: 'feature' must be an array of tables ([[feature]])");
    assert_refused(&format!("{}{}", one(""), one("")), "feature 'x': name: declared more than once");
    assert_refused(&one("").replace("\"x\"", "\"\""), "feature '': name must not be empty");
    assert_refused(&one("").replace("\"dense\"", "\"\""), "feature 'x': graph_input must not be empty");
    assert_refused(
        &format!("{}[graph_input.other]\nrank = 2\n", one("")),
        "graph_input 'other': no feature names it as its graph_input",
    );
    assert_refused("\n[[feature]\nname = 1", "line 2: invalid table header; expected `.`, `]]`");
    assert_refused("feature = [3]", "feature #1: must be a table ([[feature]])");
}

#[test]
fn graph_inputs_take_floats_or_ids_in_their_datatypes_and_ranks() {
    let mixed = format!("{}{}", one(""), categorical(HASH).replace("\"ids\"", "\"dense\""));
    assert_refused(
        &mixed,
        "graph_input 'dense': feature 'c' gives ids and feature 'x' gives floats; one graph input takes one or the other",
    );
    assert_refused(
        &format!("{}[graph_input.dense]\ndatatype = \"INT64\"\n", one("")),
        "graph_input 'dense': datatype INT64: its features give floats, which go to FP32 or FP64",
    );
    assert_refused(
        &format!("{}[graph_input.ids]\ndatatype = \"FP32\"\n", categorical(HASH)),
        "graph_input 'ids': datatype FP32: its features give ids (bucketize, hash_strings), which go to INT64 or INT32",
    );
    let wide = categorical(r#"hash_strings = { hash = "murmur3_x86_32", seed = 0, buckets = 4294967296 }"#);
    assert_refused(
        &format!("{wide}[graph_input.ids]\ndatatype = \"INT32\"\n"),
        "graph_input 'ids': datatype INT32: feature 'c' gives ids up to 4294967295, beyond INT32",
    );
    let two = format!("{}{}", one(""), one("").replace("\"x\"", "\"y\""));
    assert_refused(
        &format!("{two}[graph_input.dense]\nrank = 1\n"),
        "graph_input 'dense': rank 1 holds one feature per row, and 2 features feed it",
    );
    assert_refused(
        &format!("{}[graph_input.dense]\nrank = 3\n", one("")),
        "graph_input 'dense': rank 3: 1 ([N]) or 2 ([N, width])",
    );
}

#[test]
fn a_version_without_the_file_has_no_spec_and_one_with_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(FeatureSpec::read(dir.path()), Ok(None));
    std::fs::write(dir.path().join("features.toml"), CTR).unwrap();
    assert_eq!(FeatureSpec::read(dir.path()), Ok(Some(ctr())));
    std::fs::write(dir.path().join("features.toml"), one("clip = { min = 1, max = 0 }")).unwrap();
    assert_eq!(FeatureSpec::read(dir.path()).unwrap_err().kind(), "feature_spec_invalid");
    std::fs::remove_file(dir.path().join("features.toml")).unwrap();
    std::fs::create_dir(dir.path().join("features.toml")).unwrap();
    let e = FeatureSpec::read(dir.path()).unwrap_err();
    assert_eq!(e.kind(), "feature_spec_invalid");
    assert!(e.to_string().contains("reading "), "{e}");
}

fn spec(name: &str, datatype: DataType, shape: &[i64]) -> TensorSpec {
    TensorSpec { name: name.into(), datatype, shape: shape.to_vec() }
}

/// The graph the worked example is written for.
fn ctr_graph() -> Signature {
    Signature {
        inputs: vec![
            spec("dense", DataType::Fp32, &[-1, 3]),
            spec("hour_bucket", DataType::Int64, &[-1]),
            spec("ids", DataType::Int64, &[-1, 2]),
        ],
        outputs: vec![spec("ctr", DataType::Fp32, &[-1, 1])],
    }
}

/// The mismatch `graph` meets, checked to be `feature_spec_mismatch`.
fn mismatch(graph: &Signature) -> String {
    let e: FeatureError = ctr().check_against(graph).unwrap_err();
    assert_eq!(e.kind(), "feature_spec_mismatch", "{e}");
    assert!(!e.is_client_error());
    e.to_string().trim_start_matches("features.toml does not fit the graph: ").to_owned()
}

#[test]
fn the_worked_example_fits_its_graph_and_dynamic_widths() {
    assert_eq!(ctr().check_against(&ctr_graph()), Ok(()));
    let mut dynamic = ctr_graph();
    dynamic.inputs[0].shape = vec![-1, -1];
    dynamic.inputs[2].shape = vec![8, 2];
    assert_eq!(ctr().check_against(&dynamic), Ok(()), "a fixed batch is the request's business");
}

#[test]
fn a_graph_that_differs_is_refused_naming_the_input() {
    let mut g = ctr_graph();
    g.inputs.push(spec("user", DataType::Fp32, &[-1, 4]));
    assert_eq!(mismatch(&g), "the graph takes input 'user', which no feature's graph_input names");

    let mut g = ctr_graph();
    g.inputs.remove(1);
    assert_eq!(mismatch(&g), "graph_input 'hour_bucket': the graph has no such input; it takes 'dense', 'ids'");

    let mut g = ctr_graph();
    g.inputs[0].datatype = DataType::Fp64;
    assert_eq!(mismatch(&g), "graph_input 'dense': the graph takes FP64, the features give FP32");

    let mut g = ctr_graph();
    g.inputs[0].shape = vec![-1, 4];
    assert_eq!(
        mismatch(&g),
        "graph_input 'dense': the graph takes shape [-1, 4], the features give [-1, 3] (features 'age', 'price', 'past_clicks')"
    );

    let mut g = ctr_graph();
    g.inputs[1].shape = vec![-1, 1];
    assert_eq!(
        mismatch(&g),
        "graph_input 'hour_bucket': the graph takes shape [-1, 1], the features give [-1] (features 'hour')"
    );
}
