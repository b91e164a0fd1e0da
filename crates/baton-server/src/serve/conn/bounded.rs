//! A listener with a bound on the connections it holds.
//!
//! A connection takes a slot before it is accepted and gives it back when
//! it closes. At the bound the listener does not call `accept` at all:
//! the kernel completes new clients' handshakes and keeps them in the
//! listening socket's queue (up to its backlog), where they cost the
//! server no descriptor, no task and no buffer, and they are accepted in
//! order as slots free.
//!
//! Stopping to accept was chosen over accepting and closing at once (as
//! Envoy's overload manager does): a connection refused at once fails its
//! request, while one that waits is served a moment later, and under a
//! flood of slow clients the timeouts free slots within seconds. Accepting
//! to close would also take a descriptor per refused connection, the very
//! thing that ran out. nginx and Go's `netutil.LimitListener` behave the
//! same way. A client that cannot wait has its own connect timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::guarded::Guarded;
use super::{Limits, Protocol};
use crate::metrics::connections::ListenerConnections;

/// How often, at most, a listener says it has reached its bound.
const SAY_FULL_EVERY: Duration = Duration::from_secs(60);

/// A listening socket that accepts only while it has a free slot.
pub struct Bounded {
    listener: TcpListener,
    address: SocketAddr,
    name: &'static str,
    protocol: Protocol,
    limits: Limits,
    slots: Arc<Semaphore>,
    stats: Arc<ListenerConnections>,
    /// When it last said it was full, in seconds since `started`.
    said_full: AtomicU64,
    started: std::time::Instant,
}

impl Bounded {
    /// `listener`, the listener named `name` (`http`, `grpc`, …), holding
    /// at most `limits.max_connections` connections.
    pub fn new(
        (listener, address): (TcpListener, SocketAddr),
        name: &'static str,
        protocol: Protocol,
        limits: Limits,
        stats: Arc<ListenerConnections>,
    ) -> Bounded {
        let max = limits.max_connections.max(1);
        stats.set_max(max as u64);
        Bounded {
            listener,
            address,
            name,
            protocol,
            limits,
            slots: Arc::new(Semaphore::new(max)),
            stats,
            said_full: AtomicU64::new(u64::MAX),
            started: std::time::Instant::now(),
        }
    }

    /// The next connection, once a slot is free, and its peer's address.
    /// Cancel-safe: dropped while waiting, it has taken no slot and
    /// accepted nothing.
    pub async fn accept(&mut self) -> (Guarded<TcpStream>, SocketAddr) {
        let slot = match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                self.full();
                match Arc::clone(&self.slots).acquire_owned().await {
                    Ok(slot) => slot,
                    // The semaphore is never closed.
                    Err(_) => std::future::pending().await,
                }
            }
        };
        // axum's accept logs an error such as EMFILE and pauses before
        // trying again, rather than spinning.
        let (stream, peer) = axum::serve::Listener::accept(&mut self.listener).await;
        // Answers go out the moment they are written, not after Nagle's
        // wait for the previous segment's ACK (up to 40 ms with delayed ACKs).
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "Could not set TCP_NODELAY on a connection.");
        }
        (Guarded::new(stream, self.protocol, self.limits, Arc::clone(&self.stats), slot), peer)
    }

    fn full(&self) {
        self.stats.reached_bound();
        let now = self.started.elapsed().as_secs();
        let last = self.said_full.load(Ordering::Relaxed);
        if last != u64::MAX && now < last + SAY_FULL_EVERY.as_secs() {
            return;
        }
        self.said_full.store(now, Ordering::Relaxed);
        tracing::warn!(
            listener = self.name,
            address = %self.address,
            max_connections = self.limits.max_connections,
            "A listener holds as many connections as it may; new ones wait in the kernel's queue until one closes."
        );
    }

    /// The connections, one after the other, as tonic's server takes them.
    pub fn incoming(self) -> impl futures_util::Stream<Item = Result<Guarded<TcpStream>, std::io::Error>> {
        futures_util::stream::unfold(self, |mut listener| async move {
            let (connection, _) = listener.accept().await;
            Some((Ok(connection), listener))
        })
    }
}

impl axum::serve::Listener for Bounded {
    type Io = Guarded<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        Bounded::accept(self).await
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.address)
    }
}
