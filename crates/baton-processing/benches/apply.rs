//! What transforming a request costs: the worked CTR example of
//! docs/features.md (six features into three graph inputs) applied to
//! batches of 1, 64 and 1024 rows.

use std::hint::black_box;

use baton_core::tensor::{DataType, Tensor, TensorData};
use baton_processing::features::FeatureSpec;
use criterion::{Criterion, criterion_group, criterion_main};

/// A `[rows]` tensor of fixed-size elements.
fn column(name: &str, datatype: DataType, bytes: Vec<u8>, rows: usize) -> Tensor {
    Tensor { name: name.into(), datatype, shape: vec![rows as i64], data: TensorData::Raw(bytes) }
}

/// The request of `rows` rows: four features sent, two left to defaults.
fn request(rows: usize) -> Vec<Tensor> {
    let ages: Vec<u8> = (0..rows).flat_map(|r| (20.0 + (r % 50) as f32).to_le_bytes()).collect();
    let prices: Vec<u8> = (0..rows).flat_map(|r| (r as f64 * 1.5).to_le_bytes()).collect();
    let hours: Vec<u8> = (0..rows).flat_map(|r| ((r % 24) as i64).to_le_bytes()).collect();
    let ads = (0..rows).map(|r| format!("ad-{r}").into_bytes()).collect();
    vec![
        column("age", DataType::Fp32, ages, rows),
        column("price", DataType::Fp64, prices, rows),
        column("hour", DataType::Int64, hours, rows),
        Tensor {
            name: "ad_id".into(),
            datatype: DataType::Bytes,
            shape: vec![rows as i64],
            data: TensorData::Bytes(ads),
        },
    ]
}

fn apply(c: &mut Criterion) {
    let spec = FeatureSpec::parse(include_str!("../tests/data/ctr.features.toml")).unwrap();
    for rows in [1, 64, 1024] {
        let raw = request(rows);
        c.bench_function(&format!("features_apply_ctr_{rows}_rows"), |b| {
            b.iter(|| spec.apply(black_box(&raw)).unwrap())
        });
    }
}

criterion_group!(benches, apply);
criterion_main!(benches);
