//! `POST /v2/models/{name}[/versions/{v}]/infer`: KServe V2 inference, JSON
//! or with the binary tensor data extension.
//!
//! The request takes one routing snapshot and runs on the version it
//! resolves to. Inference runs inline on the async worker: for the small,
//! fast models baton is built around, a hand-off to a blocking pool would
//! cost more than the inference itself.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use baton_core::error::InferError;
use baton_core::routing::Routing;
use baton_core::version::Version;
use baton_kserve::{decode_request, encode_response};

use super::error::ApiError;
use super::models::{max_batch_size, parse_version};
use crate::app::App;

/// The binary extension's header naming the JSON part's length.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// Inference on the stable version.
pub async fn infer(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    run(&app, &model, None, &headers, body)
}

/// Inference on a named version.
pub async fn infer_version(
    State(app): State<Arc<App>>,
    Path((model, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let version = parse_version(&version)?;
    run(&app, &model, Some(version), &headers, body)
}

fn run(
    app: &App,
    model: &str,
    version: Option<u64>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let _in_flight = app.metrics.in_flight();
    let refused = |e: ApiError| {
        app.metrics.rejected(model, e.kind);
        e
    };
    let body = body.map_err(|e| refused(e.into()))?;
    let header_length = header_length(headers).map_err(refused)?;
    let request = decode_request(&body, header_length).map_err(|e| refused(e.into()))?;
    let snapshot = app.registry.snapshot();
    let target = resolve(app, &snapshot, model, version).map_err(refused)?;
    check_batch(target, &request.inputs).map_err(refused)?;

    let series = app.metrics.version(model, target.number());
    let started = Instant::now();
    let outcome = target.infer(&request.inputs);
    series.record(started.elapsed(), outcome.as_ref().err().map(infer_kind));
    let outputs = outcome?;
    let encoded = encode_response(model, target.number(), request.id.as_deref(), outputs, &request)?;
    let mut response = encoded.body.into_response();
    let headers = response.headers_mut();
    match encoded.header_length {
        Some(n) => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            headers.insert(HEADER_LENGTH, HeaderValue::from(n));
        }
        None => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
    }
    Ok(response)
}

fn infer_kind(e: &InferError) -> &'static str {
    match e {
        InferError::Backend(b) => b.kind,
        other => other.kind(),
    }
}

fn header_length(headers: &HeaderMap) -> Result<Option<usize>, ApiError> {
    let Some(value) = headers.get(HEADER_LENGTH) else { return Ok(None) };
    let parsed = value.to_str().ok().and_then(|v| v.trim().parse::<usize>().ok());
    parsed.map(Some).ok_or_else(|| {
        ApiError::bad_request(
            "invalid_header",
            format!("header Inference-Header-Content-Length is not a length: {value:?}"),
        )
    })
}

/// The version a request names, or why it cannot be served: 404 for a
/// model or version baton does not know, 503 for one that is not loaded yet.
pub fn resolve<'a>(
    app: &App,
    snapshot: &'a Routing,
    model: &str,
    version: Option<u64>,
) -> Result<&'a Arc<Version>, ApiError> {
    match snapshot.resolve(model, version) {
        Ok(v) => Ok(v),
        Err(InferError::ModelNotFound(_)) => Err(not_serving(app, model)),
        Err(e) => Err(e.into()),
    }
}

/// The error for a model with no route: known but not (yet) loaded is 503.
pub fn not_serving(app: &App, model: &str) -> ApiError {
    let state = app.registry.status(model).map(|s| s.state.as_str());
    let known = state.is_some() || app.registry.source().spec(model).is_ok();
    if known {
        let state = state.unwrap_or("IDLE");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "model_not_ready",
            format!("model '{model}' is not ready (state {state})"),
        )
    } else {
        ApiError::unknown_model(model)
    }
}

fn check_batch(target: &Version, inputs: &[baton_core::tensor::Tensor]) -> Result<(), ApiError> {
    let max = max_batch_size(target);
    if max == 0 {
        return Ok(());
    }
    for input in inputs {
        if let Some(&batch) = input.shape.first()
            && batch > max as i64
        {
            return Err(ApiError::bad_request(
                "batch_too_large",
                format!("input '{}': batch size {batch} exceeds the model's max_batch_size {max}", input.name),
            ));
        }
    }
    Ok(())
}
