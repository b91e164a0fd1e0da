//! Client connections, bounded: how many each listener holds, how long a
//! client has to send a request's head, and how long a connection may stay
//! open with nothing to do.
//!
//! - **A bound per listener.** A listener accepts a connection only when
//!   it holds a free slot; at its bound it stops accepting, and new
//!   connections wait in the kernel's accept queue (then, once that is
//!   full, their handshakes are retried by the client's kernel). A
//!   connection past the bound costs the server nothing — no descriptor,
//!   no task, no buffer — and is served as soon as a slot frees, rather
//!   than refused at once: slots free quickly when the clients holding
//!   them are slow, because the timeouts below close them. See
//!   [`bounded`].
//! - **Descriptors for the server's own files.** The bound is derived from
//!   the limit on open files: a share of it ([`reserved_files`]) is kept
//!   for the repository (a version being loaded holds every one of its
//!   files open), the state file, worker processes and the store's
//!   connections, and what is left is shared equally between the
//!   listeners. `--max-connections` can only lower a listener's share.
//!   The soft limit itself is raised to the hard one at start.
//! - **Timeouts.** See [`guarded`]: the header read timeout closes a
//!   connection whose request head (or, for gRPC, whose HTTP/2 handshake)
//!   does not arrive in time, the idle timeout one that has had no
//!   request in flight for that long, and the send timeout one whose
//!   client takes no byte of its answer for that long. A request in
//!   flight is never cut by the first two: its body's deadline is
//!   `--body-read-timeout`'s business, its answer's `--request-timeout`'s.
//! - **Requests that never end.** An event stream, or a streaming call
//!   waiting for its next message, is quiet: at the bound, a connection
//!   with nothing else in flight makes room like an idle one (see
//!   [`state`]).

pub mod bounded;
pub mod guarded;
pub mod http1;
pub mod state;
pub mod track;

use std::time::Duration;

pub use bounded::Bounded;

use super::ServeArgs;

/// What a listener allows its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long a client has to send a request's head; `None`: no limit
    /// (the idle timeout then bounds a connection that sends nothing).
    pub header_read_timeout: Option<Duration>,
    /// How long a connection may stay open with no request in flight.
    pub idle_timeout: Option<Duration>,
    /// How long a write may make no progress before the connection is
    /// closed; `None`: no limit.
    pub send_timeout: Option<Duration>,
    /// Connections the listener holds at once.
    pub max_connections: usize,
}

/// The protocol a listener speaks: it decides what "a request's head has
/// begun" means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1: the bytes of a head follow each other on the connection.
    Http1,
    /// HTTP/2 (gRPC): the connection starts with a handshake; later bytes
    /// may be pings or window updates as well as a request's headers.
    Http2,
}

/// The descriptors kept for the server's own files under an open-files
/// limit of `limit`: a quarter, but at least 1,024 (a version of several
/// hundred files loads beside listeners at their bound), and never more
/// than half.
pub fn reserved_files(limit: u64) -> u64 {
    (limit / 4).max(1024).min(limit / 2)
}

/// Each listener's bound on connections: `asked` (`--max-connections`),
/// lowered so that `listeners` listeners at their bound, beside the
/// `open` descriptors the process holds already, leave
/// [`reserved_files`] free under `limit`. At least one.
pub fn share(limit: u64, open: u64, listeners: usize, asked: u64) -> u64 {
    let spare = limit.saturating_sub(reserved_files(limit)).saturating_sub(open);
    (spare / listeners.max(1) as u64).min(asked).max(1)
}

/// What each listener allows its connections: the flags' timeouts, and
/// `--max-connections` lowered so that `listeners` listeners at their
/// bound leave the server's own files their share of the open-files limit.
pub fn limits(args: &ServeArgs, listeners: usize) -> Limits {
    let (files_limit, files_open) = (files_limit(), files_open());
    let max = share(files_limit, files_open, listeners, args.max_connections);
    let limits = Limits {
        header_read_timeout: args.header_read_timeout.0,
        idle_timeout: args.idle_timeout.0,
        send_timeout: args.send_timeout.0,
        max_connections: usize::try_from(max).unwrap_or(usize::MAX),
    };
    let reserved = reserved_files(files_limit);
    let ms = |t: Option<Duration>| t.map_or(0, |t| t.as_millis() as u64);
    let (header_ms, idle_ms) = (ms(limits.header_read_timeout), ms(limits.idle_timeout));
    let send_ms = ms(limits.send_timeout);
    if max < args.max_connections {
        tracing::info!(
            files_limit,
            files_open,
            reserved,
            listeners,
            asked = args.max_connections,
            max_connections = max,
            header_read_timeout_ms = header_ms,
            idle_timeout_ms = idle_ms,
            send_timeout_ms = send_ms,
            "Client connections are bounded, each listener's lower than asked to keep descriptors for the server's own files."
        );
    } else {
        tracing::info!(
            files_limit,
            reserved,
            max_connections = max,
            header_read_timeout_ms = header_ms,
            idle_timeout_ms = idle_ms,
            send_timeout_ms = send_ms,
            "Client connections are bounded."
        );
    }
    limits
}

/// This process's soft limit on open files (`u64::MAX` for none).
pub fn files_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The descriptors this process holds now (0 where `/proc` is absent).
pub fn files_open() -> u64 {
    std::fs::read_dir("/proc/self/fd").map(|dir| dir.count() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_of_the_files_is_kept_for_the_server_itself_but_at_least_1024_or_half() {
        assert_eq!(reserved_files(1024), 512, "half, under the common hard limit");
        assert_eq!(reserved_files(2048), 1024);
        assert_eq!(reserved_files(4096), 1024);
        assert_eq!(reserved_files(65_536), 16_384, "a quarter");
        assert_eq!(reserved_files(600), 300, "never more than half");
        assert_eq!(reserved_files(u64::MAX), u64::MAX / 4);
    }

    #[test]
    fn listeners_share_what_is_left_and_the_flag_only_lowers_it() {
        // 1,024 files, 30 open, two listeners: (1024 - 512 - 30) / 2.
        assert_eq!(share(1024, 30, 2, 10_000), 241);
        assert_eq!(share(1024, 30, 4, 10_000), 120);
        assert_eq!(share(1024, 30, 2, 100), 100);
        assert_eq!(share(1_048_576, 30, 2, 10_000), 10_000);
        assert_eq!(share(u64::MAX, 30, 2, 10_000), 10_000);
        assert_eq!(share(64, 60, 2, 10_000), 1, "never zero");
    }
}
