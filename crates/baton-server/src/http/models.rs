//! Health, server metadata, model metadata, model readiness and Triton's
//! model configuration.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::error::ApiError;
use crate::app::App;
use crate::error::Class;
use crate::serving::{max_batch_size, not_serving, parse_version, platform, resolve};

/// Protocol extensions baton speaks.
pub const EXTENSIONS: [&str; 4] = ["binary_tensor_data", "model_repository", "model_configuration", "baton_management"];

/// `GET /v2/health/live`.
pub async fn live() -> Json<serde_json::Value> {
    Json(json!({ "live": true }))
}

/// `GET /v2/health/ready`: 200 when ready, else 503 with what it waits for;
/// either way, the models given up on and why (`cannot_serve`, when any:
/// kind and stage for anyone, the message for a privileged caller, as it
/// may name repository paths and what a store answered).
pub async fn ready(
    State(app): State<Arc<App>>,
    privileged: Option<axum::Extension<crate::access::Privileged>>,
) -> Response {
    let privileged = privileged.is_some_and(|p| p.0.0);
    let ready = app.ready();
    let snapshot = app.registry.snapshot();
    let cannot_serve: serde_json::Map<String, serde_json::Value> =
        app.findings(|f| f.cannot_serve.iter().map(|(m, c)| (m.clone(), c.view(privileged))).collect());
    let mut body = json!({ "ready": ready });
    if !cannot_serve.is_empty() {
        body["cannot_serve"] = json!(cannot_serve);
    }
    if ready {
        return Json(body).into_response();
    }
    let waiting: Vec<String> = app.required().into_iter().filter(|m| !snapshot.serves(m)).collect();
    body["draining"] = json!(app.draining());
    body["waiting_for"] = json!(waiting);
    if let Some(reason) = app.unservable().filter(|_| !snapshot.models().keys().any(|m| snapshot.serves(m))) {
        body["reason"] = json!(reason);
    }
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// `GET /v2`.
pub async fn server_metadata() -> Json<serde_json::Value> {
    Json(json!({ "name": "baton", "version": crate::build::version(), "extensions": EXTENSIONS }))
}

fn metadata(app: &App, model: &str, version: Option<u64>) -> Result<Json<serde_json::Value>, ApiError> {
    let snapshot = app.registry.snapshot();
    let target = resolve(app, &snapshot, model, version)?;
    let route = snapshot.model(model).ok_or_else(|| not_serving(app, model))?;
    let mut versions: Vec<u64> = route.versions().map(|v| v.number()).collect();
    versions.sort_unstable();
    let (platform, _) = platform(target);
    Ok(Json(baton_protocol::model_metadata(model, &versions, platform, target.signature())))
}

/// `GET /v2/models/{name}`.
pub async fn model_metadata(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    metadata(&app, &model, None)
}

/// `GET /v2/models/{name}/versions/{v}`.
pub async fn version_metadata(
    State(app): State<Arc<App>>,
    Path((model, version)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    metadata(&app, &model, Some(parse_version(&version)?))
}

fn model_ready_at(app: &App, model: &str, version: Option<u64>) -> Result<Response, ApiError> {
    let snapshot = app.registry.snapshot();
    let state = app.registry.status(model).map(|s| s.state.as_str()).unwrap_or("IDLE");
    match resolve(app, &snapshot, model, version) {
        Ok(v) if v.alive() => {
            Ok(Json(json!({ "name": model, "version": v.number().to_string(), "ready": true, "state": state }))
                .into_response())
        }
        Err(e) if e.class == Class::NotFound && e.kind == "model_not_found" => Err(e),
        // A version whose worker process ended is held, but answers nothing.
        Ok(_) | Err(_) => {
            Ok((StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "name": model, "ready": false, "state": state })))
                .into_response())
        }
    }
}

/// `GET /v2/models/{name}/ready`.
pub async fn model_ready(State(app): State<Arc<App>>, Path(model): Path<String>) -> Result<Response, ApiError> {
    model_ready_at(&app, &model, None)
}

/// `GET /v2/models/{name}/versions/{v}/ready`.
pub async fn version_ready(
    State(app): State<Arc<App>>,
    Path((model, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    model_ready_at(&app, &model, Some(parse_version(&version)?))
}

fn config(app: &App, model: &str, version: Option<u64>) -> Result<Json<serde_json::Value>, ApiError> {
    let snapshot = app.registry.snapshot();
    let target = resolve(app, &snapshot, model, version)?;
    let (platform, backend) = platform(target);
    Ok(Json(baton_protocol::model_config(model, platform, &backend, max_batch_size(target), target.signature())))
}

/// `GET /v2/models/{name}/config`.
pub async fn model_config(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    config(&app, &model, None)
}

/// `GET /v2/models/{name}/versions/{v}/config`.
pub async fn version_config(
    State(app): State<Arc<App>>,
    Path((model, version)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    config(&app, &model, Some(parse_version(&version)?))
}
