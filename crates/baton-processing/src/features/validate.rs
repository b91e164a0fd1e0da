//! From the text of `features.toml` to a [`FeatureSpec`], refusing what
//! serving could not honour: unknown keys, non-finite parameters, empty or
//! inverted ranges, unsorted boundaries, zero buckets, graph inputs that
//! mix floats and ids. Each refusal names the feature (or graph input) and
//! the key.

use baton_core::tensor::DataType;

use super::decl::{DefaultDecl, FeatureDecl, GraphInputDecl};
use super::error::FeatureError;
use super::hash::MURMUR3_X86_32;
use super::transform::{Clip, HashOp, NumericOp};
use super::{Feature, FeatureSpec, GraphInput, Kind};

/// The most buckets a hash gives: its hash has 32 bits.
const MAX_HASH_BUCKETS: u64 = 1 << 32;

/// Parses and validates the text of a `features.toml`.
pub(crate) fn parse(text: &str) -> Result<FeatureSpec, FeatureError> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| syntax(text, &e))?;
    for key in table.keys() {
        if key != "feature" && key != "graph_input" {
            return Err(FeatureError::invalid(
                "file",
                format!("unknown key '{key}'; the file has [[feature]] and [graph_input.NAME] tables"),
            ));
        }
    }
    let items = match table.get("feature") {
        Some(toml::Value::Array(items)) if !items.is_empty() => items,
        Some(toml::Value::Array(_)) | None => {
            return Err(FeatureError::invalid("file", "no [[feature]] table: declare at least one feature"));
        }
        Some(_) => return Err(FeatureError::invalid("file", "'feature' must be an array of tables ([[feature]])")),
    };
    let mut features: Vec<Feature> = Vec::with_capacity(items.len());
    let mut inputs: Vec<String> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = match item.get("name").and_then(toml::Value::as_str) {
            Some(name) => format!("feature '{name}'"),
            None => format!("feature #{}", i + 1),
        };
        let table = item.as_table().ok_or_else(|| FeatureError::invalid(&at, "must be a table ([[feature]])"))?;
        let decl = FeatureDecl::from_table(table).map_err(|message| FeatureError::invalid(&at, message))?;
        if decl.name.is_empty() {
            return Err(FeatureError::invalid(&at, "name must not be empty"));
        }
        if features.iter().any(|f| f.name == decl.name) {
            return Err(FeatureError::invalid(&at, "name: declared more than once"));
        }
        if decl.graph_input.is_empty() {
            return Err(FeatureError::invalid(&at, "graph_input must not be empty"));
        }
        let graph_input = match inputs.iter().position(|n| *n == decl.graph_input) {
            Some(index) => index,
            None => {
                inputs.push(decl.graph_input.clone());
                inputs.len() - 1
            }
        };
        let kind = kind(&decl).map_err(|message| FeatureError::invalid(&at, message))?;
        features.push(Feature { name: decl.name, datatype: decl.datatype, kind, graph_input });
    }
    let layouts = graph_input_tables(&table, &inputs)?;
    let graph_inputs = inputs
        .into_iter()
        .zip(layouts)
        .enumerate()
        .map(|(index, (name, layout))| graph_input(index, name, layout, &features))
        .collect::<Result<_, _>>()?;
    Ok(FeatureSpec { features, graph_inputs })
}

/// The `[graph_input.NAME]` tables, one per graph input in `inputs` order
/// (empty where the file has none); a table no feature feeds is refused.
fn graph_input_tables(table: &toml::Table, inputs: &[String]) -> Result<Vec<GraphInputDecl>, FeatureError> {
    let mut layouts: Vec<GraphInputDecl> = inputs.iter().map(|_| GraphInputDecl::default()).collect();
    let Some(declared) = table.get("graph_input") else { return Ok(layouts) };
    let Some(declared) = declared.as_table() else {
        return Err(FeatureError::invalid("file", "'graph_input' must be a table of tables ([graph_input.NAME])"));
    };
    for (name, value) in declared {
        let at = format!("graph_input '{name}'");
        let index = inputs
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| FeatureError::invalid(&at, "no feature names it as its graph_input"))?;
        layouts[index] =
            value.clone().try_into().map_err(|e: toml::de::Error| FeatureError::invalid(&at, e.message()))?;
    }
    Ok(layouts)
}

/// One graph input: its features in file order, its datatype and rank.
fn graph_input(
    index: usize,
    name: String,
    layout: GraphInputDecl,
    features: &[Feature],
) -> Result<GraphInput, FeatureError> {
    let at = format!("graph_input '{name}'");
    let fed: Vec<usize> = (0..features.len()).filter(|&f| features[f].graph_input == index).collect();
    let first = &features[fed[0]];
    if let Some(other) = fed.iter().map(|&f| &features[f]).find(|f| f.kind.gives_ids() != first.kind.gives_ids()) {
        let (ids, floats) = if first.kind.gives_ids() { (first, other) } else { (other, first) };
        return Err(FeatureError::invalid(
            &at,
            format!(
                "feature '{}' gives ids and feature '{}' gives floats; one graph input takes one or the other",
                ids.name, floats.name
            ),
        ));
    }
    let ids = first.kind.gives_ids();
    let datatype = layout.datatype.unwrap_or(if ids { DataType::Int64 } else { DataType::Fp32 });
    let allowed: &[DataType] =
        if ids { &[DataType::Int64, DataType::Int32] } else { &[DataType::Fp32, DataType::Fp64] };
    if !allowed.contains(&datatype) {
        let what = if ids { "ids (bucketize, hash_strings)" } else { "floats" };
        return Err(FeatureError::invalid(
            &at,
            format!("datatype {datatype}: its features give {what}, which go to {} or {}", allowed[0], allowed[1]),
        ));
    }
    let too_large = |f: &&Feature| f.kind.largest_id() > i64::from(i32::MAX);
    if let Some(f) = fed.iter().map(|&f| &features[f]).find(too_large).filter(|_| datatype == DataType::Int32) {
        return Err(FeatureError::invalid(
            &at,
            format!("datatype INT32: feature '{}' gives ids up to {}, beyond INT32", f.name, f.kind.largest_id()),
        ));
    }
    let rank = layout.rank.unwrap_or(2);
    match rank {
        2 => {}
        1 if fed.len() == 1 => {}
        1 => {
            return Err(FeatureError::invalid(
                &at,
                format!("rank 1 holds one feature per row, and {} features feed it", fed.len()),
            ));
        }
        _ => return Err(FeatureError::invalid(&at, format!("rank {rank}: 1 ([N]) or 2 ([N, width])"))),
    }
    Ok(GraphInput { name, datatype, rank, features: fed })
}

/// What a feature does, or why its keys do not make sense together.
fn kind(decl: &FeatureDecl) -> Result<Kind, String> {
    let transforms: Vec<&str> = [
        ("scale_to_z_score", decl.scale_to_z_score.is_some()),
        ("scale_by_min_max", decl.scale_by_min_max.is_some()),
        ("bucketize", decl.bucketize.is_some()),
        ("hash_strings", decl.hash_strings.is_some()),
    ]
    .into_iter()
    .filter_map(|(key, given)| given.then_some(key))
    .collect();
    if transforms.len() > 1 {
        return Err(format!("{} and {}: a feature has at most one transform", transforms[0], transforms[1]));
    }
    match decl.datatype {
        DataType::Bytes => categorical(decl),
        DataType::Fp32 | DataType::Fp64 | DataType::Int64 => numeric(decl),
        other => Err(format!("datatype {other}: a feature is FP32, FP64 or INT64 (numeric) or BYTES (categorical)")),
    }
}

/// A BYTES feature: hashed, with an optional text default.
fn categorical(decl: &FeatureDecl) -> Result<Kind, String> {
    if decl.clip.is_some() {
        return Err("clip: only numeric features are clipped".into());
    }
    for (key, given) in [
        ("scale_to_z_score", decl.scale_to_z_score.is_some()),
        ("scale_by_min_max", decl.scale_by_min_max.is_some()),
        ("bucketize", decl.bucketize.is_some()),
    ] {
        if given {
            return Err(format!("{key}: a BYTES feature is categorical; it takes hash_strings"));
        }
    }
    let Some(hash) = &decl.hash_strings else {
        return Err("hash_strings: a BYTES feature needs it, to become an id".into());
    };
    if hash.hash != MURMUR3_X86_32 {
        return Err(format!("hash_strings.hash: unknown hash '{}'; baton has '{MURMUR3_X86_32}'", hash.hash));
    }
    if hash.buckets == 0 || hash.buckets > MAX_HASH_BUCKETS {
        return Err(format!("hash_strings.buckets must be 1 to {MAX_HASH_BUCKETS} (2^32), got {}", hash.buckets));
    }
    let default = match &decl.default {
        None => None,
        Some(DefaultDecl::Text(text)) => Some(text.as_bytes().to_vec()),
        Some(DefaultDecl::Number(n)) => return Err(format!("default: a BYTES feature's default is text, got {n}")),
    };
    Ok(Kind::Categorical { default, op: HashOp { seed: hash.seed, buckets: hash.buckets } })
}

/// A numeric feature: default, clip and one of the numeric transforms.
fn numeric(decl: &FeatureDecl) -> Result<Kind, String> {
    if decl.hash_strings.is_some() {
        return Err(format!("hash_strings: a {} feature is numeric; hashing takes BYTES", decl.datatype));
    }
    let default = match &decl.default {
        None => None,
        Some(DefaultDecl::Number(n)) => Some(finite("default", *n)?),
        Some(DefaultDecl::Text(t)) => {
            return Err(format!("default: a numeric feature's default is a number, got '{t}'"));
        }
    };
    let clip = match &decl.clip {
        None => Clip::default(),
        Some(c) => {
            let min = c.min.map(|v| finite("clip.min", v)).transpose()?;
            let max = c.max.map(|v| finite("clip.max", v)).transpose()?;
            match (min, max) {
                (None, None) => return Err("clip: give min, max or both".into()),
                (Some(lo), Some(hi)) if lo >= hi => {
                    return Err(format!("clip.min ({lo}) must be below clip.max ({hi})"));
                }
                _ => Clip { min, max },
            }
        }
    };
    let op = if let Some(z) = &decl.scale_to_z_score {
        let mean = finite("scale_to_z_score.mean", z.mean)?;
        let std = finite("scale_to_z_score.std", z.std)?;
        if std <= 0.0 {
            return Err(format!("scale_to_z_score.std must be > 0, got {std}"));
        }
        NumericOp::ZScore { mean, std }
    } else if let Some(m) = &decl.scale_by_min_max {
        let min = finite("scale_by_min_max.min", m.min)?;
        let max = finite("scale_by_min_max.max", m.max)?;
        let output_min = finite("scale_by_min_max.output_min", m.output_min.unwrap_or(0.0))?;
        let output_max = finite("scale_by_min_max.output_max", m.output_max.unwrap_or(1.0))?;
        if min >= max {
            return Err(format!("scale_by_min_max.min ({min}) must be below scale_by_min_max.max ({max})"));
        }
        if output_min >= output_max {
            return Err(format!(
                "scale_by_min_max.output_min ({output_min}) must be below scale_by_min_max.output_max ({output_max})"
            ));
        }
        NumericOp::MinMax { min, max, output_min, output_max }
    } else if let Some(b) = &decl.bucketize {
        if b.boundaries.is_empty() {
            return Err("bucketize.boundaries is empty: give at least one boundary (two buckets)".into());
        }
        for (i, &v) in b.boundaries.iter().enumerate() {
            finite(&format!("bucketize.boundaries[{i}]"), v)?;
            if i > 0 && v <= b.boundaries[i - 1] {
                return Err(format!(
                    "bucketize.boundaries must increase strictly: boundaries[{i}] = {v} follows {}",
                    b.boundaries[i - 1]
                ));
            }
        }
        NumericOp::Bucketize { boundaries: b.boundaries.clone() }
    } else {
        NumericOp::Identity
    };
    Ok(Kind::Numeric { default, clip, op })
}

/// A TOML syntax error, on one line, with the line it is on.
fn syntax(text: &str, e: &toml::de::Error) -> FeatureError {
    let message = e.message().trim().replace('\n', "; ");
    match e.span() {
        Some(span) => {
            let line = text.get(..span.start).map_or(0, |before| before.matches('\n').count()) + 1;
            FeatureError::invalid(format!("line {line}"), message)
        }
        None => FeatureError::invalid("file", message),
    }
}

/// `value`, or why a parameter must be finite.
fn finite(key: &str, value: f64) -> Result<f64, String> {
    if value.is_finite() { Ok(value) } else { Err(format!("{key} must be finite, got {value}")) }
}
