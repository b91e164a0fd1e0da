//! The model repository extension: index, load, unload. Load and unload
//! answer once the operation has finished, drain included, as Triton's
//! clients expect.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use baton_core::error::LoadError;
use baton_core::events::State as ModelState;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ApiError;
use crate::app::App;
use crate::error::Class;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct IndexRequest {
    #[serde(default)]
    ready: bool,
}

fn parse_body<T: for<'de> Deserialize<'de> + Default>(body: &Bytes) -> Result<T, ApiError> {
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
    let source = app.registry.source();
    let mut names: BTreeSet<String> = source
        .models()
        .map_err(|e| ApiError::new(Class::Internal, "repository_unreadable", e.to_string()))?
        .into_iter()
        .collect();
    names.extend(app.registry.statuses().into_iter().map(|s| s.name));
    let snapshot = app.registry.snapshot();
    let mut rows = Vec::new();
    for name in names {
        let status = app.registry.status(&name);
        let route = snapshot.model(&name);
        let mut versions: BTreeSet<u64> = source.versions(&name).unwrap_or_default().into_iter().collect();
        if let Some(route) = route {
            versions.extend(route.versions().map(|v| v.number()));
        }
        if let Some(s) = &status {
            versions.extend(s.failed_versions.keys().copied());
            versions.extend(s.working_on);
        }
        for version in versions {
            let loaded = route.is_some_and(|r| r.versions().any(|v| v.number() == version));
            let working = status.as_ref().filter(|s| s.working_on == Some(version));
            let failed = status.as_ref().and_then(|s| s.failed_versions.get(&version));
            let (state, reason) = if loaded {
                ("READY", String::new())
            } else if let Some(s) = working {
                let state = if s.state == ModelState::Draining { "UNLOADING" } else { "LOADING" };
                (state, s.state.as_str().to_owned())
            } else if let Some(f) = failed {
                ("FAILED", f.message.clone())
            } else {
                ("UNAVAILABLE", "not loaded".to_owned())
            };
            if request.ready && state != "READY" {
                continue;
            }
            rows.push(json!({ "name": name, "version": version.to_string(), "state": state, "reason": reason }));
        }
        if route.is_none() && request.ready {
            continue;
        }
    }
    Ok(Json(rows))
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
        Some(Value::String(s)) => super::models::parse_version(s).map(Some),
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
    let report = app.registry.load(&model, version)?.finished().await?;
    Ok(Json(serde_json::to_value(report).unwrap_or_default()))
}

/// `POST /v2/repository/models/{name}/unload`: the model leaves service;
/// unloading a model that is not loaded is not an error.
pub async fn unload(State(app): State<Arc<App>>, Path(model): Path<String>) -> Result<Json<Value>, ApiError> {
    match app.registry.unload(&model) {
        Ok(handle) => Ok(Json(serde_json::to_value(handle.finished().await?).unwrap_or_default())),
        Err(LoadError::NotLoaded { .. }) if app.registry.source().spec(&model).is_ok() => Ok(Json(json!({}))),
        Err(LoadError::NotLoaded { .. }) => Err(ApiError::unknown_model(&model)),
        Err(e) => Err(e.into()),
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
