//! `features.toml` as written: the tables and keys serde reads, every one
//! refusing keys it does not know. Meaning and bounds are checked after,
//! in `validate`.

use baton_core::tensor::DataType;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// One `[[feature]]` table, read key by key so that every error names
/// its key.
#[derive(Debug)]
pub(crate) struct FeatureDecl {
    pub name: String,
    pub datatype: DataType,
    pub graph_input: String,
    pub default: Option<DefaultDecl>,
    pub clip: Option<ClipDecl>,
    pub scale_to_z_score: Option<ZScoreDecl>,
    pub scale_by_min_max: Option<MinMaxDecl>,
    pub bucketize: Option<BucketizeDecl>,
    pub hash_strings: Option<HashDecl>,
}

/// The keys a `[[feature]]` table takes.
const FEATURE_KEYS: [&str; 9] = [
    "name",
    "datatype",
    "graph_input",
    "default",
    "clip",
    "scale_to_z_score",
    "scale_by_min_max",
    "bucketize",
    "hash_strings",
];

impl FeatureDecl {
    /// Reads one `[[feature]]` table; the error names the key.
    pub fn from_table(table: &toml::Table) -> Result<FeatureDecl, String> {
        if let Some(key) = table.keys().find(|k| !FEATURE_KEYS.contains(&k.as_str())) {
            return Err(format!("unknown key '{key}'; a feature takes {}", FEATURE_KEYS.join(", ")));
        }
        Ok(FeatureDecl {
            name: required(table, "name")?,
            datatype: required(table, "datatype")?,
            graph_input: required(table, "graph_input")?,
            default: optional(table, "default")?,
            clip: optional(table, "clip")?,
            scale_to_z_score: optional(table, "scale_to_z_score")?,
            scale_by_min_max: optional(table, "scale_by_min_max")?,
            bucketize: optional(table, "bucketize")?,
            hash_strings: optional(table, "hash_strings")?,
        })
    }
}

/// The value of `key`, or an error naming it.
fn optional<T: DeserializeOwned>(table: &toml::Table, key: &str) -> Result<Option<T>, String> {
    table
        .get(key)
        .map(|v| v.clone().try_into().map_err(|e: toml::de::Error| format!("{key}: {}", e.message())))
        .transpose()
}

/// The value of `key`, which must be there.
fn required<T: DeserializeOwned>(table: &toml::Table, key: &str) -> Result<T, String> {
    optional(table, key)?.ok_or_else(|| format!("{key} is required"))
}

/// A default: a number for a numeric feature, text for a categorical one.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a number (numeric feature) or a string (categorical feature)")]
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
