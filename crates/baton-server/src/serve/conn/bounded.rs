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
//! request, while one that waits is served a moment later. Accepting to
//! close would also take a descriptor per refused connection, the very
//! thing that ran out. nginx and Go's `netutil.LimitListener` behave the
//! same way.
//!
//! Waiting alone would leave new clients queued behind a flood of slow
//! ones for a whole header read timeout per round. So at the bound, when
//! a client waits in the queue, the listener also makes room, as nginx
//! does with its idle keep-alive connections: it asks the oldest
//! connection that has waited at least [`MAKE_ROOM_AFTER`] for its first
//! request, or been idle (or held only quiet streams, see
//! [`super::state`]) that long since its last, to close. Only when none
//! may, it asks the one whose request's body has been arriving too slowly
//! for the longest (see `http::body`): that request is refused with 408
//! (kind `body_stalled`), as a slow client's body would be at the body
//! read timeout, only sooner. A connection with a request in flight whose
//! body keeps up, or that is being answered, is never closed to make
//! room, and one whose next request is already in its socket reads it
//! instead.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::guarded::Guarded;
use super::state::Conn;
use super::{Limits, Protocol};
use crate::metrics::connections::ListenerConnections;

/// How often, at most, a listener says it has reached its bound.
const SAY_FULL_EVERY: Duration = Duration::from_secs(60);

/// At the bound, with a connection that may make room, how often the
/// listener looks whether a client waits for one.
const LOOK_FOR_CLIENTS_EVERY: Duration = Duration::from_millis(50);

/// After asking a connection to make room, how long before the listener
/// asks another if no slot has freed (the one asked may have had a
/// request arrive).
const ASK_AGAIN_AFTER: Duration = Duration::from_millis(250);

/// How long a connection must have waited for a request (its first, or
/// its next) before it may be closed to make room: far longer than a
/// client takes to send a head it has ready.
pub const MAKE_ROOM_AFTER: Duration = Duration::from_secs(1);

/// A listening socket that accepts only while it has a free slot.
pub struct Bounded {
    listener: TcpListener,
    address: SocketAddr,
    name: &'static str,
    protocol: Protocol,
    limits: Limits,
    slots: Arc<Semaphore>,
    stats: Arc<ListenerConnections>,
    /// When it last said it was full.
    said_full: Option<std::time::Instant>,
    /// Its connections, oldest first (some may be gone).
    accepted: VecDeque<Weak<Conn>>,
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
            said_full: None,
            accepted: VecDeque::new(),
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
                self.room().await
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
        let connection = Guarded::new(stream, self.protocol, self.limits, Arc::clone(&self.stats), slot);
        self.remember(connection.conn());
        (connection, peer)
    }

    /// A slot, once one frees, making room meanwhile for a client that
    /// waits.
    async fn room(&mut self) -> tokio::sync::OwnedSemaphorePermit {
        loop {
            let look_again = self.make_room();
            let freed = Arc::clone(&self.slots).acquire_owned();
            tokio::select! {
                slot = freed => match slot {
                    Ok(slot) => return slot,
                    // The semaphore is never closed.
                    Err(_) => std::future::pending().await,
                },
                () = tokio::time::sleep_until(look_again) => {}
            }
        }
    }

    /// Asks the oldest connection that may make room (see the module's
    /// docs) to close, if a client waits in the accept queue, and returns
    /// when to look again: soon after an ask, in case the connection had a
    /// request arrive meanwhile; soon while a connection may make room
    /// but no client waits; else when the first connection that waits for
    /// a request may make room, or sooner, since a request's body may turn
    /// slow.
    fn make_room(&mut self) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        self.accepted.retain(|c| c.strong_count() > 0);
        let mut soonest: Option<tokio::time::Instant> = None;
        // A connection that waits for a request first, the oldest: closing
        // it fails nothing.
        let mut oldest = None;
        for weak in &self.accepted {
            let Some(conn) = weak.upgrade() else { continue };
            match conn.evictable_at(MAKE_ROOM_AFTER) {
                Some(when) if when <= now => {
                    oldest = Some(conn);
                    break;
                }
                Some(when) => soonest = Some(soonest.map_or(when, |s| s.min(when))),
                None => {}
            }
        }
        // Only then the one whose request's body has been slow the longest.
        if oldest.is_none() {
            let stalled = self.accepted.iter().filter_map(Weak::upgrade).filter_map(|c| Some((c.stalled_since()?, c)));
            oldest = stalled.min_by_key(|(since, _)| *since).map(|(_, conn)| conn);
        }
        // A body may turn slow at any moment, the clock alone deciding:
        // with requests in flight, look again soon.
        let in_flight_soon = now + ASK_AGAIN_AFTER;
        let Some(oldest) = oldest else { return soonest.map_or(in_flight_soon, |s| s.min(in_flight_soon)) };
        if !self.client_waits() {
            return now + LOOK_FOR_CLIENTS_EVERY;
        }
        // It stays among the connections: if a request arrives on it
        // before it closes, it may make room again once idle.
        oldest.evict();
        now + ASK_AGAIN_AFTER
    }

    /// Whether a client waits in the listening socket's accept queue,
    /// looked at without accepting it.
    fn client_waits(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let mut socket = [PollFd::new(&self.listener, PollFlags::IN)];
        let none = Timespec { tv_sec: 0, tv_nsec: 0 };
        // Should the look fail, room is made as if a client waited.
        poll(&mut socket, Some(&none)).map_or(true, |ready| ready > 0)
    }

    /// Keeps `conn` among the listener's connections, forgetting those gone.
    fn remember(&mut self, conn: &Arc<Conn>) {
        while self.accepted.front().is_some_and(|c| c.strong_count() == 0) {
            self.accepted.pop_front();
        }
        if self.accepted.len() >= 2 * self.limits.max_connections.max(1) {
            self.accepted.retain(|c| c.strong_count() > 0);
        }
        self.accepted.push_back(Arc::downgrade(conn));
    }

    fn full(&mut self) {
        self.stats.reached_bound();
        if self.said_full.is_some_and(|at| at.elapsed() < SAY_FULL_EVERY) {
            return;
        }
        self.said_full = Some(std::time::Instant::now());
        tracing::warn!(
            listener = self.name,
            address = %self.address,
            max_connections = self.limits.max_connections,
            "A listener holds as many connections as it may; new ones wait in the kernel's queue until one closes or makes room."
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
