//! The REST front end: KServe V2 (Open Inference Protocol) with the Triton
//! extensions real tools use, and baton's management API under `/baton/v1`.
//! Routes come in scopes (open, inference, outcomes, management, server)
//! that [`crate::access`] allows or refuses per listener.

mod body;
mod console;
mod error;
mod fleet;
mod infer;
mod manage;
mod models;
mod origin;
mod outcomes;
mod repository;
mod rollout;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};

pub use error::ApiError;

use crate::access::{Access, Listener, Scope};
use crate::app::App;

/// Every route, for a listener of the given role. Each route belongs to one
/// [`Scope`]; routes that `access` does not leave open on this listener go
/// through [`guard`].
pub fn router(app: Arc<App>, access: Arc<Access>, listener: Listener) -> Router {
    let limit = app.max_request_bytes;
    let open = Router::new()
        .route("/v2", get(models::server_metadata))
        .route("/v2/health/live", get(models::live))
        .route("/v2/health/ready", get(models::ready))
        .route("/v2/repository/index", post(repository::index))
        .route("/baton/v1/status", get(manage::status))
        .route("/baton/v1/events", get(manage::events))
        .route("/baton/v1/unloads", get(manage::unloads))
        .route("/baton/v1/fleet", get(fleet::view))
        .route("/baton/v1/models/{name}/status", get(manage::model_status))
        .route("/baton/v1/models/{name}/rollout", get(rollout::status))
        .route("/metrics", get(metrics))
        .route_layer(axum::middleware::from_fn_with_state((Arc::clone(&access), listener), mark_privileged))
        .layer(DefaultBodyLimit::max(CONTROL_BODY_LIMIT));
    let inference = Router::new()
        .route("/v2/models/{name}", get(models::model_metadata))
        .route("/v2/models/{name}/ready", get(models::model_ready))
        .route("/v2/models/{name}/config", get(models::model_config))
        .route("/v2/models/{name}/infer", post(infer::infer))
        .route("/v2/models/{name}/versions/{version}", get(models::version_metadata))
        .route("/v2/models/{name}/versions/{version}/ready", get(models::version_ready))
        .route("/v2/models/{name}/versions/{version}/config", get(models::version_config))
        .route("/v2/models/{name}/versions/{version}/infer", post(infer::infer_version));
    let management = Router::new()
        .route("/v2/repository/models/{name}/load", post(repository::load))
        .route("/v2/repository/models/{name}/unload", post(repository::unload))
        .route("/baton/v1/models/{name}/load", post(manage::load))
        .route("/baton/v1/models/{name}/rollback", post(manage::rollback))
        .route("/baton/v1/models/{name}/pin", put(manage::pin).delete(manage::unpin))
        .route("/baton/v1/models/{name}/versions/{version}/retire", post(manage::retire))
        .route("/baton/v1/models/{name}/rollout", post(rollout::start))
        .route("/baton/v1/models/{name}/rollout/pause", post(rollout::pause))
        .route("/baton/v1/models/{name}/rollout/resume", post(rollout::resume))
        .route("/baton/v1/models/{name}/rollout/promote", post(rollout::promote))
        .route("/baton/v1/models/{name}/rollout/abort", post(rollout::abort))
        .layer(DefaultBodyLimit::max(CONTROL_BODY_LIMIT));
    // What is posted decides canaries: a web page must not post it either.
    let outcomes = Router::new()
        .route("/baton/v1/models/{name}/outcomes", post(outcomes::post))
        .route_layer(axum::middleware::from_fn_with_state((Arc::clone(&access), listener), refuse_browsers));
    let server = Router::new()
        .route("/baton/v1/upgrade", post(manage::upgrade))
        .layer(DefaultBodyLimit::max(CONTROL_BODY_LIMIT));
    let console = console::routes(&access, listener);
    open.merge(guarded(inference, &access, listener, Scope::Inference))
        .merge(guarded(outcomes, &access, listener, Scope::Outcomes))
        .merge(guarded(management, &access, listener, Scope::Management))
        .merge(guarded(server, &access, listener, Scope::Server))
        .merge(console)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&app), body::deadline))
        .with_state(app)
}

/// The largest body of a route that is not inference or outcomes: its
/// JSON (a version, a rollout's plan, an upgrade's options) is small, and
/// such a body is buffered whole outside the request memory budget.
const CONTROL_BODY_LIMIT: usize = 64 << 10;

/// What [`guard`] needs to decide.
#[derive(Clone)]
struct Guard {
    access: Arc<Access>,
    listener: Listener,
    scope: Scope,
}

/// The routes, behind [`guard`] unless `access` leaves them open here (the
/// inference routes on an inference listener pay nothing).
fn guarded(routes: Router<Arc<App>>, access: &Arc<Access>, listener: Listener, scope: Scope) -> Router<Arc<App>> {
    if access.is_open(listener, scope) {
        return routes;
    }
    let state = Guard { access: Arc::clone(access), listener, scope };
    routes.route_layer(axum::middleware::from_fn_with_state(state, guard))
}

/// How much of a refused request's body is read and dropped, so that a
/// small one does not cost the client its keep-alive connection; a larger
/// one (or one slower than [`body::refuse_unread`] waits for) closes it.
const REFUSED_BODY_LIMIT: usize = 64 << 10;

/// Lets the request through, or answers with [`Access::check`]'s refusal.
async fn guard(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let authorization = request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let browser = match guard.scope {
        Scope::Management | Scope::Server => {
            origin::refusal(request.headers(), guard.access.host_check(guard.listener))
        }
        _ => None,
    };
    let checked = match browser {
        Some(refused) => Err(refused),
        None => guard.access.check(guard.listener, guard.scope, authorization, request.uri().path()),
    };
    match checked {
        Ok(()) => next.run(request).await,
        Err(refused) => {
            let (parts, mut body) = request.into_parts();
            body::refuse_unread(refused, &parts.headers, &mut body, REFUSED_BODY_LIMIT).await
        }
    }
}

/// Refuses outcomes a browser was made to post for another site, or to a
/// name a page can rebind (see [`origin`]).
async fn refuse_browsers(
    State((access, listener)): State<(Arc<Access>, Listener)>,
    request: Request,
    next: Next,
) -> Response {
    match origin::refusal(request.headers(), access.outcomes_host_check(listener)) {
        None => next.run(request).await,
        Some(refused) => {
            let (parts, mut body) = request.into_parts();
            body::refuse_unread(refused, &parts.headers, &mut body, REFUSED_BODY_LIMIT).await
        }
    }
}

/// Marks whether the caller may see the management scope's details.
async fn mark_privileged(
    State((access, listener)): State<(Arc<Access>, Listener)>,
    mut request: Request,
    next: Next,
) -> Response {
    let authorization = request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let privileged = access.privileged(crate::access::Front::Rest, listener, authorization)
        && origin::refusal(request.headers(), access.host_check(listener)).is_none();
    let privileged = crate::access::Privileged(privileged);
    request.extensions_mut().insert(privileged);
    next.run(request).await
}

async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    let mut text = app.metrics.render(&app.registry, app.ready(), &app.budget);
    if let Some(health) = app.cluster.get() {
        crate::metrics::render_cluster(&mut text, &health.state());
    }
    if let Some(answer) = app.registry.source().store_answer() {
        crate::metrics::render_store(&mut text, &answer);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// A path no route serves. A small body is read and dropped, so the
/// client keeps its keep-alive connection; a larger one is not read (the
/// answer closes the connection): nothing of it is buffered.
async fn not_found(request: Request) -> Response {
    let (parts, mut body) = request.into_parts();
    let error =
        ApiError::new(crate::error::Class::NotFound, "not_found", format!("no such endpoint: {}", parts.uri.path()));
    body::refuse_unread(error, &parts.headers, &mut body, REFUSED_BODY_LIMIT).await
}
