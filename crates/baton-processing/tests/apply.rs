//! A request's raw features through the worked example of
//! docs/features.md, and every way a request is refused.

mod common;

use baton_core::tensor::{DataType, Tensor, TensorData};
use common::{ctr, f32s, f64s, i64s, ids, texts};

/// The features of two rows, `site` and `past_clicks` left to their
/// defaults, one NaN age.
fn two_rows() -> Vec<Tensor> {
    vec![
        f32s("age", &[30.0, f32::NAN]),
        f64s("price", &[125.0, 900.0]),
        i64s("hour", &[5, 12]),
        texts("ad_id", &["ad-1", "ad-2"]),
    ]
}

#[test]
fn the_worked_example_gives_the_graph_inputs() {
    let out = ctr().apply(&two_rows()).unwrap();
    let names: Vec<&str> = out.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["dense", "hour_bucket", "ids"]);

    let dense = &out[0];
    assert_eq!((dense.datatype, dense.shape.as_slice()), (DataType::Fp32, &[2, 3][..]));
    let z = |x: f64| ((x - 38.2) / 12.5) as f32;
    assert_eq!(
        dense.to_f32().unwrap(),
        // age z-scored (the NaN takes the default 38), price clipped to
        // 500 then scaled to [0, 1], past_clicks absent: default 0.
        [z(30.0), 0.25, -0.625, z(38.0), 1.0, -0.625]
    );

    let bytes: usize = out.iter().map(Tensor::data_bytes).sum();
    assert_eq!((ctr().output_bytes(2), bytes), (2 * (3 * 4 + 8 + 2 * 8), 2 * (3 * 4 + 8 + 2 * 8)));
    assert_eq!(ctr().output_bytes(usize::MAX), usize::MAX);

    // 12 equals a boundary: the bucket above it.
    assert_eq!((out[1].shape.as_slice(), ids(&out[1])), (&[2][..], vec![0, 2]));

    // Buckets from Python: mmh3.hash(v, seed, signed=False) % buckets.
    assert_eq!(out[2].shape, [2, 2]);
    assert_eq!(ids(&out[2]), [98820, 115, 61052, 115], "ad_id, then site's default 'unknown'");
}

#[test]
fn the_raw_inputs_are_the_features_one_value_per_row() {
    let inputs = ctr().inputs();
    let described: Vec<(&str, DataType, &[i64])> =
        inputs.iter().map(|s| (s.name.as_str(), s.datatype, s.shape.as_slice())).collect();
    assert_eq!(
        described,
        [
            ("age", DataType::Fp32, &[-1][..]),
            ("price", DataType::Fp64, &[-1][..]),
            ("past_clicks", DataType::Int64, &[-1][..]),
            ("hour", DataType::Int64, &[-1][..]),
            ("ad_id", DataType::Bytes, &[-1][..]),
            ("site", DataType::Bytes, &[-1][..]),
        ]
    );
}

#[test]
fn a_column_of_shape_n_by_1_is_taken_as_n() {
    let mut raw = two_rows();
    for t in &mut raw {
        t.shape.push(1);
    }
    assert_eq!(ctr().apply(&raw).unwrap(), ctr().apply(&two_rows()).unwrap());
}

#[test]
fn an_unknown_feature_is_refused_by_name() {
    let mut raw = two_rows();
    raw.push(f32s("agee", &[1.0, 2.0]));
    let e = ctr().apply(&raw).unwrap_err();
    assert_eq!(e.kind(), "unknown_feature");
    assert!(e.is_client_error());
    assert!(e.to_string().starts_with("unknown feature 'agee'; the version takes 'age', 'price'"), "{e}");
    // A name the client chose is cut short in the message.
    let long = "x".repeat(1 << 20);
    let e = ctr().apply(&[f32s(&long, &[1.0])]).unwrap_err();
    assert_eq!(e.kind(), "unknown_feature");
    assert!(e.to_string().starts_with(&format!("unknown feature '{}…'; the version takes", &long[..64])), "{e}");
}

#[test]
fn a_missing_feature_without_default_is_refused() {
    let raw: Vec<Tensor> = two_rows().into_iter().filter(|t| t.name != "ad_id").collect();
    let e = ctr().apply(&raw).unwrap_err();
    assert_eq!((e.kind(), e.to_string().as_str()), ("missing_feature", "missing feature 'ad_id': it has no default"));
}

#[test]
fn nan_counts_as_missing_and_without_default_is_refused_with_its_row() {
    let mut raw = two_rows();
    raw[1] = f64s("price", &[1.0, f64::NAN]);
    let e = ctr().apply(&raw).unwrap_err();
    assert_eq!(
        (e.kind(), e.to_string().as_str()),
        ("missing_feature", "missing feature 'price' (row 1 is NaN): it has no default")
    );
}

#[test]
fn a_request_of_no_feature_is_refused() {
    let e = ctr().apply(&[]).unwrap_err();
    assert_eq!(e.kind(), "missing_feature");
    assert!(e.to_string().contains("sends no feature"), "{e}");
}

#[test]
fn values_of_the_wrong_type_are_refused() {
    let cases = [
        (
            texts("age", &["30", "40"]),
            "feature 'age': expected FP32, got BYTES (a numeric feature takes numbers, not text)",
        ),
        (f64s("age", &[30.0, 40.0]), "feature 'age': expected FP32, got FP64"),
        (i64s("ad_id", &[1, 2]), "feature 'ad_id': expected BYTES, got INT64 (a categorical feature takes text)"),
    ];
    for (wrong, message) in cases {
        let mut raw: Vec<Tensor> = two_rows().into_iter().filter(|t| t.name != wrong.name).collect();
        raw.push(wrong);
        let e = ctr().apply(&raw).unwrap_err();
        assert_eq!((e.kind(), e.to_string().as_str()), ("feature_type", message));
    }
}

#[test]
fn shapes_row_counts_and_data_that_disagree_are_refused() {
    let mut wide = f32s("age", &[1.0, 2.0]);
    wide.shape = vec![1, 2];
    let mut short = f32s("age", &[1.0, 2.0]);
    short.data = TensorData::Raw(vec![0; 7]);
    let mut negative = f32s("age", &[]);
    negative.shape = vec![-1];
    let cases = [
        (wide, "feature 'age': shape [1, 2]: a feature takes one value per row, [N] or [N, 1]"),
        (f32s("age", &[1.0, 2.0, 3.0]), "feature 'age': 3 rows differ from feature 'price' (2 rows)"),
        (short, "feature 'age': tensor 'age': shape [2] of FP32 needs 8 bytes, got 7"),
        (negative, "feature 'age': tensor 'age': shape [-1] is not a valid concrete shape"),
    ];
    for (wrong, message) in cases {
        let mut raw: Vec<Tensor> = two_rows().into_iter().filter(|t| t.name != "age").collect();
        raw.push(wrong);
        let e = ctr().apply(&raw).unwrap_err();
        assert_eq!((e.kind(), e.to_string().as_str()), ("feature_shape", message));
    }
}

#[test]
fn a_feature_sent_twice_is_refused() {
    let mut raw = two_rows();
    raw.push(f32s("age", &[1.0, 2.0]));
    let e = ctr().apply(&raw).unwrap_err();
    assert_eq!((e.kind(), e.to_string().as_str()), ("duplicate_feature", "feature 'age' given more than once"));
}

#[test]
fn zero_rows_give_empty_graph_inputs() {
    let raw = vec![f32s("age", &[]), f64s("price", &[]), i64s("hour", &[]), texts("ad_id", &[])];
    let out = ctr().apply(&raw).unwrap();
    let shapes: Vec<&[i64]> = out.iter().map(|t| t.shape.as_slice()).collect();
    assert_eq!(shapes, [&[0, 3][..], &[0][..], &[0, 2][..]]);
    assert!(out.iter().all(|t| t.check_consistent().is_ok()));
}
