//! Requests in flight, told to their connection: from the moment a
//! request's head has been read until its answer's last byte has been
//! written (or the answer given up), the connection has no deadline.
//!
//! The answer's body carries the guard, so an answer that streams (the
//! event stream, streaming inference) keeps its connection from counting
//! as idle however quiet it is.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{Request, Response};
use http_body::{Body, Frame, SizeHint};

use super::guarded::{Conn, ConnHandle, Guarded, InFlight};

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
/// connection is given (REST) or found in the request's extensions
/// (gRPC, where tonic puts it).
#[derive(Clone, Debug)]
pub struct Track<S> {
    inner: S,
    conn: Option<Arc<Conn>>,
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

    fn call(&mut self, request: Request<Q>) -> Self::Future {
        let conn = self.conn.clone().or_else(|| request.extensions().get::<ConnHandle>().map(|c| Arc::clone(&c.0)));
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

/// Makes, for each REST connection, the router tracked on it.
#[derive(Clone, Debug)]
pub struct MakeTracked {
    router: axum::Router,
}

impl MakeTracked {
    /// Serves `router` on every connection.
    pub fn new(router: axum::Router) -> MakeTracked {
        MakeTracked { router }
    }
}

/// The router on one connection, answering with axum's body type.
pub type Tracked =
    tower::util::MapResponse<Track<axum::Router>, fn(Response<Held<axum::body::Body>>) -> axum::response::Response>;

fn boxed(response: Response<Held<axum::body::Body>>) -> axum::response::Response {
    response.map(axum::body::Body::new)
}

impl<'a, L> tower::Service<axum::serve::IncomingStream<'a, L>> for MakeTracked
where
    L: axum::serve::Listener<Io = Guarded<tokio::net::TcpStream>>,
{
    type Response = Tracked;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Tracked, std::convert::Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, incoming: axum::serve::IncomingStream<'a, L>) -> Self::Future {
        let conn = Some(Arc::clone(incoming.io().conn()));
        let track = Track { inner: self.router.clone(), conn };
        let map: fn(Response<Held<axum::body::Body>>) -> axum::response::Response = boxed;
        std::future::ready(Ok(tower::util::MapResponse::new(track, map)))
    }
}
