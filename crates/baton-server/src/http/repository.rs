//! The model repository extension: index, load, unload. Load and unload
//! answer once the operation has finished, drain included, as Triton's
//! clients expect.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ApiError;
use crate::app::App;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct IndexRequest {
    #[serde(default)]
    ready: bool,
}

/// Parses a JSON body; an empty one (whitespace only) is the default.
pub fn parse_body<T: for<'de> Deserialize<'de> + Default>(body: &Bytes) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request("invalid_json", format!("request body: {e}")))
}

/// `POST /v2/repository/index`: every model and version baton knows, on
/// disk or in memory, with its state; failed versions carry the stage and
/// the reason.
pub async fn index(State(app): State<Arc<App>>, body: Bytes) -> Result<Json<Vec<Value>>, ApiError> {
    let request: IndexRequest = parse_body(&body)?;
    let rows = crate::repository::index(&app, request.ready)?;
    Ok(Json(
        rows.into_iter()
            .map(|r| json!({ "name": r.name, "version": r.version.to_string(), "state": r.state, "reason": r.reason }))
            .collect(),
    ))
}

#[derive(Deserialize, Default)]
struct LoadRequest {
    #[serde(default)]
    parameters: serde_json::Map<String, Value>,
}

fn requested_version(parameters: &serde_json::Map<String, Value>) -> Result<Option<u64>, ApiError> {
    if let Some(other) = parameters.keys().find(|k| k.as_str() != "version") {
        return Err(ApiError::bad_request(
            "unsupported_parameter",
            format!("load parameter '{other}' is not supported; baton takes 'version'"),
        ));
    }
    match parameters.get("version") {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| ApiError::bad_request("invalid_version", format!("version {n} is not a version number"))),
        Some(Value::String(s)) => crate::serving::parse_version(s).map(Some),
        Some(other) => {
            Err(ApiError::bad_request("invalid_version", format!("version {other} is not a version number")))
        }
    }
}

/// `POST /v2/repository/models/{name}/load`: with no parameters, the
/// repository's newest complete version; `{"parameters": {"version": N}}`
/// picks one.
pub async fn load(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let request: LoadRequest = parse_body(&body)?;
    let version = requested_version(&request.parameters)?;
    let report = crate::decisions::operate::load(&app, &model, version).await?;
    Ok(Json(serde_json::to_value(report).unwrap_or_default()))
}

/// `POST /v2/repository/models/{name}/unload`: the model leaves service;
/// unloading a model that is not loaded is not an error.
///
/// The body (Triton's clients send `{"parameters": {...}}`) is read and
/// ignored, so the connection stays usable.
pub async fn unload(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    _body: Bytes,
) -> Result<Json<Value>, ApiError> {
    match crate::decisions::operate::unload(&app, &model).await? {
        Some(report) => Ok(Json(serde_json::to_value(report).unwrap_or_default())),
        None => Ok(Json(json!({}))),
    }
}

/// Reads `{"version": N}` (or nothing) for baton's own load endpoint.
pub fn version_body(body: &Bytes) -> Result<Option<u64>, ApiError> {
    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Body {
        version: Option<u64>,
    }
    Ok(parse_body::<Body>(body)?.version)
}
