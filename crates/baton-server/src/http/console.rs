//! The console: a page at `/console` that draws what the status, rollout,
//! unload and event endpoints say, and calls the management endpoints for
//! an operator's actions. It is a few static files compiled into the
//! binary (no CDN, nothing fetched beyond this server); what it shows comes
//! from the same API any client calls, under the same access rules.
//!
//! It is served on the listener that serves management (the admin listener
//! when there is one, else the inference listener); elsewhere it is refused
//! like a management route on the wrong listener. The files hold no
//! secret, so they are served without the token: the page asks for the
//! token itself and sends it in the `Authorization` header of the calls
//! that need it.

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::access::{Access, Listener};
use crate::app::App;
use crate::error::{Class, ServeError};

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const CHARTS: &str = include_str!("console/charts.js");
const STYLE: &str = include_str!("console/console.css");
const ICON: &str = include_str!("console/icon.svg");

/// What the page may load and who may frame it: its own files and calls to
/// this server only, no inline script or style, no framing (against
/// clickjacking an action), no form posts, no plugins.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                      connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's routes for a listener of the given role.
pub fn routes(access: &Access, listener: Listener) -> Router<Arc<App>> {
    let paths = ["/console", "/console/console.js", "/console/charts.js", "/console/console.css", "/console/icon.svg"];
    let mut router = Router::new();
    if !access.serves_management(listener) {
        for path in paths {
            router = router.route(path, get(elsewhere));
        }
        return router;
    }
    router
        .route("/console", get(|| async { asset(INDEX, "text/html; charset=utf-8") }))
        .route("/console/console.js", get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }))
        .route("/console/charts.js", get(|| async { asset(CHARTS, "text/javascript; charset=utf-8") }))
        .route("/console/console.css", get(|| async { asset(STYLE, "text/css; charset=utf-8") }))
        .route("/console/icon.svg", get(|| async { asset(ICON, "image/svg+xml") }))
}

/// A file of the console with the headers every one carries.
fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // The files change with the binary: a browser asks again each time
    // rather than mixing an old script with a new server.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The answer on a listener that does not serve management.
async fn elsewhere() -> ServeError {
    ServeError::new(
        Class::Forbidden,
        "wrong_listener",
        "the console is served where management is: on the admin listener (--admin-http), not on this inference \
         listener",
    )
}
