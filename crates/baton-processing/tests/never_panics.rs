//! Whatever a client sends, `apply` answers without panicking; and what
//! it gives always fits the graph the worked example is written for.

mod common;

use baton_core::signature::{Signature, TensorSpec};
use baton_core::tensor::{DataType, Tensor, TensorData};
use common::ctr;
use proptest::prelude::*;

const NAMES: [&str; 8] = ["age", "price", "past_clicks", "hour", "ad_id", "site", "other", ""];

/// A tensor of any name, datatype and shape, with data that may or may
/// not agree with them.
fn any_tensor() -> impl Strategy<Value = Tensor> {
    let shape = prop::collection::vec(-2i64..5, 0..4);
    let data = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..80).prop_map(TensorData::Raw),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..12), 0..6).prop_map(TensorData::Bytes),
    ];
    (prop::sample::select(NAMES.to_vec()), prop::sample::select(DataType::ALL.to_vec()), shape, data)
        .prop_map(|(name, datatype, shape, data)| Tensor { name: name.into(), datatype, shape, data })
}

/// A well-formed feature of `rows` rows whose values are anything: NaN,
/// infinities, extremes of INT64, any bytes.
fn any_values(rows: usize) -> impl Strategy<Value = Tensor> {
    let f32s = prop::collection::vec(any::<f32>(), rows)
        .prop_map(|v| ("age", DataType::Fp32, v.iter().flat_map(|x| x.to_le_bytes()).collect()));
    let f64s = prop::collection::vec(any::<f64>(), rows)
        .prop_map(|v| ("price", DataType::Fp64, v.iter().flat_map(|x| x.to_le_bytes()).collect()));
    let i64s = (prop::sample::select(vec!["past_clicks", "hour"]), prop::collection::vec(any::<i64>(), rows))
        .prop_map(|(name, v)| (name, DataType::Int64, v.iter().flat_map(|x| x.to_le_bytes()).collect()));
    let n = i64::try_from(rows).unwrap();
    let raw = prop_oneof![f32s, f64s, i64s].prop_map(move |(name, datatype, bytes): (&str, DataType, Vec<u8>)| {
        Tensor { name: name.into(), datatype, shape: vec![n], data: TensorData::Raw(bytes) }
    });
    let text = (
        prop::sample::select(vec!["ad_id", "site"]),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), rows),
    )
        .prop_map(move |(name, items)| Tensor {
            name: name.into(),
            datatype: DataType::Bytes,
            shape: vec![n, 1],
            data: TensorData::Bytes(items),
        });
    prop_oneof![raw, text]
}

fn graph() -> Signature {
    let spec = |name: &str, datatype, shape: &[i64]| TensorSpec { name: name.into(), datatype, shape: shape.to_vec() };
    Signature {
        inputs: vec![
            spec("dense", DataType::Fp32, &[-1, 3]),
            spec("hour_bucket", DataType::Int64, &[-1]),
            spec("ids", DataType::Int64, &[-1, 2]),
        ],
        outputs: vec![],
    }
}

/// What every answer must be: graph inputs that fit the graph, or a
/// client error.
fn check(raw: &[Tensor]) -> Result<(), TestCaseError> {
    match ctr().apply(raw) {
        Ok(out) => prop_assert_eq!(graph().check_inputs(&out), Ok(())),
        Err(e) => prop_assert!(e.is_client_error(), "{}", e),
    }
    Ok(())
}

/// A request with every feature that has no default, of any values.
fn complete(rows: usize) -> impl Strategy<Value = Vec<Tensor>> {
    let n = rows;
    (
        prop::collection::vec(any::<f32>(), n),
        prop::collection::vec(any::<f64>(), n),
        prop::collection::vec(any::<i64>(), n),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), n),
    )
        .prop_map(|(age, price, hour, ad)| {
            let raw = |name: &str, datatype, bytes: Vec<u8>| Tensor {
                name: name.into(),
                datatype,
                shape: vec![i64::try_from(age.len()).unwrap()],
                data: TensorData::Raw(bytes),
            };
            vec![
                raw("age", DataType::Fp32, age.iter().flat_map(|x| x.to_le_bytes()).collect()),
                raw("price", DataType::Fp64, price.iter().flat_map(|x| x.to_le_bytes()).collect()),
                raw("hour", DataType::Int64, hour.iter().flat_map(|x| x.to_le_bytes()).collect()),
                Tensor {
                    name: "ad_id".into(),
                    datatype: DataType::Bytes,
                    shape: vec![i64::try_from(ad.len()).unwrap()],
                    data: TensorData::Bytes(ad),
                },
            ]
        })
}

proptest! {
    // No failure files in the source tree: a failure prints its minimal case.
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_tensors_never_panic(raw in prop::collection::vec(any_tensor(), 0..8)) {
        check(&raw)?;
    }

    #[test]
    fn arbitrary_values_never_panic(raw in (0usize..6).prop_flat_map(|rows| prop::collection::vec(any_values(rows), 1..8))) {
        check(&raw)?;
    }

    /// Every value is served except a NaN price, which has no default.
    #[test]
    fn complete_requests_are_served(raw in (0usize..6).prop_flat_map(complete)) {
        let price_nan = matches!(&raw[1].data, TensorData::Raw(b) if b.chunks_exact(8).any(|c| f64::from_le_bytes(c.try_into().unwrap()).is_nan()));
        match ctr().apply(&raw) {
            Ok(out) => {
                prop_assert!(!price_nan);
                prop_assert_eq!(graph().check_inputs(&out), Ok(()));
                let hours: Vec<i64> = common::ids(&out[1]);
                prop_assert!(hours.iter().all(|h| (0..=3).contains(h)));
                prop_assert!(common::ids(&out[2]).iter().all(|id| (0..100_000).contains(id)));
                let dense = out[0].to_f32().unwrap();
                prop_assert!(dense.chunks(3).all(|row| row[0].is_finite() && (0.0..=1.0).contains(&row[1])));
            }
            Err(e) => prop_assert!(price_nan && e.kind() == "missing_feature", "{}", e),
        }
    }
}
