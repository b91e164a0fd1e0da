//! Why a feature spec cannot be loaded, or a request's raw features cannot
//! be turned into the graph's inputs.

use baton_core::signature::names;

/// A name the client chose, quoted and cut short as lists of names are:
/// an error message does not echo a megabyte back.
fn shown(name: &str) -> String {
    names(&[name.to_owned()])
}

/// A feature-transform failure. Load-time kinds (`feature_spec_invalid`,
/// `feature_spec_mismatch`) refuse a version; the others are the client's
/// mistake in one request. Every message names the feature or graph input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FeatureError {
    /// `features.toml` cannot be read or says something baton refuses.
    #[error("features.toml: {at}: {message}")]
    Invalid {
        /// Where: `feature 'age'`, `graph_input 'dense'`, or `file`.
        at: String,
        /// What is wrong, naming the key.
        message: String,
    },
    /// The transforms' outputs do not fit the graph's inputs.
    #[error("features.toml does not fit the graph: {0}")]
    Mismatch(String),
    /// The request sends a feature the version does not declare.
    #[error("unknown feature {}; the version takes {}", shown(.name), names(.expected))]
    UnknownFeature {
        /// The request's feature.
        name: String,
        /// The declared features, in file order.
        expected: Vec<String>,
    },
    /// A feature without a default is absent, or one of its values is NaN.
    #[error("missing feature '{name}'{}: it has no default", .row.map(|r| format!(" (row {r} is NaN)")).unwrap_or_default())]
    MissingFeature {
        /// The feature.
        name: String,
        /// The first row whose value is NaN, when the tensor was sent.
        row: Option<usize>,
    },
    /// The request sends no feature at all, so the number of rows is
    /// unknown even when every feature has a default.
    #[error("the request sends no feature; send at least one so that the number of rows is known")]
    NoFeatures,
    /// A feature's values have the wrong type: text for a numeric feature,
    /// numbers for a categorical one, or another numeric datatype.
    #[error("feature '{name}': expected {expected}, got {got}")]
    FeatureType {
        /// The feature.
        name: String,
        /// The declared datatype.
        expected: String,
        /// The request's.
        got: String,
    },
    /// A feature's tensor is not one value per row, disagrees with the
    /// other features on the number of rows, or its data with its shape.
    #[error("feature '{name}': {message}")]
    FeatureShape {
        /// The feature.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The request sends a feature twice.
    #[error("feature {} given more than once", shown(.name))]
    Duplicate {
        /// The feature.
        name: String,
    },
}

impl FeatureError {
    /// A stable, machine-readable name for the kind of failure:
    /// `feature_spec_invalid` and `feature_spec_mismatch` at load;
    /// `unknown_feature`, `missing_feature`, `feature_type`,
    /// `feature_shape` and `duplicate_feature` for a request.
    pub fn kind(&self) -> &'static str {
        match self {
            FeatureError::Invalid { .. } => "feature_spec_invalid",
            FeatureError::Mismatch(_) => "feature_spec_mismatch",
            FeatureError::UnknownFeature { .. } => "unknown_feature",
            FeatureError::MissingFeature { .. } | FeatureError::NoFeatures => "missing_feature",
            FeatureError::FeatureType { .. } => "feature_type",
            FeatureError::FeatureShape { .. } => "feature_shape",
            FeatureError::Duplicate { .. } => "duplicate_feature",
        }
    }

    /// Whether the request is at fault (as opposed to the version's files).
    pub fn is_client_error(&self) -> bool {
        !matches!(self, FeatureError::Invalid { .. } | FeatureError::Mismatch(_))
    }

    /// A refusal of the file at `at` (e.g. `feature 'age'`).
    pub(crate) fn invalid(at: impl Into<String>, message: impl Into<String>) -> FeatureError {
        FeatureError::Invalid { at: at.into(), message: message.into() }
    }
}
