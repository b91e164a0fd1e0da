//! `POST /v2/models/{name}[/versions/{v}]/infer`: KServe V2 inference, JSON
//! or with the binary tensor data extension.
//!
//! The request takes one routing snapshot and runs on the version it
//! resolves to. Cheap models run inline on the async worker; expensive ones
//! are moved off it (see [`baton_core::batcher::HEAVY_INFERENCE`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use baton_protocol::{decode_request, encode_response};

use super::error::ApiError;
use crate::app::App;
use crate::serving;
use crate::serving::parse_version;

/// The binary extension's header naming the JSON part's length.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// Inference on the stable version.
pub async fn infer(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    run(&app, &model, None, &headers, body).await
}

/// Inference on a named version.
pub async fn infer_version(
    State(app): State<Arc<App>>,
    Path((model, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let version = parse_version(&version)?;
    run(&app, &model, Some(version), &headers, body).await
}

async fn run(
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
    let mut request = decode_request(&body, header_length).map_err(|e| refused(e.into()))?;
    let snapshot = app.registry.snapshot();
    let (target, outputs) = serving::infer(app, &snapshot, model, version, std::mem::take(&mut request.inputs)).await?;
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
