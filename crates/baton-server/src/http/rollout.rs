//! Rollouts over REST, under `/baton/v1/models/{name}/rollout`: start
//! (`POST`), status (`GET`), and `pause`, `resume`, `promote`, `abort`.
//! Every answer is the rollout's status (`{"model", "serving",
//! "rollout"}`). Like every POST handler, each takes its body so the
//! connection stays usable (see [`super::manage::rollback`]).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use crate::app::App;
use crate::decisions::rollout;
use crate::rollout_start;

/// `POST /baton/v1/models/{name}/rollout` with an optional JSON body of
/// overrides ([`rollout_start::from_json`]).
pub async fn start(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let request = rollout_start::from_json(&body)?;
    Ok(Json(rollout::start(&app, &model, request.version, request.overrides).await?))
}

/// `GET /baton/v1/models/{name}/rollout`.
pub async fn status(State(app): State<Arc<App>>, Path(model): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(rollout::status(&app, &model)?))
}

/// The optional body of a pause.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    reason: Option<String>,
}

/// `POST /baton/v1/models/{name}/rollout/pause` with an optional
/// `{"reason": "..."}`.
pub async fn pause(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let body: PauseBody = super::repository::parse_body(&body)?;
    Ok(Json(rollout::pause(&app, &model, body.reason).await?))
}

/// `POST /baton/v1/models/{name}/rollout/resume`.
pub async fn resume(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    _body: Bytes,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(rollout::resume(&app, &model).await?))
}

/// `POST /baton/v1/models/{name}/rollout/promote`.
pub async fn promote(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    _body: Bytes,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(rollout::promote(&app, &model).await?))
}

/// `POST /baton/v1/models/{name}/rollout/abort`.
pub async fn abort(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    _body: Bytes,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(rollout::abort(&app, &model).await?))
}
