//! `features.toml` as written: the tables and keys serde reads, every one
//! refusing keys it does not know. Meaning and bounds are checked after,
//! in `validate`.

use baton_core::tensor::DataType;
use serde::Deserialize;

/// One `[[feature]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FeatureDecl {
    pub name: String,
    pub datatype: DataType,
    pub graph_input: String,
    #[serde(default)]
    pub default: Option<DefaultDecl>,
    #[serde(default)]
    pub clip: Option<ClipDecl>,
    #[serde(default)]
    pub scale_to_z_score: Option<ZScoreDecl>,
    #[serde(default)]
    pub scale_by_min_max: Option<MinMaxDecl>,
    #[serde(default)]
    pub bucketize: Option<BucketizeDecl>,
    #[serde(default)]
    pub hash_strings: Option<HashDecl>,
}

/// A default: a number for a numeric feature, text for a categorical one.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum DefaultDecl {
    Number(f64),
    Text(String),
}

/// `clip = { min = .., max = .. }`; either bound may be left out.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClipDecl {
    pub min: Option<f64>,
    pub max: Option<f64>,
}

/// `scale_to_z_score = { mean = .., std = .. }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ZScoreDecl {
    pub mean: f64,
    pub std: f64,
}

/// `scale_by_min_max = { min = .., max = .., output_min = 0, output_max = 1 }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MinMaxDecl {
    pub min: f64,
    pub max: f64,
    pub output_min: Option<f64>,
    pub output_max: Option<f64>,
}

/// `bucketize = { boundaries = [..] }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BucketizeDecl {
    pub boundaries: Vec<f64>,
}

/// `hash_strings = { hash = "murmur3_x86_32", seed = .., buckets = .. }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HashDecl {
    pub hash: String,
    pub seed: u32,
    pub buckets: u64,
}

/// One `[graph_input.NAME]` table: how a graph input is laid out.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GraphInputDecl {
    pub datatype: Option<DataType>,
    pub rank: Option<u8>,
}
