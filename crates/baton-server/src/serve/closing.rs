//! How HTTP/1.1 connections end when the server drains: at a request
//! boundary, not under a client that is sending.
//!
//! Closing an idle keep-alive connection the moment draining begins races
//! the client: a request it sends just then meets a closed socket and
//! fails, though the server (or the one that replaces it) would have
//! answered. So draining goes in two steps:
//!
//! 1. The server stops accepting (a new server sharing the listening
//!    socket takes every new connection), and every answer from then on
//!    says `Connection: close`: the client sends its next request on a new
//!    connection, and the server closes this one once the answer is out.
//! 2. [`IDLE_GRACE`] later, connections still open and idle are closed:
//!    a client that sends nothing for that long is not mid-request.

use std::time::Duration;

use axum::http::{HeaderValue, header};
use axum::response::Response;
use tokio::sync::watch;

/// How long after draining begins idle keep-alive connections stay open
/// for their next request, answered with `Connection: close`.
pub const IDLE_GRACE: Duration = Duration::from_secs(1);

/// A listener that stops accepting once `stopped` turns true, leaving the
/// listening socket open (a new server may share it).
pub struct UntilDraining<L> {
    inner: L,
    stopped: watch::Receiver<bool>,
}

impl<L> UntilDraining<L> {
    /// `inner`, accepting until `stopped` turns true.
    pub fn new(inner: L, stopped: watch::Receiver<bool>) -> UntilDraining<L> {
        UntilDraining { inner, stopped }
    }
}

impl<L: axum::serve::Listener> axum::serve::Listener for UntilDraining<L> {
    type Io = L::Io;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let stopped = crate::grpc::draining(self.stopped.clone());
        tokio::select! {
            biased;
            () = stopped => std::future::pending().await,
            accepted = self.inner.accept() => accepted,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// Resolves [`IDLE_GRACE`] after `stopped` turns true: when idle
/// connections are closed.
pub async fn idle_closed(stopped: watch::Receiver<bool>) {
    crate::grpc::draining(stopped).await;
    tokio::time::sleep(IDLE_GRACE).await;
}

/// Adds `Connection: close` to an answer while the server drains.
pub fn close_when_draining(draining: bool, mut response: Response) -> Response {
    if draining {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}
