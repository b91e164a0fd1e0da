//! A connection with deadlines: the header read timeout and the idle
//! timeout, kept by the connection's own reads, and the send timeout, kept
//! by its writes.
//!
//! Whenever the server reads from the connection and nothing is there,
//! [`Guarded`] asks which deadline applies now, arms one timer for it, and
//! when it passes ends the connection: the read fails (a head that did not
//! arrive) or sees the end of the stream (an idle connection, which hyper
//! then closes quietly). A connection is only ever closed by these while
//! the server waits to read and the socket holds no byte, never while a
//! request is in flight, which the connection learns from
//! [`super::track`] (see [`super::state`]).
//!
//! Which deadline applies:
//!
//! | state | HTTP/1.1 | HTTP/2 (gRPC) |
//! |---|---|---|
//! | no request yet | header, from accept | header for the handshake (preface and first SETTINGS), then idle |
//! | a request in flight | none | none |
//! | an answer the client does not take | send | send |
//! | between requests | idle, from the last answer; header from a new head's first byte | idle, from the last answer |
//!
//! Counting the first head from accept, not from its first byte, is what
//! nginx and Go do: a client that connects and sends nothing is as slow as
//! one that sends a byte at a time. Each byte does not renew the deadline.
//! HTTP/2 has no byte that surely starts a request (pings, window updates
//! and settings come and go), so between requests only the idle timeout
//! applies; a stream's headers are bounded by h2's limit on their size.
//!
//! The send timeout is nginx's `send_timeout`: a write that makes no
//! progress for that long (the socket takes no byte: the client reads
//! nothing) fails, and the connection is closed. hyper hands an answer's
//! body back (ending its request) once its last bytes are queued, not
//! written; a write still waiting for the client keeps the connection from
//! counting as idle, and its idle time counts from when it was written.
//!
//! hyper has a header read timeout of its own, but its timer also runs
//! while a keep-alive connection waits for its next request, so the idle
//! time could never be longer than the header time; and it knows nothing
//! of HTTP/2's handshake. Hence these deadlines, kept beside hyper.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

pub use super::state::{Conn, ConnHandle};
use super::{Limits, Protocol};
use crate::metrics::connections::{Closed, ListenerConnections};

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
    /// Since when writes have made no progress, and the send timer.
    stalled: Option<Instant>,
    send_timer: Option<Pin<Box<Sleep>>>,
    closed: Option<Closed>,
    /// Asked to make room, an HTTP/2 connection has had its last turn.
    last_turn: bool,
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
            stalled: None,
            send_timer: None,
            closed: None,
            last_turn: false,
            stats,
            _slot: slot,
        }
    }

    /// What the connection's requests report to.
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// The read deadline that applies now, and what passing it means;
    /// none while a request is in flight or an answer waits for the client.
    fn deadline(&self) -> Option<(Instant, Closed)> {
        if self.conn.in_flight.load(Ordering::Acquire) > 0 || self.conn.blocked.load(Ordering::Acquire) {
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
    /// Bytes that arrive also cancel a request to make room: they may be
    /// a request, which is served rather than dropped. Not while a body is
    /// too slow: its bytes are that body's, whose pace alone decides.
    fn read(&mut self, bytes: &[u8]) {
        if self.conn.stalled.load(Ordering::Acquire) == 0 {
            self.conn.evict.store(false, Ordering::Release);
        }
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
        if self.evicted() {
            // HTTP/2 writes what its streams queued (the status that ends
            // a quiet stream) after its reads, and drops it on a read that
            // ends: it is given one more turn first.
            if self.protocol == Protocol::Http2 && !self.last_turn {
                self.last_turn = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            return Poll::Ready(self.close(Closed::Evicted));
        }
        self.last_turn = false;
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

    /// Whether the connection was asked to make room and may close now:
    /// nothing in flight, no answer waiting for the client. While only
    /// quiet streams are in flight it stays asked (they are ending); a
    /// request begun since cancels the ask.
    fn evicted(&self) -> bool {
        let conn = &self.conn;
        if !conn.evict.load(Ordering::Acquire) {
            return false;
        }
        let in_flight = conn.in_flight.load(Ordering::Acquire);
        if in_flight == 0 && !conn.blocked.load(Ordering::Acquire) {
            return true;
        }
        if in_flight > conn.waiting() {
            conn.evict.store(false, Ordering::Release);
        }
        false
    }

    /// Notes the outcome of a write (or a flush, `flushed`): progress ends
    /// a stall, and a flush after a stall starts the idle time; a write
    /// the socket does not take starts (or continues) a stall, which the
    /// send timeout ends.
    fn wrote<T>(&mut self, cx: &mut Context<'_>, outcome: Poll<io::Result<T>>, flushed: bool) -> Poll<io::Result<T>> {
        match outcome {
            Poll::Ready(Ok(done)) => {
                self.stalled = None;
                if flushed && self.conn.blocked.swap(false, Ordering::AcqRel) {
                    self.conn.idle_from_now();
                    self.conn.reader.wake();
                }
                Poll::Ready(Ok(done))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                self.conn.blocked.store(true, Ordering::Release);
                match self.poll_send_deadline(cx) {
                    Poll::Ready(e) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    /// A stalled write: fails once it has made no progress for the send
    /// timeout.
    fn poll_send_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let Some(timeout) = self.limits.send_timeout else { return Poll::Pending };
        let deadline = *self.stalled.get_or_insert_with(Instant::now) + timeout;
        let timer = self.send_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let _ = self.close(Closed::SendTimeout);
        Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, "the client took no byte of its answer in time"))
    }
}

/// What a read returns once the connection is closed for `why`.
fn end(why: Closed) -> io::Result<()> {
    match why {
        Closed::HeaderTimeout => {
            Err(io::Error::new(io::ErrorKind::TimedOut, "the request head did not arrive in time"))
        }
        Closed::SendTimeout => Err(io::Error::new(io::ErrorKind::TimedOut, "the client took no byte in time")),
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
        // The socket first: a request already waiting in it is read even
        // when the connection was asked to make room.
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
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wrote(cx, outcome, false)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(cx, outcome, false)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.inner).poll_flush(cx);
        this.wrote(cx, outcome, true)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.wrote(cx, outcome, true)
    }
}

impl tonic::transport::server::Connected for Guarded<tokio::net::TcpStream> {
    type ConnectInfo = ConnHandle;

    fn connect_info(&self) -> ConnHandle {
        ConnHandle(Arc::clone(&self.conn))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits() -> Limits {
        Limits {
            header_read_timeout: Some(Duration::from_secs(10)),
            idle_timeout: Some(Duration::from_secs(120)),
            send_timeout: Some(Duration::from_secs(30)),
            max_connections: 1,
        }
    }

    fn guarded(io: tokio::io::DuplexStream, protocol: Protocol) -> Guarded<tokio::io::DuplexStream> {
        let slot = Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().unwrap();
        Guarded::new(io, protocol, limits(), Arc::default(), slot)
    }

    #[tokio::test]
    async fn a_connection_asked_to_make_room_reads_the_request_already_waiting() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(4096);
        let mut guarded = guarded(server, Protocol::Http1);
        // One request answered: the connection waits for its next.
        drop(guarded.conn().begin());
        client.write_all(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        guarded.conn().evict();
        let mut buffer = [0u8; 64];
        assert!(
            AsyncReadExt::read(&mut guarded, &mut buffer).await.unwrap() > 0,
            "a waiting request was dropped by the eviction"
        );
        // It is no longer asked to close: with nothing more to read, the
        // read waits rather than ending.
        let next = tokio::time::timeout(Duration::from_millis(50), AsyncReadExt::read(&mut guarded, &mut buffer)).await;
        assert!(next.is_err(), "the connection was closed after its request was read: {next:?}");
    }

    #[tokio::test]
    async fn a_connection_asked_to_make_room_with_nothing_to_read_ends() {
        use tokio::io::AsyncReadExt;
        let (_client, server) = tokio::io::duplex(4096);
        let mut guarded = guarded(server, Protocol::Http1);
        drop(guarded.conn().begin());
        guarded.conn().evict();
        let mut buffer = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), AsyncReadExt::read(&mut guarded, &mut buffer)).await;
        assert_eq!(read.expect("the read ended").unwrap(), 0, "an evicted idle connection reads the end");
    }

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
