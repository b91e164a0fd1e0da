//! From the request's raw tensors to one column of transformed values per
//! feature: each tensor matched to its feature, checked (datatype, one
//! value per row, one row count for all), missing values defaulted, then
//! clipped and transformed.

use baton_core::tensor::{DataType, Tensor, TensorData};

use super::error::FeatureError;
use super::transform::Value;
use super::{Feature, FeatureSpec, Kind};

/// The row count and, per feature in file order, its transformed column.
pub(crate) fn columns(spec: &FeatureSpec, raw: &[Tensor]) -> Result<(usize, Vec<Vec<Value>>), FeatureError> {
    let mut given: Vec<Option<&Tensor>> = vec![None; spec.features.len()];
    let mut rows: Option<(usize, &str)> = None;
    for tensor in raw {
        let index =
            spec.features.iter().position(|f| f.name == tensor.name).ok_or_else(|| FeatureError::UnknownFeature {
                name: tensor.name.clone(),
                expected: spec.features.iter().map(|f| f.name.clone()).collect(),
            })?;
        if given[index].is_some() {
            return Err(FeatureError::Duplicate { name: tensor.name.clone() });
        }
        let count = check(&spec.features[index], tensor)?;
        match rows {
            None => rows = Some((count, &tensor.name)),
            Some((first, first_name)) if first != count => {
                return Err(FeatureError::FeatureShape {
                    name: tensor.name.clone(),
                    message: format!("{count} rows differ from feature '{first_name}' ({first} rows)"),
                });
            }
            Some(_) => {}
        }
        given[index] = Some(tensor);
    }
    let (rows, _) = rows.ok_or(FeatureError::NoFeatures)?;
    let columns = spec
        .features
        .iter()
        .zip(given)
        .map(|(feature, tensor)| column(feature, tensor, rows))
        .collect::<Result<_, _>>()?;
    Ok((rows, columns))
}

/// Checks a tensor against its feature and gives its row count.
fn check(feature: &Feature, tensor: &Tensor) -> Result<usize, FeatureError> {
    if tensor.datatype != feature.datatype {
        let got = match (feature.datatype, tensor.datatype) {
            (DataType::Bytes, got) => format!("{got} (a categorical feature takes text)"),
            (_, DataType::Bytes) => "BYTES (a numeric feature takes numbers, not text)".to_owned(),
            (_, got) => got.to_string(),
        };
        return Err(FeatureError::FeatureType {
            name: feature.name.clone(),
            expected: feature.datatype.to_string(),
            got,
        });
    }
    let shape_error = |message: String| FeatureError::FeatureShape { name: feature.name.clone(), message };
    tensor.check_consistent().map_err(shape_error)?;
    match tensor.shape.as_slice() {
        [n] | [n, 1] => usize::try_from(*n).map_err(|_| shape_error(format!("shape {:?} is negative", tensor.shape))),
        other => Err(shape_error(format!("shape {other:?}: a feature takes one value per row, [N] or [N, 1]"))),
    }
}

/// One feature's transformed values, from its tensor or its default.
fn column(feature: &Feature, tensor: Option<&Tensor>, rows: usize) -> Result<Vec<Value>, FeatureError> {
    let missing = |row| FeatureError::MissingFeature { name: feature.name.clone(), row };
    match &feature.kind {
        Kind::Numeric { default, clip, op } => {
            let values = match tensor {
                Some(t) => numbers(t),
                None => vec![default.ok_or_else(|| missing(None))?; rows],
            };
            values
                .into_iter()
                .enumerate()
                .map(|(row, x)| {
                    let x = if x.is_nan() { default.ok_or_else(|| missing(Some(row)))? } else { x };
                    Ok(op.apply(clip.apply(x)))
                })
                .collect()
        }
        Kind::Categorical { default, op } => match (tensor.map(|t| &t.data), default) {
            (Some(TensorData::Bytes(items)), _) => Ok(items.iter().map(|item| op.apply(item)).collect()),
            // Checked before: a BYTES tensor holds byte strings.
            (Some(TensorData::Raw(_)), _) => Err(FeatureError::FeatureShape {
                name: feature.name.clone(),
                message: "BYTES data given as fixed-size elements".into(),
            }),
            (None, Some(default)) => Ok(vec![op.apply(default); rows]),
            (None, None) => Err(missing(None)),
        },
    }
}

/// The elements of a checked numeric tensor as `f64` (INT64 beyond 2^53
/// rounds to the nearest `f64`).
fn numbers(tensor: &Tensor) -> Vec<f64> {
    let TensorData::Raw(bytes) = &tensor.data else { return Vec::new() };
    match tensor.datatype {
        DataType::Fp32 => {
            bytes.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect()
        }
        DataType::Fp64 => bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default())).collect(),
        DataType::Int64 => {
            bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()) as f64).collect()
        }
        _ => Vec::new(),
    }
}
