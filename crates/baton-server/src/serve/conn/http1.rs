//! Serving REST on a bounded listener: HTTP/1.1 only, each connection's
//! requests tracked ([`super::track`]), and a graceful shutdown.
//!
//! axum's `serve` answers HTTP/2 as well whenever hyper-util is built with
//! it, as tonic builds it: a client could then open up to hyper's 200
//! streams per connection on the REST port, where the listener's bound and
//! deadlines count connections and HTTP/1.1 requests. baton's REST is
//! HTTP/1.1 only (an HTTP/2 preface is refused as a bad request); HTTP/2
//! is gRPC's port, with its streams per connection bounded.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::serve::Listener;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::guarded::Guarded;
use super::track::Track;

/// Serves `router` on every connection `listener` accepts until
/// `shutdown` resolves; then stops accepting, asks every connection to
/// close once its request in flight is answered (idle ones close at
/// once), and returns when all have.
pub async fn serve<L>(mut listener: L, router: Router, shutdown: impl Future<Output = ()> + Send + 'static)
where
    L: Listener<Io = Guarded<TcpStream>>,
{
    // Every connection holds a receiver of `stop` and of `running`: the
    // first tells them to shut down (its sender dropped), the second
    // counts them until they end.
    let (stop, stopped) = watch::channel(());
    tokio::spawn(async move {
        shutdown.await;
        drop(stopped);
    });
    let (running, connections) = watch::channel(());
    loop {
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.closed() => break,
        };
        let service = TowerToHyperService::new(Track::new(router.clone(), Arc::clone(io.conn())));
        let (stop, connection_running) = (stop.clone(), connections.clone());
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                served = connection.as_mut() => log_end(served),
                () = stop.closed() => {
                    connection.as_mut().graceful_shutdown();
                    log_end(connection.await);
                }
            }
            drop(connection_running);
        });
    }
    drop((connections, listener));
    running.closed().await;
}

fn log_end(served: Result<(), hyper::Error>) {
    if let Err(error) = served {
        tracing::trace!(%error, "A client connection ended with an error.");
    }
}
