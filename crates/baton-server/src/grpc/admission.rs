//! A layer around the gRPC services that admission control needs before
//! tonic decodes a message:
//!
//! - It stamps each call with the moment it arrived ([`Arrived`]), before
//!   tonic starts its own timer for `grpc-timeout`. Counted from there,
//!   baton's deadline falls no later than tonic's, so a call that runs out
//!   of time is answered by baton with `DEADLINE_EXCEEDED` (and its request
//!   taken out of the queue) rather than dropped by tonic with `CANCELLED`.
//! - It counts the call's body against the request memory budget frame by
//!   frame, as the frames arrive and before tonic buffers them
//!   ([`Frames`]). A frame that does not fit waits briefly for room; if
//!   none comes, the call fails with `UNAVAILABLE` (kind `overloaded`).
//!   The handler gives a message's bytes back once it has decoded the
//!   message into tensors, which it reserves in their turn.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use axum::body::Bytes;
use axum::http::{Request, Response};
use http_body::Frame;
use tonic::Status;

use crate::app::App;
use crate::budget::{Budget, Reservation, wait_until};
use crate::error::{Class, ServeError};

/// When a call arrived, as the layer saw it.
#[derive(Clone, Copy, Debug)]
pub struct Arrived(pub Instant);

/// The request memory a call's frames hold: grown by the body as frames
/// arrive, given back by the handler for each message it has decoded.
#[derive(Clone, Debug)]
pub struct Frames(Arc<Mutex<Reservation>>);

impl Frames {
    fn new(budget: &Arc<Budget>) -> Frames {
        Frames(Arc::new(Mutex::new(budget.empty())))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reservation> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives back the room of a message that has been decoded.
    pub fn release(&self, bytes: u64) {
        self.lock().release(bytes);
    }
}

/// The call's deadline from its `grpc-timeout`, counted from `arrived`;
/// `None` without one, or with one that does not parse (tonic ignores those
/// too).
pub fn call_deadline<B>(request: &Request<B>, arrived: Instant) -> Option<Instant> {
    let value = request.headers().get("grpc-timeout")?.to_str().ok()?;
    arrived.checked_add(crate::deadline::from_grpc_timeout(value).ok()?)
}

/// The layer; see the module documentation.
#[derive(Clone)]
pub struct AdmissionLayer {
    app: Arc<App>,
}

impl AdmissionLayer {
    /// The layer for the services of `app`.
    pub fn new(app: Arc<App>) -> AdmissionLayer {
        AdmissionLayer { app }
    }
}

impl<S> tower::Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Admission<S> {
        Admission { inner, app: Arc::clone(&self.app) }
    }
}

/// The layer's service.
#[derive(Clone)]
pub struct Admission<S> {
    inner: S,
    app: Arc<App>,
}

impl<S, ResBody> tower::Service<Request<tonic::body::Body>> for Admission<S>
where
    S: tower::Service<Request<tonic::body::Body>, Response = Response<ResBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<tonic::body::Body>) -> S::Future {
        // Stamped here, synchronously: tonic starts its grpc-timeout timer
        // only after this call returns.
        let arrived = Instant::now();
        let frames = Frames::new(&self.app.budget);
        let deadline = call_deadline(&request, arrived);
        request.extensions_mut().insert(Arrived(arrived));
        request.extensions_mut().insert(frames.clone());
        let app = Arc::clone(&self.app);
        let request = request.map(|body| {
            tonic::body::Body::new(Budgeted { inner: body, frames, deadline, app, held: None, waiting: None })
        });
        self.inner.call(request)
    }
}

type Waiting = Pin<Box<dyn Future<Output = Result<Reservation, ServeError>> + Send>>;

/// A call's body, each data frame reserved before it is handed on.
struct Budgeted {
    inner: tonic::body::Body,
    frames: Frames,
    deadline: Option<Instant>,
    app: Arc<App>,
    /// A frame waiting for room.
    held: Option<Frame<Bytes>>,
    waiting: Option<Waiting>,
}

impl http_body::Body for Budgeted {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Some(waiting) = this.waiting.as_mut() {
            let outcome = ready!(waiting.as_mut().poll(cx));
            this.waiting = None;
            let frame = this.held.take();
            return Poll::Ready(match outcome {
                Ok(room) => {
                    this.frames.lock().absorb(room);
                    frame.map(Ok)
                }
                Err(e) => {
                    if e.class == Class::Overloaded {
                        this.app.metrics.shed("", "memory_budget");
                    }
                    Some(Err(Box::new(Status::from(e))))
                }
            });
        }
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            None => return Poll::Ready(None),
        };
        let bytes = frame.data_ref().map_or(0, |d| d.len() as u64);
        let mut reservation = this.frames.lock();
        if reservation.try_grow(bytes) {
            return Poll::Ready(Some(Ok(frame)));
        }
        let budget = Arc::clone(reservation.budget());
        drop(reservation);
        let until = wait_until(this.deadline);
        this.held = Some(frame);
        this.waiting = Some(Box::pin(async move {
            let mut room = budget.empty();
            room.grow(bytes, until).await.map(|()| room)
        }));
        self.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.waiting.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
