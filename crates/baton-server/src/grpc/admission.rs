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
//! - It gives the body the body read timeout: a unary call's message (and
//!   the end of its stream) must arrive within it of the call's start, a
//!   streamed message within it of its first byte. Past it the call fails
//!   with `DEADLINE_EXCEEDED` (kind `body_timeout`) and the room its
//!   frames held is given back: a client that announces a message and
//!   stops sending cannot hold the budget.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

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
pub struct Frames(Arc<FramesInner>);

#[derive(Debug)]
struct FramesInner {
    room: Mutex<Reservation>,
    /// A message has begun to arrive and has not ended.
    receiving: AtomicBool,
}

impl Frames {
    fn new(budget: &Arc<Budget>) -> Frames {
        Frames(Arc::new(FramesInner { room: Mutex::new(budget.empty()), receiving: AtomicBool::new(false) }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reservation> {
        self.0.room.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives back the room of a message that has been decoded.
    pub fn release(&self, bytes: u64) {
        self.lock().release(bytes);
    }

    /// Whether a message of the call has begun to arrive and not ended
    /// (known for streaming calls only).
    pub fn receiving(&self) -> bool {
        self.0.receiving.load(Ordering::Acquire)
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

/// The one call whose client sends a stream of messages; every other
/// call's request is one message.
const STREAMING_CALL: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

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
        let reading = match app.limits.body_read_timeout {
            None => Reading::Unbounded,
            Some(timeout) if request.uri().path() == STREAMING_CALL => {
                Reading::EachMessage { timeout, framing: Framing::default(), since: None }
            }
            Some(timeout) => Reading::Whole { timeout, until: arrived + timeout },
        };
        let request = request.map(|body| {
            tonic::body::Body::new(Budgeted {
                inner: body,
                frames,
                deadline,
                app,
                held: None,
                waiting: None,
                reading,
                timer: None,
            })
        });
        self.inner.call(request)
    }
}

type Waiting = Pin<Box<dyn Future<Output = Result<Reservation, ServeError>> + Send>>;

/// How long a call's body may take to arrive.
enum Reading {
    /// No body read timeout.
    Unbounded,
    /// A unary call: its whole body by `until`.
    Whole { timeout: Duration, until: Instant },
    /// A streaming call: each message within `timeout` of its first byte,
    /// `since` being when the message under way began.
    EachMessage { timeout: Duration, framing: Framing, since: Option<Instant> },
}

impl Reading {
    /// Notes a data frame's bytes; says whether a message is under way.
    fn read(&mut self, bytes: &[u8]) -> bool {
        let Reading::EachMessage { framing, since, .. } = self else { return false };
        let (ended, open) = framing.read(bytes);
        *since = match (open, *since) {
            (false, _) => None,
            (true, Some(began)) if !ended => Some(began),
            (true, _) => Some(Instant::now()),
        };
        open
    }

    /// When the body (or the message under way) must have arrived, and
    /// the timeout that sets it.
    fn deadline(&self) -> Option<(Instant, Duration)> {
        match self {
            Reading::Unbounded => None,
            Reading::Whole { timeout, until } => Some((*until, *timeout)),
            Reading::EachMessage { timeout, since, .. } => since.map(|s| (s + *timeout, *timeout)),
        }
    }
}

/// Where a stream of gRPC messages is: each is a 5-byte prefix (a flag and
/// a big-endian length) followed by that many bytes.
#[derive(Debug, Default)]
struct Framing {
    prefix: [u8; 5],
    prefix_seen: usize,
    /// Bytes of the message under way still to come.
    remaining: u64,
}

impl Framing {
    /// Reads `bytes`; says whether a message ended among them, and whether
    /// one is under way after them.
    fn read(&mut self, mut bytes: &[u8]) -> (bool, bool) {
        let mut ended = false;
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let n = usize::try_from(self.remaining).unwrap_or(usize::MAX).min(bytes.len());
                self.remaining -= n as u64;
                bytes = &bytes[n..];
                ended |= self.remaining == 0;
                continue;
            }
            let n = (self.prefix.len() - self.prefix_seen).min(bytes.len());
            self.prefix[self.prefix_seen..self.prefix_seen + n].copy_from_slice(&bytes[..n]);
            self.prefix_seen += n;
            bytes = &bytes[n..];
            if self.prefix_seen == self.prefix.len() {
                self.prefix_seen = 0;
                let [_, a, b, c, d] = self.prefix;
                self.remaining = u64::from(u32::from_be_bytes([a, b, c, d]));
                ended |= self.remaining == 0;
            }
        }
        (ended, self.prefix_seen > 0 || self.remaining > 0)
    }
}

/// A call's body, each data frame reserved before it is handed on, read
/// within the body read timeout.
struct Budgeted {
    inner: tonic::body::Body,
    frames: Frames,
    deadline: Option<Instant>,
    app: Arc<App>,
    /// A frame waiting for room.
    held: Option<Frame<Bytes>>,
    waiting: Option<Waiting>,
    reading: Reading,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Budgeted {
    /// With no frame to hand on: fails the body once its deadline passes.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some((until, timeout)) = self.reading.deadline() else { return Poll::Pending };
        let until = tokio::time::Instant::from_std(until);
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
        if timer.deadline() != until {
            timer.as_mut().reset(until);
        }
        ready!(timer.as_mut().poll(cx));
        self.reading = Reading::Unbounded;
        self.app.metrics.connections.grpc_body_timed_out();
        let error = ServeError::new(
            Class::RequestTimeout,
            "body_timeout",
            format!("the call's message did not arrive within the body read timeout ({} ms)", timeout.as_millis()),
        );
        Poll::Ready(Some(Err(Box::new(Status::from(error)))))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl http_body::Body for Budgeted {
    type Data = Bytes;
    type Error = BoxError;

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
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.reading = Reading::Unbounded;
                return Poll::Ready(None);
            }
            Poll::Pending => return this.poll_deadline(cx),
        };
        if let Some(data) = frame.data_ref() {
            let receiving = this.reading.read(data);
            this.frames.0.receiving.store(receiving, Ordering::Release);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(length: u32) -> Vec<u8> {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&length.to_be_bytes());
        bytes.extend(std::iter::repeat_n(7, length as usize));
        bytes
    }

    #[test]
    fn framing_knows_when_a_message_is_under_way_however_the_bytes_are_cut() {
        let mut stream = message(10);
        stream.extend(message(0));
        stream.extend(message(3));
        // After each byte: whether a message is under way.
        let mut open_after = Vec::new();
        let mut framing = Framing::default();
        for byte in &stream {
            open_after.push(framing.read(std::slice::from_ref(byte)).1);
        }
        let ends = [14, 19, 27]; // the last byte of each message
        for (at, open) in open_after.iter().enumerate() {
            assert_eq!(*open, !ends.contains(&at), "after byte {at}");
        }
        for cut in [2, 3, 5, 7, stream.len()] {
            let mut framing = Framing::default();
            let mut last = (false, true);
            for piece in stream.chunks(cut) {
                last = framing.read(piece);
            }
            assert!(!last.1, "pieces of {cut}: a message still under way at the end");
        }
        let (ended, open) = Framing::default().read(&message(4)[..6]);
        assert!(!ended && open, "a message cut after its prefix is under way");
    }
}
