//! Business outcomes over REST: `POST /baton/v1/models/{name}/outcomes`,
//! in the inference scope, with a batch of the outcome ids answers carried
//! (`baton_outcome_id`) and what followed each:
//!
//! ```json
//! {"outcomes": [{"id": "o1f2e…", "value": 1.0}, {"id": "o1f2e…"}]}
//! ```
//!
//! A value left out is 1 (a click, a conversion); an order's value is
//! posted as it is. The batch is checked whole before anything counts: a
//! malformed item is a 400 that names it, and nothing of the batch is
//! counted. Ids of no rollout in progress (an ended one, say) are not
//! errors; the answer counts them apart:
//! `{"accepted": 2, "duplicate": 0, "unknown": 0}`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use baton_core::rollout::outcome::{PostError, Posted};
use serde::Deserialize;

use super::error::ApiError;
use crate::app::App;
use crate::error::{Class, ServeError};

/// Outcomes one request may carry.
pub const MAX_BATCH: usize = 10_000;

/// The body of a post.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Batch {
    outcomes: Vec<Item>,
}

/// One outcome.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Item {
    id: String,
    #[serde(default = "one")]
    value: f64,
}

fn one() -> f64 {
    1.0
}

/// `POST /baton/v1/models/{name}/outcomes`.
pub async fn post(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    body: Bytes,
) -> Result<Json<Posted>, ApiError> {
    let batch: Batch = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_json",
            format!("request body: {e}; expected {{\"outcomes\": [{{\"id\": …, \"value\": …}}]}}"),
        )
    })?;
    if batch.outcomes.len() > MAX_BATCH {
        return Err(ApiError::bad_request(
            "invalid_outcome",
            format!("a batch holds at most {MAX_BATCH} outcomes, not {}", batch.outcomes.len()),
        ));
    }
    let posted: Vec<(&str, f64)> = batch.outcomes.iter().map(|i| (i.id.as_str(), i.value)).collect();
    let counted = app.registry.post_outcomes(&model, &posted).map_err(|e| match e {
        PostError::UnknownModel(_) => ServeError::unknown_model(&model),
        PostError::Malformed { .. } => ServeError::new(Class::BadRequest, e.kind(), e.to_string()),
    })?;
    app.metrics.outcomes(&model, &counted);
    Ok(Json(counted))
}
