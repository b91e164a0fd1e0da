//! What a connection's requests tell it, and what its listener asks of it:
//! shared by the connection ([`super::guarded::Guarded`]), the requests it
//! carries ([`super::track`]) and its listener ([`super::bounded`]).
//!
//! - A request is **in flight** from the moment its head has been read
//!   until its answer has been handed on (or given up): the connection has
//!   no header or idle deadline meanwhile.
//! - Some requests in flight are **quiet**: an event stream, or a
//!   streaming call waiting for its next message. Nothing is owed to
//!   them, and their clients connect again by themselves, so a connection
//!   whose requests in flight are all quiet may be closed to make room at
//!   its listener's bound: the quiet streams are told ([`Quiet::making_room`])
//!   and end, then the connection closes.
//! - A request whose body is **stalled** (arriving slower than the least
//!   rate allowed, the client still connected) keeps its connection, but
//!   at the bound, when no connection that waits for a request may make
//!   room, the one stalled longest may: its request is refused (408) and
//!   the connection closes ([`Stalled`]). Idle connections go first, since
//!   closing them fails nothing.
//! - An answer the socket would not take (the client reads nothing) keeps
//!   the connection busy until it is written or the send timeout closes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A connection's state, shared by the connection, its requests and its
/// listener.
#[derive(Debug)]
pub struct Conn {
    pub(super) opened: Instant,
    pub(super) in_flight: AtomicUsize,
    /// Of the requests in flight, those that are quiet streams.
    pub(super) quiet: AtomicUsize,
    /// Of the requests in flight, those whose body arrives too slowly.
    pub(super) stalled: AtomicUsize,
    /// When the last body turned slow, in microseconds since `opened`.
    stalled_since_us: AtomicU64,
    /// Requests begun on the connection.
    pub(super) begun: AtomicU64,
    /// When the last request ended (or the last quiet stream turned
    /// quiet, or the last blocked answer was written), in microseconds
    /// since `opened`.
    idle_since_us: AtomicU64,
    /// A write is waiting for the client to take bytes.
    pub(super) blocked: AtomicBool,
    /// The connection's reader, woken when its last request ends, when a
    /// blocked answer is written, or when it is asked to make room.
    pub(super) reader: AtomicWaker,
    /// Asked to close, to make room for a new connection.
    pub(super) evict: AtomicBool,
    /// Tells the quiet streams that the connection makes room.
    making_room: Notify,
}

impl Conn {
    pub(super) fn new() -> Conn {
        Conn {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            quiet: AtomicUsize::new(0),
            stalled: AtomicUsize::new(0),
            stalled_since_us: AtomicU64::new(0),
            begun: AtomicU64::new(0),
            idle_since_us: AtomicU64::new(0),
            blocked: AtomicBool::new(false),
            reader: AtomicWaker::new(),
            evict: AtomicBool::new(false),
            making_room: Notify::new(),
        }
    }

    /// When the connection may be closed to make room for another, at
    /// the soonest: `after` once it has waited that long for its first
    /// request, or been idle (or had only quiet streams in flight) that
    /// long since its last. `None` while a request that is not quiet is
    /// in flight, or an answer waits for the client to read it.
    pub fn evictable_at(&self, after: Duration) -> Option<Instant> {
        let in_flight = self.in_flight.load(Ordering::Acquire);
        if in_flight > self.quiet.load(Ordering::Acquire) || self.blocked.load(Ordering::Acquire) {
            return None;
        }
        let since = if self.begun.load(Ordering::Acquire) == 0 { self.opened } else { self.idle_since() };
        Some(since + after)
    }

    /// Since when the connection may be closed to make room for its
    /// requests' slow bodies: when every request in flight is quiet or has
    /// a body arriving slower than the least rate allowed (see
    /// [`Stalled`]), the time the last of those bodies turned slow. `None`
    /// otherwise, or while an answer waits for the client.
    pub fn stalled_since(&self) -> Option<Instant> {
        let stalled = self.stalled.load(Ordering::Acquire);
        let in_flight = self.in_flight.load(Ordering::Acquire);
        let waiting = self.quiet.load(Ordering::Acquire) + stalled;
        if stalled == 0 || in_flight > waiting || self.blocked.load(Ordering::Acquire) {
            return None;
        }
        Some(self.opened + Duration::from_micros(self.stalled_since_us.load(Ordering::Acquire)))
    }

    /// Requests in flight that may end to make room: quiet streams and
    /// stalled bodies.
    pub(super) fn waiting(&self) -> usize {
        self.quiet.load(Ordering::Acquire) + self.stalled.load(Ordering::Acquire)
    }

    /// Asks the connection to close: at once if it has nothing in flight
    /// when its reader next looks and no request waits in its socket;
    /// once they have ended if it holds only quiet streams.
    pub fn evict(&self) {
        self.evict.store(true, Ordering::Release);
        self.reader.wake();
        self.making_room.notify_waiters();
    }

    /// Notes a request begun; the connection has no deadline until the
    /// returned guard is dropped (the answer handed on, or given up).
    pub fn begin(self: &Arc<Conn>) -> InFlight {
        self.begun.fetch_add(1, Ordering::AcqRel);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }

    /// Notes that a request in flight is a quiet stream until the returned
    /// guard is dropped.
    pub fn quiet(self: &Arc<Conn>) -> Quiet {
        self.idle_from_now();
        self.quiet.fetch_add(1, Ordering::AcqRel);
        Quiet(Arc::clone(self))
    }

    /// Notes that a request's body arrives too slowly until the returned
    /// guard is dropped (it caught up, or the request ended).
    pub fn stall(self: &Arc<Conn>) -> Stalled {
        let now = u64::try_from(self.opened.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.stalled_since_us.fetch_max(now, Ordering::AcqRel);
        self.stalled.fetch_add(1, Ordering::AcqRel);
        Stalled(Arc::clone(self))
    }

    pub(super) fn idle_since(&self) -> Instant {
        self.opened + Duration::from_micros(self.idle_since_us.load(Ordering::Acquire))
    }

    /// Counts the connection's idle time from now.
    pub(super) fn idle_from_now(&self) {
        let now = u64::try_from(self.opened.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.idle_since_us.fetch_max(now, Ordering::AcqRel);
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub struct InFlight(Arc<Conn>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let conn = &self.0;
        // Before the count falls, so that a reader seeing none in flight
        // sees when the last one ended.
        conn.idle_from_now();
        if conn.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            conn.reader.wake();
        }
    }
}

/// A request in flight that is a quiet stream, while it is.
#[derive(Debug)]
pub struct Quiet(Arc<Conn>);

impl Quiet {
    /// Resolves once the connection is asked to make room: the stream
    /// should end.
    pub async fn making_room(&self) {
        making_room(&self.0).await;
    }
}

/// Resolves once `conn` is asked to make room.
async fn making_room(conn: &Conn) {
    loop {
        let notified = conn.making_room.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        if conn.evict.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }
}

/// A request in flight whose body arrives slower than the least rate
/// allowed, while it does.
#[derive(Debug)]
pub struct Stalled(Arc<Conn>);

impl Stalled {
    /// Resolves once the connection is asked to make room: the request
    /// should give up its body. Owns what it waits on, so that a body can
    /// keep it across polls.
    pub fn making_room(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let conn = Arc::clone(&self.0);
        async move { making_room(&conn).await }
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        self.0.stalled.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        self.0.quiet.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a request finds in its extensions: its connection.
#[derive(Clone, Debug)]
pub struct ConnHandle(pub Arc<Conn>);

/// Holds a request quiet (when it has a connection) and resolves once its
/// connection is asked to make room; never without a connection. For a
/// stream that lives as long as its client wants: end it when this does.
pub async fn quiet_until_making_room(conn: Option<ConnHandle>) {
    match conn.map(|c| c.quiet()) {
        Some(quiet) => quiet.making_room().await,
        None => std::future::pending().await,
    }
}

impl ConnHandle {
    /// Notes that the request is a quiet stream, while the guard lives.
    pub fn quiet(&self) -> Quiet {
        self.0.quiet()
    }

    /// Notes that the request's body arrives too slowly, while the guard
    /// lives.
    pub fn stall(&self) -> Stalled {
        self.0.stall()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_with_only_quiet_streams_in_flight_may_make_room() {
        let conn = Arc::new(Conn::new());
        let after = Duration::from_secs(1);
        assert_eq!(conn.evictable_at(after), Some(conn.opened + after), "no request yet");
        let stream = conn.begin();
        assert_eq!(conn.evictable_at(after), None, "a request in flight");
        let quiet = conn.quiet();
        let since = conn.evictable_at(after).expect("only a quiet stream in flight");
        assert!(since >= conn.opened + after);
        let request = conn.begin();
        assert_eq!(conn.evictable_at(after), None, "a request beside the quiet stream");
        drop(request);
        assert!(conn.evictable_at(after).is_some());
        conn.blocked.store(true, Ordering::Release);
        assert_eq!(conn.evictable_at(after), None, "an answer waits for the client");
        conn.blocked.store(false, Ordering::Release);
        drop((quiet, stream));
        assert!(conn.evictable_at(after).is_some());
    }

    #[test]
    fn a_stalled_body_may_make_room_only_when_nothing_else_is_in_flight() {
        let conn = Arc::new(Conn::new());
        let request = conn.begin();
        assert_eq!(conn.stalled_since(), None, "a request whose body flows");
        let stalled = conn.stall();
        assert!(conn.stalled_since().is_some_and(|at| at >= conn.opened));
        assert_eq!(conn.evictable_at(Duration::from_secs(1)), None, "a stalled body is not an idle connection");
        let other = conn.begin();
        assert_eq!(conn.stalled_since(), None, "another request in flight");
        drop(other);
        conn.blocked.store(true, Ordering::Release);
        assert_eq!(conn.stalled_since(), None, "an answer waits for the client");
        conn.blocked.store(false, Ordering::Release);
        drop(stalled);
        assert_eq!(conn.stalled_since(), None, "the body caught up");
        drop(request);
    }

    #[tokio::test]
    async fn quiet_streams_learn_that_their_connection_makes_room() {
        let conn = Arc::new(Conn::new());
        let _stream = conn.begin();
        let quiet = conn.quiet();
        let told = quiet.making_room();
        let mut told = std::pin::pin!(told);
        assert!(futures_util::FutureExt::now_or_never(told.as_mut()).is_none(), "told before the ask");
        conn.evict();
        tokio::time::timeout(Duration::from_secs(5), told).await.expect("told");
        // A stream that turns quiet after the ask is told at once.
        let later = conn.quiet();
        tokio::time::timeout(Duration::from_secs(5), later.making_room()).await.expect("told at once");
    }
}
