//! baton's own management API, under `/baton/v1`: status with per-stage
//! durations, load with a report, rollback, retire, unload records, and the
//! event stream as Server-Sent Events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::{BroadcastStream, WatchStream};

use super::error::ApiError;
use crate::app::App;
use crate::decisions::operate;
use crate::error::Class;
use crate::serve::conn::state::{ConnHandle, quiet_until_making_room};
use crate::serving::parse_version;

/// `GET /baton/v1/status`.
pub async fn status(
    State(app): State<Arc<App>>,
    privileged: Option<axum::Extension<crate::access::Privileged>>,
) -> Json<Value> {
    let privileged = privileged.is_some_and(|p| p.0.0);
    Json(crate::status::server(&app, privileged))
}

/// `GET /baton/v1/models/{name}/status`.
pub async fn model_status(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    privileged: Option<axum::Extension<crate::access::Privileged>>,
) -> Result<Json<Value>, ApiError> {
    let privileged = privileged.is_some_and(|p| p.0.0);
    crate::status::model_as(&app, &model, privileged).map(Json).ok_or_else(|| ApiError::unknown_model(&model))
}

/// `POST /baton/v1/models/{name}/load` with an optional `{"version": N,
/// "if_new": BOOL}`. It loads, as it always has. With `if_new` and no
/// version, when the repository's newest already serves and can answer
/// (and no decision holds the model on another), nothing loads: the answer
/// then says `"already_serving": true`. The CLI asks for that.
pub async fn load(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Body {
        version: Option<u64>,
        #[serde(default)]
        if_new: bool,
    }
    let body: Body = super::repository::parse_body(&body)?;
    match operate::load_if_new(&app, &model, body.version, body.if_new).await? {
        Ok(report) => Ok(Json(serde_json::to_value(report).unwrap_or_default())),
        Err(serving) => Ok(Json(json!({
            "model": model,
            "operation": "none",
            "version": serving,
            "replaced": serving,
            "already_serving": true,
            "message": format!(
                "model '{model}' already serves version {serving}, the repository's newest: nothing was loaded \
                 (baton load {model} --force loads it again)"
            ),
        }))),
    }
}

/// `POST /baton/v1/models/{name}/rollback`.
///
/// Like every POST handler, it takes the body (whatever it holds) so the
/// connection stays usable: hyper closes a keep-alive connection whose
/// request body was left unread, and the client's next request on it fails.
pub async fn rollback(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    _body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let report = operate::rollback(&app, &model).await?;
    Ok(Json(serde_json::to_value(report).unwrap_or_default()))
}

/// `PUT /baton/v1/models/{name}/pin` with `{"version": N}`: that version
/// serves (loaded first if it does not) until unpinned, whatever is
/// published meanwhile.
pub async fn pin(State(app): State<Arc<App>>, Path(model): Path<String>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let version = super::repository::version_body(&body)?
        .ok_or_else(|| ApiError::bad_request("missing_version", "a pin needs a version: {\"version\": N}"))?;
    Ok(Json(operate::pin(&app, &model, version).await?))
}

/// `DELETE /baton/v1/models/{name}/pin`: back to the newest version.
pub async fn unpin(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    _body: Bytes,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(operate::unpin(&app, &model).await?))
}

/// `POST /baton/v1/models/{name}/versions/{v}/retire`.
pub async fn retire(
    State(app): State<Arc<App>>,
    Path((model, version)): Path<(String, String)>,
    _body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let version = parse_version(&version)?;
    // Claimed as the other operations claim their model, so that an
    // upgrade waits for it rather than reading the kept versions mid-way.
    let _working = operate::begin(&app, &model).await?;
    let report = app.registry.retire(&model, version)?.finished().await?;
    Ok(Json(serde_json::to_value(report).unwrap_or_default()))
}

/// `GET /baton/v1/unloads`: what the most recent frees gave back.
pub async fn unloads(State(app): State<Arc<App>>) -> Json<Value> {
    Json(serde_json::to_value(app.registry.unload_records()).unwrap_or_default())
}

/// `GET /baton/v1/events`: every registry event as it happens. Each SSE
/// event's name is the event kind; its data is the event as JSON. A client
/// too slow to keep up receives a `lagged` event saying how many it missed.
/// The stream is quiet: at its listener's bound it ends to make room for
/// another client (an SSE client connects again by itself).
pub async fn events(
    State(app): State<Arc<App>>,
    conn: Option<axum::Extension<ConnHandle>>,
) -> Sse<impl tokio_stream::Stream<Item = Result<SseEvent, Infallible>>> {
    // Ends when shutdown begins, so open streams do not hold up a graceful exit.
    let shutdown = WatchStream::new(app.shutdown_signal()).filter(|stop| *stop).map(|_| None);
    let making_room = futures_util::stream::once(quiet_until_making_room(conn.map(|c| c.0))).map(|()| None);
    let events = BroadcastStream::new(app.registry.subscribe()).map(Some);
    let ends = shutdown.merge(making_room);
    let stream = events.merge(ends).take_while(Option::is_some).filter_map(|item| item).map(|item| {
        Ok(match item {
            Ok(event) => {
                let mut data = serde_json::to_value(&event).unwrap_or_default();
                crate::clock::add_rfc3339(&mut data, "at");
                let name = data.get("event").and_then(Value::as_str).unwrap_or("event").to_owned();
                SseEvent::default().event(name).data(data.to_string())
            }
            Err(BroadcastStreamRecvError::Lagged(n)) => {
                SseEvent::default().event("lagged").data(json!({ "missed": n }).to_string())
            }
        })
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// `POST /baton/v1/upgrade`, with an optional `{"timeout_s": N, "cold":
/// BOOL}`: replaces this server with a new process of its own executable,
/// as on disk now, that takes over its listening sockets once it is ready,
/// within `timeout_s` (600; 1 to 86400, else 400 `invalid_timeout`).
/// Answers with both pids once the new process serves; this one then
/// shuts down as on SIGTERM. When the new process fails, nothing changes:
/// 422 `upgrade_failed` says why; 409 `upgrade_in_progress` when one
/// runs, `operation_in_progress` when an operator's operation running
/// when it began outlasted the timeout, `upgrade_unavailable` for a server
/// embedded in another program. `cold`: answers once the new
/// process has the sockets and has checked its start; this one drains and
/// exits, and the new one loads only then. A body naming a `binary` is
/// refused (400 `binary_not_accepted`): the program is never chosen over
/// the network.
pub async fn upgrade(State(app): State<Arc<App>>, body: Bytes) -> Result<Json<Value>, ApiError> {
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Request {
        /// Refused whatever it holds; parsed to say so rather than
        /// "unknown field".
        binary: Option<Value>,
        timeout_s: Option<u64>,
        #[serde(default)]
        cold: bool,
    }
    let request: Request = if body.iter().all(u8::is_ascii_whitespace) {
        Request::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request("invalid_json", format!("request body: {e}")))?
    };
    if request.binary.is_some() {
        let own = app.upgrade.get().map_or_else(|| "its path".to_owned(), |s| s.binary().display().to_string());
        return Err(ApiError::bad_request(
            "binary_not_accepted",
            format!(
                "an upgrade runs the server's own executable as on disk now ({own}), never a binary named in a \
                 request, which would let a caller run a program of its choosing: replace the file at that path \
                 with the new binary (install it there, or rename it into place), then upgrade with no \"binary\""
            ),
        ));
    }
    let timeout_s = request.timeout_s.unwrap_or(600);
    if !crate::upgrade::TIMEOUT_S.contains(&timeout_s) {
        let (least, most) = (crate::upgrade::TIMEOUT_S.start(), crate::upgrade::TIMEOUT_S.end());
        return Err(ApiError::bad_request(
            "invalid_timeout",
            format!("\"timeout_s\": {timeout_s}: an upgrade's timeout is {least} to {most} seconds (a day)"),
        ));
    }
    let within = Duration::from_secs(timeout_s);
    let began = std::time::Instant::now();
    match crate::upgrade::upgrade(Arc::clone(&app), within, request.cold).await {
        Ok(new_pid) => Ok(Json(json!({
            "old_pid": std::process::id(),
            "new_pid": new_pid,
            "took_ms": began.elapsed().as_millis(),
            "cold": request.cold,
        }))),
        Err(error) => {
            let class = if error.is_conflict() { Class::Conflict } else { Class::Unprocessable };
            Err(ApiError::new(class, error.kind(), error.to_string()))
        }
    }
}
