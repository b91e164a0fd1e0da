//! Feature transforms that ship with a version: `features.toml` in the
//! version's directory says how raw named features a client sends become
//! the graph's input tensors. The normalization a model was trained with
//! is then versioned with its weights, and a retrained model with new
//! parameters cannot meet features computed the old way.
//!
//! ```toml
//! [[feature]]
//! name = "age"                  # the raw input a client sends
//! datatype = "FP32"             # FP32, FP64 or INT64; BYTES for categorical
//! graph_input = "dense"         # features of one graph input are concatenated in file order
//! default = 35.0                # when absent, or NaN; without it, the request is refused
//! clip = { min = 0.0, max = 100.0 }
//! scale_to_z_score = { mean = 38.2, std = 12.5 }
//!
//! [[feature]]
//! name = "ad_id"
//! datatype = "BYTES"
//! graph_input = "ad_bucket"
//! hash_strings = { hash = "murmur3_x86_32", seed = 0, buckets = 100000 }
//!
//! [graph_input.ad_bucket]
//! rank = 1                      # [N] rather than [N, 1]
//! ```
//!
//! Each transform's arithmetic, and why this format, are in
//! `docs/features.md`. Parsing refuses anything it does not understand
//! ([`FeatureError::Invalid`]); [`FeatureSpec::check_against`] refuses a
//! spec that does not give the graph's inputs; [`FeatureSpec::apply`]
//! turns one request's raw features into the graph's inputs.

mod assemble;
mod columns;
mod decl;
mod error;
mod graph;
pub mod hash;
mod transform;
mod validate;

use std::path::Path;

use baton_core::tensor::{DataType, Tensor};

pub use error::FeatureError;
use transform::{Clip, HashOp, NumericOp};

/// The file a version's directory declares its features in.
pub const FILE: &str = "features.toml";

/// A validated `features.toml`: the features in file order and the graph
/// inputs they give.
#[derive(Clone, Debug, PartialEq)]
pub struct FeatureSpec {
    features: Vec<Feature>,
    graph_inputs: Vec<GraphInput>,
}

/// One declared feature.
#[derive(Clone, Debug, PartialEq)]
struct Feature {
    /// The raw input's name.
    name: String,
    /// The raw input's datatype.
    datatype: DataType,
    /// What happens to its values.
    kind: Kind,
    /// Index into `FeatureSpec::graph_inputs`.
    graph_input: usize,
}

/// What a feature does to its values.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    /// FP32, FP64 or INT64: default, clip, then a numeric transform.
    Numeric { default: Option<f64>, clip: Clip, op: NumericOp },
    /// BYTES: default, then hashed into a bucket id.
    Categorical { default: Option<Vec<u8>>, op: HashOp },
}

impl Kind {
    /// Whether the feature gives ids (to an integer graph input).
    fn gives_ids(&self) -> bool {
        match self {
            Kind::Numeric { op, .. } => op.gives_ids(),
            Kind::Categorical { .. } => true,
        }
    }

    /// The largest id the feature can give (0 for floats).
    fn largest_id(&self) -> i64 {
        let largest = match self {
            Kind::Numeric { op: NumericOp::Bucketize { boundaries }, .. } => boundaries.len() as u64,
            Kind::Numeric { .. } => 0,
            Kind::Categorical { op, .. } => op.buckets - 1,
        };
        i64::try_from(largest).unwrap_or(i64::MAX)
    }
}

/// One graph input the features give.
#[derive(Clone, Debug, PartialEq)]
struct GraphInput {
    /// The graph's input name.
    name: String,
    /// FP32 or FP64 for floats, INT64 or INT32 for ids.
    datatype: DataType,
    /// 2 for `[N, width]`, 1 for `[N]` (width 1 only).
    rank: u8,
    /// Indices into `FeatureSpec::features`, in file order: its columns.
    features: Vec<usize>,
}

impl FeatureSpec {
    /// Reads `features.toml` in a version's directory: `Ok(None)` when the
    /// version has none, an error naming the feature and key when it says
    /// something baton refuses.
    pub fn read(dir: &Path) -> Result<Option<FeatureSpec>, FeatureError> {
        let path = dir.join(FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => FeatureSpec::parse(&text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(FeatureError::invalid("file", format!("reading {}: {e}", path.display()))),
        }
    }

    /// Parses and validates the text of a `features.toml`.
    pub fn parse(text: &str) -> Result<FeatureSpec, FeatureError> {
        validate::parse(text)
    }

    /// Turns one request's raw features (a batch of N rows, each tensor
    /// `[N]` or `[N, 1]`) into the graph's input tensors, in the order of
    /// [`FeatureSpec::outputs`].
    pub fn apply(&self, raw: &[Tensor]) -> Result<Vec<Tensor>, FeatureError> {
        let (rows, columns) = columns::columns(self, raw)?;
        Ok(assemble::assemble(self, rows, &columns))
    }
}
