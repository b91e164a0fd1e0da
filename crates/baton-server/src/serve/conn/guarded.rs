//! A connection with deadlines: the header read timeout and the idle
//! timeout, kept by the connection's own reads.
//!
//! Whenever the server reads from the connection and nothing is there,
//! [`Guarded`] asks which deadline applies now, arms one timer for it, and
//! when it passes ends the connection: the read fails (a head that did not
//! arrive) or sees the end of the stream (an idle connection, which hyper
//! then closes quietly). A connection is only ever closed while the server
//! waits to read and the socket holds no byte, never while a request is in
//! flight, which the connection learns from [`super::track`].
//!
//! Which deadline applies:
//!
//! | state | HTTP/1.1 | HTTP/2 (gRPC) |
//! |---|---|---|
//! | no request yet | header, from accept | header for the handshake (preface and first SETTINGS), then idle |
//! | a request in flight | none | none |
//! | between requests | idle, from the last answer; header from a new head's first byte | idle, from the last answer |
//!
//! Counting the first head from accept, not from its first byte, is what
//! nginx and Go do: a client that connects and sends nothing is as slow as
//! one that sends a byte at a time. Each byte does not renew the deadline.
//! HTTP/2 has no byte that surely starts a request (pings, window updates
//! and settings come and go), so between requests only the idle timeout
//! applies; a stream's headers are bounded by h2's limit on their size.
//!
//! hyper has a header read timeout of its own, but its timer also runs
//! while a keep-alive connection waits for its next request, so the idle
//! time could never be longer than the header time; and it knows nothing
//! of HTTP/2's handshake. Hence these deadlines, kept beside hyper.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use super::{Limits, Protocol};
use crate::metrics::connections::{Closed, ListenerConnections};

/// What a connection's requests tell it: shared by the connection and
/// the requests it carries.
#[derive(Debug)]
pub struct Conn {
    opened: Instant,
    in_flight: AtomicUsize,
    /// Requests begun on the connection.
    begun: AtomicU64,
    /// When the last request ended, in microseconds since `opened`.
    idle_since_us: AtomicU64,
    /// The connection's reader, woken when its last request ends or it is
    /// asked to make room.
    reader: AtomicWaker,
    /// Asked to close, to make room for a new connection.
    evict: AtomicBool,
}

impl Conn {
    fn new() -> Conn {
        Conn {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            begun: AtomicU64::new(0),
            idle_since_us: AtomicU64::new(0),
            reader: AtomicWaker::new(),
            evict: AtomicBool::new(false),
        }
    }

    /// When the connection may be closed to make room for another, at
    /// the soonest: `after` once it has waited that long for its first
    /// request, or been idle that long since its last. `None` while a
    /// request is in flight.
    pub fn evictable_at(&self, after: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = if self.begun.load(Ordering::Acquire) == 0 { self.opened } else { self.idle_since() };
        Some(since + after)
    }

    /// Asks the connection to close, if it has no request in flight when
    /// its reader next looks.
    pub fn evict(&self) {
        self.evict.store(true, Ordering::Release);
        self.reader.wake();
    }

    /// Notes a request begun; the connection has no deadline until the
    /// returned guard is dropped (the answer written, or given up).
    pub fn begin(self: &Arc<Conn>) -> InFlight {
        self.begun.fetch_add(1, Ordering::AcqRel);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }

    fn idle_since(&self) -> Instant {
        self.opened + Duration::from_micros(self.idle_since_us.load(Ordering::Acquire))
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub struct InFlight(Arc<Conn>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let conn = &self.0;
        let now = u64::try_from(conn.opened.elapsed().as_micros()).unwrap_or(u64::MAX);
        // Before the count falls, so that a reader seeing none in flight
        // sees when the last one ended.
        conn.idle_since_us.fetch_max(now, Ordering::AcqRel);
        if conn.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            conn.reader.wake();
        }
    }
}

/// Where an HTTP/2 client is in its handshake: the 24-byte preface, then
/// a SETTINGS frame whose length its first three bytes give.
#[derive(Debug, Default)]
struct Handshake {
    seen: usize,
    length: [u8; 3],
    done_at: Option<Instant>,
}

const PREFACE: usize = 24;
const FRAME_HEAD: usize = 9;

impl Handshake {
    fn read(&mut self, bytes: &[u8]) {
        for (at, byte) in (self.seen..).zip(bytes) {
            if (PREFACE..PREFACE + 3).contains(&at) {
                self.length[at - PREFACE] = *byte;
            }
            if at >= PREFACE + 3 {
                break;
            }
        }
        self.seen = self.seen.saturating_add(bytes.len());
        if self.seen >= PREFACE + 3 {
            let length =
                usize::from(self.length[0]) << 16 | usize::from(self.length[1]) << 8 | usize::from(self.length[2]);
            if self.seen >= PREFACE + FRAME_HEAD + length {
                self.done_at = Some(Instant::now());
            }
        }
    }
}

/// A client connection with deadlines; holds its listener's slot until
/// dropped.
pub struct Guarded<IO> {
    inner: IO,
    conn: Arc<Conn>,
    protocol: Protocol,
    limits: Limits,
    /// HTTP/1.1: when a head after the first began to arrive, and the
    /// requests begun then.
    head_began: Option<(Instant, u64)>,
    handshake: Handshake,
    timer: Option<(Pin<Box<Sleep>>, Instant)>,
    closed: Option<Closed>,
    stats: Arc<ListenerConnections>,
    _slot: OwnedSemaphorePermit,
}

impl<IO> Guarded<IO> {
    /// `inner`, just accepted into `slot`.
    pub fn new(
        inner: IO,
        protocol: Protocol,
        limits: Limits,
        stats: Arc<ListenerConnections>,
        slot: OwnedSemaphorePermit,
    ) -> Guarded<IO> {
        stats.opened();
        Guarded {
            inner,
            conn: Arc::new(Conn::new()),
            protocol,
            limits,
            head_began: None,
            handshake: Handshake::default(),
            timer: None,
            closed: None,
            stats,
            _slot: slot,
        }
    }

    /// What the connection's requests report to.
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// The deadline that applies now, and what passing it means; none
    /// while a request is in flight.
    fn deadline(&self) -> Option<(Instant, Closed)> {
        if self.conn.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let Limits { header_read_timeout: header, idle_timeout: idle, .. } = self.limits;
        let header_from = |start: Instant| header.or(idle).map(|t| (start + t, Closed::HeaderTimeout));
        let idle_from = |start: Instant| idle.map(|t| (start + t, Closed::IdleTimeout));
        let begun = self.conn.begun.load(Ordering::Acquire);
        match self.protocol {
            Protocol::Http1 if begun == 0 => header_from(self.conn.opened),
            Protocol::Http1 => match self.head_began {
                Some((at, during)) if during == begun => header_from(at),
                _ => idle_from(self.conn.idle_since()),
            },
            Protocol::Http2 => match self.handshake.done_at {
                None => header_from(self.conn.opened),
                Some(done) if begun == 0 => idle_from(done),
                Some(_) => idle_from(self.conn.idle_since()),
            },
        }
    }

    /// Notes bytes read: a head that begins, a handshake that advances.
    fn read(&mut self, bytes: &[u8]) {
        match self.protocol {
            Protocol::Http1 => {
                let begun = self.conn.begun.load(Ordering::Acquire);
                let idle = begun > 0 && self.conn.in_flight.load(Ordering::Acquire) == 0;
                if idle && self.head_began.is_none_or(|(_, during)| during != begun) {
                    self.head_began = Some((Instant::now(), begun));
                }
            }
            Protocol::Http2 if self.handshake.done_at.is_none() => self.handshake.read(bytes),
            Protocol::Http2 => {}
        }
    }

    /// With nothing to read: ends the connection if its deadline has
    /// passed, else arms the timer for it.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Registered before the count is read: the last request ending
        // after this point wakes the reader, and a deadline starts.
        self.conn.reader.register(cx.waker());
        let Some((deadline, why)) = self.deadline() else { return Poll::Pending };
        let (timer, armed) = self.timer.get_or_insert_with(|| (Box::pin(tokio::time::sleep_until(deadline)), deadline));
        if *armed != deadline {
            timer.as_mut().reset(deadline);
            *armed = deadline;
        }
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(self.close(why))
    }

    fn close(&mut self, why: Closed) -> io::Result<()> {
        self.closed = Some(why);
        self.stats.closed(why);
        let requests = self.conn.begun.load(Ordering::Relaxed);
        tracing::debug!(reason = why.as_str(), requests, "Closed a client connection.");
        end(why)
    }

    /// Whether the connection was asked to make room and may: it has no
    /// request in flight. A request begun since keeps it open.
    fn evicted(&self) -> bool {
        self.conn.evict.swap(false, Ordering::AcqRel) && self.conn.in_flight.load(Ordering::Acquire) == 0
    }
}

/// What a read returns once the connection is closed for `why`.
fn end(why: Closed) -> io::Result<()> {
    match why {
        Closed::HeaderTimeout => {
            Err(io::Error::new(io::ErrorKind::TimedOut, "the request head did not arrive in time"))
        }
        // The end of the stream: hyper closes an idle connection quietly.
        Closed::IdleTimeout | Closed::Evicted => Ok(()),
    }
}

impl<IO> Drop for Guarded<IO> {
    fn drop(&mut self) {
        self.stats.gone();
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(why) = this.closed {
            return Poll::Ready(end(why));
        }
        if this.evicted() {
            return Poll::Ready(this.close(Closed::Evicted));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.read(&buf.filled()[before..]);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_deadline(cx),
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What a gRPC request finds in its extensions: its connection.
#[derive(Clone, Debug)]
pub struct ConnHandle(pub Arc<Conn>);

impl tonic::transport::server::Connected for Guarded<tokio::net::TcpStream> {
    type ConnectInfo = ConnHandle;

    fn connect_info(&self) -> ConnHandle {
        ConnHandle(Arc::clone(&self.conn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handshake_ends_with_the_first_settings_frame_however_it_is_cut() {
        let mut whole = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        whole.extend_from_slice(&[0, 0, 12, 4, 0, 0, 0, 0, 0]);
        whole.extend_from_slice(&[0; 12]);
        for cut in [1, 2, 5, 24, 25, 26, 27, 33, whole.len()] {
            let mut handshake = Handshake::default();
            let mut pieces = whole.chunks(cut).peekable();
            while let Some(piece) = pieces.next() {
                handshake.read(piece);
                let last = pieces.peek().is_none();
                assert_eq!(handshake.done_at.is_some(), last, "pieces of {cut}: done too early or never");
            }
        }
        let mut short = Handshake::default();
        short.read(&whole[..whole.len() - 1]);
        assert!(short.done_at.is_none(), "one byte of the frame missing");
    }
}
