//! Request bodies: every one within the body read timeout, and an
//! inference request's within the request memory budget.
//!
//! Every request body must arrive within `--body-read-timeout` of its
//! head ([`deadline`]): a client that sends its body slowly, or stops
//! halfway, is answered 408 (kind `body_timeout`) and its connection
//! closed, whatever the route, rather than holding its connection (and
//! what it buffered) for ever.
//!
//! Bytes are reserved before they are buffered: with a `Content-Length`, all
//! of them up front, before the first is read; without one (chunked), each
//! chunk as it arrives, and once more for the single buffer the chunks are
//! joined into. A body that does not fit waits briefly for room, then is
//! refused as overloaded with nothing of it buffered beyond its last chunk.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::time::{Instant, Sleep};

use crate::app::App;
use crate::error::{Class, ServeError};
use crate::serve::conn::bounded::MAKE_ROOM_AFTER;
use crate::serve::conn::state::{ConnHandle, Stalled};
use crate::serving::Ticket;

/// Gives every request's body [`App`]'s body read timeout, counted from
/// now (its head has been read); answers 408, kind `body_timeout`, with
/// `Connection: close`, when it passes before the body has arrived,
/// whatever the handler made of the failed read.
pub async fn deadline(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let timeout = app.limits.body_read_timeout;
    let conn = request.extensions().get::<ConnHandle>().cloned();
    if http_body::Body::is_end_stream(request.body()) || (timeout.is_none() && conn.is_none()) {
        return next.run(request).await;
    }
    let ended = Arc::new(Ended::default());
    let flag = Arc::clone(&ended);
    let deadline = timeout.map(|t| (Instant::now() + t, t));
    let pace = Pace { began: Instant::now(), received: 0, timer: None };
    let request = request
        .map(|inner| Body::new(Deadlined { inner, deadline, timer: None, conn, pace, stall: None, ended: flag }));
    let response = next.run(request).await;
    let mut response = match (ended.timed_out.load(Ordering::Acquire), ended.made_room.load(Ordering::Acquire)) {
        (true, _) => {
            app.metrics.connections.body_timed_out();
            body_timeout(timeout.unwrap_or_default()).into_response()
        }
        (false, true) => {
            app.metrics.connections.body_stalled();
            // A refusal the handler had already chosen (a full server's
            // 503, a 413) stands; a failed read becomes the stall's 408.
            let failed_read = matches!(response.status(), StatusCode::BAD_REQUEST | StatusCode::REQUEST_TIMEOUT);
            if failed_read || response.status().is_success() { body_stalled().into_response() } else { response }
        }
        (false, false) => return response,
    };
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The least rate a body must keep, counted from its head after a first
/// second of grace, so as not to be closed to make room at a full
/// listener: a body that trickles a byte now and then is as slow as one
/// that stopped. Apache's `mod_reqtimeout` asks the same of bodies by
/// default.
pub const MIN_BODY_RATE: u64 = 500;

/// How fast a body arrives.
struct Pace {
    /// When its head was read.
    began: Instant,
    /// Bytes of it received so far.
    received: u64,
    /// Wakes the read when the body would turn slow, bytes not arriving.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Pace {
    /// When the body turns slow unless more of it arrives: a second after
    /// its head at the soonest, and when its bytes fall below
    /// [`MIN_BODY_RATE`] since its head.
    fn slow_from(&self) -> Instant {
        let owed = Duration::from_secs_f64(self.received as f64 / MIN_BODY_RATE as f64);
        self.began + owed.max(MAKE_ROOM_AFTER)
    }
}

/// How a body's read ended early, if it did.
#[derive(Debug, Default)]
struct Ended {
    /// Its deadline passed.
    timed_out: AtomicBool,
    /// It had stalled, and its connection was asked to make room.
    made_room: AtomicBool,
}

/// The refusal of a body that stalled while its listener was full.
fn body_stalled() -> ServeError {
    ServeError::new(
        Class::RequestTimeout,
        "body_stalled",
        format!(
            "the request body arrived slower than {MIN_BODY_RATE} bytes a second while the listener held as many \
             connections as it may: the connection was closed to make room for another client"
        ),
    )
}

/// The refusal of a body that did not arrive within `timeout`.
pub fn body_timeout(timeout: Duration) -> ServeError {
    ServeError::new(
        Class::RequestTimeout,
        "body_timeout",
        format!("the request body did not arrive within the body read timeout ({} ms)", timeout.as_millis()),
    )
}

/// What reading a body past its deadline fails with.
#[derive(Debug)]
struct BodyTimedOut(Duration);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the body did not arrive within {} ms", self.0.as_millis())
    }
}

impl std::error::Error for BodyTimedOut {}

pin_project_lite::pin_project! {
    /// A request body that fails once its deadline passes before its end,
    /// or once it has stalled and its connection is asked to make room.
    struct Deadlined {
        #[pin]
        inner: Body,
        // The deadline and the timeout it came from; `None`: no timeout.
        deadline: Option<(Instant, Duration)>,
        timer: Option<Pin<Box<Sleep>>>,
        // The connection, to note a stall on.
        conn: Option<ConnHandle>,
        pace: Pace,
        // While the body arrives too slowly: the stall, and the ask to
        // make room it waits for.
        stall: Option<(Stalled, Pin<Box<dyn Future<Output = ()> + Send>>)>,
        ended: Arc<Ended>,
    }
}

/// What reading a body that stalled while its listener was full fails with.
#[derive(Debug)]
struct BodyStalled;

impl std::fmt::Display for BodyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the body stalled and its connection was closed to make room")
    }
}

impl std::error::Error for BodyStalled {}

impl http_body::Body for Deadlined {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.project();
        let timeout = this.deadline.map(|(_, timeout)| timeout).unwrap_or_default();
        if this.ended.made_room.load(Ordering::Acquire) {
            return Poll::Ready(Some(Err(axum::Error::new(BodyStalled))));
        }
        if this.ended.timed_out.load(Ordering::Acquire) {
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut(timeout)))));
        }
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
                this.pace.received += data.map_or(0, |d| d.len() as u64);
            }
            if frame.is_none() || Instant::now() < this.pace.slow_from() {
                *this.stall = None;
            }
            return Poll::Ready(frame);
        }
        if let Some((deadline, _)) = *this.deadline {
            let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if timer.as_mut().poll(cx).is_ready() {
                this.ended.timed_out.store(true, Ordering::Release);
                return Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut(timeout)))));
            }
        }
        let Some(conn) = this.conn else { return Poll::Pending };
        // No byte now: is the body behind the least rate?
        let slow_from = this.pace.slow_from();
        if this.stall.is_none() {
            let timer = this.pace.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(slow_from)));
            if timer.deadline() != slow_from {
                timer.as_mut().reset(slow_from);
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        let (_, room) = this.stall.get_or_insert_with(|| {
            let stalled = conn.stall();
            let room = Box::pin(stalled.making_room());
            (stalled, room)
        });
        if room.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        *this.stall = None;
        this.ended.made_room.store(true, Ordering::Release);
        Poll::Ready(Some(Err(axum::Error::new(BodyStalled))))
    }

    fn is_end_stream(&self) -> bool {
        let ended = self.ended.timed_out.load(Ordering::Acquire) || self.ended.made_room.load(Ordering::Acquire);
        !ended && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The most a body may hold, and what sets it, for the refusal.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    /// Bytes.
    pub bytes: usize,
    /// What sets it, e.g. `--max-request-bytes`.
    pub by: &'static str,
}

fn too_large(limit: Limit) -> ServeError {
    ServeError::new(
        Class::TooLarge,
        "too_large",
        format!("the request body is larger than the limit of {} bytes ({})", limit.bytes, limit.by),
    )
}

fn unreadable(e: impl std::fmt::Display) -> ServeError {
    ServeError::bad_request("bad_body", format!("reading the request body failed: {e}"))
}

/// A failed read of a body: its deadline passed or it stalled at a full
/// listener (408), or it broke.
fn failed(e: axum::Error) -> ServeError {
    let source = std::error::Error::source(&e);
    if let Some(BodyTimedOut(timeout)) = source.and_then(|s| s.downcast_ref::<BodyTimedOut>()) {
        return body_timeout(*timeout);
    }
    if source.is_some_and(|s| s.is::<BodyStalled>()) {
        return body_stalled();
    }
    unreadable(e)
}

/// How long draining a refused request's body may take: a slow client's
/// body is not waited for longer, and its connection is closed.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// Answers a request refused before all of its body was read. The rest of
/// the body is read and dropped as it arrives (nothing of it is kept), so
/// the client, which may still be sending it, reads the answer instead of
/// a broken connection, and the connection can carry its next request. A
/// body over `limit`, or one that takes longer than [`DRAIN_WAIT`], is
/// not waited for: the answer says the connection closes.
pub async fn refuse_unread(error: ServeError, headers: &HeaderMap, body: &mut Body, limit: usize) -> Response {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    // A client waiting for `100 Continue` has sent no body: reading it
    // would ask for it. It is told at once, and the connection closes.
    let waits_to_send = headers.get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let drained = !waits_to_send
        && declared.is_none_or(|n| n <= limit as u64)
        && tokio::time::timeout(DRAIN_WAIT, drain(body, limit as u64)).await.unwrap_or(false);
    let mut response = error.into_response();
    if !drained {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Reads and drops the rest of a body of up to `limit` bytes; `false` for
/// a longer one or a broken one.
async fn drain(body: &mut Body, limit: u64) -> bool {
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        match frame.map(|f| f.into_data()) {
            Ok(Ok(data)) => {
                total += data.len() as u64;
                if total > limit {
                    return false;
                }
            }
            Ok(Err(_)) => {}
            Err(_) => return false,
        }
    }
    true
}

/// Reads the body of an inference request to `model`, its bytes reserved
/// in `ticket`, up to `--max-request-bytes`. Errors are counted by the
/// caller.
pub async fn read(
    app: &App,
    model: &str,
    headers: &HeaderMap,
    body: &mut Body,
    ticket: &mut Ticket,
) -> Result<Vec<u8>, ServeError> {
    let limit = Limit { bytes: app.max_request_bytes, by: "--max-request-bytes" };
    read_within(app, model, headers, body, ticket, limit).await
}

/// [`read`], up to `limit`.
pub async fn read_within(
    app: &App,
    model: &str,
    headers: &HeaderMap,
    body: &mut Body,
    ticket: &mut Ticket,
    limit: Limit,
) -> Result<Vec<u8>, ServeError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    match declared {
        Some(length) if length > limit.bytes as u64 => Err(too_large(limit)),
        Some(length) => {
            ticket.reserve(app, model, length).await?;
            // Within the limit, so it fits in a usize.
            read_declared(body, usize::try_from(length).unwrap_or(limit.bytes)).await
        }
        None => read_chunked(app, model, body, limit, ticket).await,
    }
}

/// A body of known length, into one buffer of that length.
async fn read_declared(body: &mut Body, length: usize) -> Result<Vec<u8>, ServeError> {
    let mut buffer = Vec::with_capacity(length);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(failed)?.into_data() {
            if buffer.len() + data.len() > length {
                return Err(unreadable(format!("the body is longer than its Content-Length of {length}")));
            }
            buffer.extend_from_slice(&data);
        }
    }
    Ok(buffer)
}

/// A body of unknown length: each chunk reserved as it arrives, then the
/// chunks joined into one buffer.
async fn read_chunked(
    app: &App,
    model: &str,
    body: &mut Body,
    limit: Limit,
    ticket: &mut Ticket,
) -> Result<Vec<u8>, ServeError> {
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(failed)?.into_data() {
            total += data.len();
            if total > limit.bytes {
                return Err(too_large(limit));
            }
            ticket.reserve(app, model, data.len() as u64).await?;
            chunks.push(data);
        }
    }
    if chunks.len() == 1 {
        return Ok(Vec::from(chunks.pop().unwrap_or_default()));
    }
    // The joined buffer and the chunks are both alive for a moment.
    ticket.reserve(app, model, total as u64).await?;
    let mut joined = Vec::with_capacity(total);
    for chunk in chunks.drain(..) {
        joined.extend_from_slice(&chunk);
    }
    drop(chunks);
    ticket.memory.release(total as u64);
    Ok(joined)
}
