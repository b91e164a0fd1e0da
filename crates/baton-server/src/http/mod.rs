//! The REST front end: KServe V2 (Open Inference Protocol) with the Triton
//! extensions real tools use, and baton's management API under `/baton/v1`.

mod body;
mod error;
mod infer;
mod manage;
mod models;
mod repository;

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post};

pub use error::ApiError;

use crate::app::App;

/// Every route.
pub fn router(app: Arc<App>) -> Router {
    let limit = app.max_request_bytes;
    Router::new()
        .route("/v2", get(models::server_metadata))
        .route("/v2/health/live", get(models::live))
        .route("/v2/health/ready", get(models::ready))
        .route("/v2/models/{name}", get(models::model_metadata))
        .route("/v2/models/{name}/ready", get(models::model_ready))
        .route("/v2/models/{name}/config", get(models::model_config))
        .route("/v2/models/{name}/infer", post(infer::infer))
        .route("/v2/models/{name}/versions/{version}", get(models::version_metadata))
        .route("/v2/models/{name}/versions/{version}/ready", get(models::version_ready))
        .route("/v2/models/{name}/versions/{version}/config", get(models::version_config))
        .route("/v2/models/{name}/versions/{version}/infer", post(infer::infer_version))
        .route("/v2/repository/index", post(repository::index))
        .route("/v2/repository/models/{name}/load", post(repository::load))
        .route("/v2/repository/models/{name}/unload", post(repository::unload))
        .route("/baton/v1/status", get(manage::status))
        .route("/baton/v1/events", get(manage::events))
        .route("/baton/v1/unloads", get(manage::unloads))
        .route("/baton/v1/models/{name}/status", get(manage::model_status))
        .route("/baton/v1/models/{name}/load", post(manage::load))
        .route("/baton/v1/models/{name}/rollback", post(manage::rollback))
        .route("/baton/v1/models/{name}/versions/{version}/retire", post(manage::retire))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(app)
}

async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    let text = app.metrics.render(&app.registry, app.ready(), &app.budget);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// Reads the body even here, so a request to a wrong path does not cost the
/// client its keep-alive connection.
async fn not_found(uri: axum::http::Uri, _body: Result<axum::body::Bytes, BytesRejection>) -> ApiError {
    ApiError::new(crate::error::Class::NotFound, "not_found", format!("no such endpoint: {}", uri.path()))
}
