//! Requests in flight, told to their connection: from the moment a
//! request's head has been read until its answer's body has been handed
//! on (or given up), the connection has no header or idle deadline.
//!
//! The answer's body carries the guard, so an answer that streams (the
//! event stream, streaming inference) keeps its connection from counting
//! as idle however quiet it is; such a stream says so itself when it is
//! quiet ([`super::state::Quiet`]), through the [`ConnHandle`] each
//! request finds in its extensions. hyper drops an HTTP/1.1 answer's body
//! once its last bytes are queued; bytes the socket has not taken yet
//! keep the connection busy in [`super::guarded`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{Request, Response};
use http_body::{Body, Frame, SizeHint};

use super::state::{Conn, ConnHandle, InFlight};

pin_project_lite::pin_project! {
    /// An answer's body, holding its request in flight until dropped.
    pub struct Held<B> {
        #[pin]
        inner: B,
        in_flight: Option<InFlight>,
    }
}

impl<B: Body> Body for Held<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A service that tells the connection of each request it serves; the
/// connection is given (REST, which puts it in the request's extensions)
/// or found in the request's extensions (gRPC, where tonic puts it).
#[derive(Clone, Debug)]
pub struct Track<S> {
    inner: S,
    conn: Option<Arc<Conn>>,
}

impl<S> Track<S> {
    /// `inner`, serving the requests of `conn`.
    pub fn new(inner: S, conn: Arc<Conn>) -> Track<S> {
        Track { inner, conn: Some(conn) }
    }
}

impl<S, Q, B> tower::Service<Request<Q>> for Track<S>
where
    S: tower::Service<Request<Q>, Response = Response<B>>,
{
    type Response = Response<Held<B>>;
    type Error = S::Error;
    type Future = Tracking<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Q>) -> Self::Future {
        let conn = match &self.conn {
            Some(conn) => {
                request.extensions_mut().insert(ConnHandle(Arc::clone(conn)));
                Some(Arc::clone(conn))
            }
            None => request.extensions().get::<ConnHandle>().map(|c| Arc::clone(&c.0)),
        };
        let in_flight = conn.map(|c| c.begin());
        Tracking { answer: self.inner.call(request), in_flight }
    }
}

pin_project_lite::pin_project! {
    /// A request being answered: its answer's body takes the guard.
    pub struct Tracking<F> {
        #[pin]
        answer: F,
        in_flight: Option<InFlight>,
    }
}

impl<F, B, E> Future for Tracking<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<Held<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.answer.poll(cx))?;
        let in_flight = this.in_flight.take();
        Poll::Ready(Ok(response.map(|inner| Held { inner, in_flight })))
    }
}

/// [`Track`] as a layer, for tonic's server.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrackLayer;

impl<S> tower::Layer<S> for TrackLayer {
    type Service = Track<S>;

    fn layer(&self, inner: S) -> Track<S> {
        Track { inner, conn: None }
    }
}
