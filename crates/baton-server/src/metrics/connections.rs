//! Connection metrics, per listener: how many are open and may be, how
//! many were accepted, how often a listener reached its bound, and how
//! many the server closed, and why.

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::help;
use crate::serve::listeners::NAMES;

/// Why the server closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// A request's head (or an HTTP/2 handshake) did not arrive in time.
    HeaderTimeout,
    /// No request was in flight for the idle timeout.
    IdleTimeout,
    /// Closed while waiting for a request (or with only quiet streams in
    /// flight), to make room for a new connection at the listener's bound.
    Evicted,
    /// The client took no byte of its answer for the send timeout.
    SendTimeout,
}

impl Closed {
    /// The stable name used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Closed::HeaderTimeout => "header_timeout",
            Closed::IdleTimeout => "idle_timeout",
            Closed::Evicted => "evicted",
            Closed::SendTimeout => "send_timeout",
        }
    }
}

/// One listener's connection counters.
#[derive(Debug, Default)]
pub struct ListenerConnections {
    open: AtomicU64,
    max: AtomicU64,
    accepted: AtomicU64,
    at_bound: AtomicU64,
    closed_header: AtomicU64,
    closed_idle: AtomicU64,
    closed_evicted: AtomicU64,
    closed_send: AtomicU64,
}

impl ListenerConnections {
    /// Sets the listener's bound (a listener with none is not shown).
    pub fn set_max(&self, max: u64) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// Counts a connection accepted.
    pub fn opened(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection gone.
    pub fn gone(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts a time the listener reached its bound and stopped accepting.
    pub fn reached_bound(&self) {
        self.at_bound.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection the server closed.
    pub fn closed(&self, why: Closed) {
        let counter = match why {
            Closed::HeaderTimeout => &self.closed_header,
            Closed::IdleTimeout => &self.closed_idle,
            Closed::Evicted => &self.closed_evicted,
            Closed::SendTimeout => &self.closed_send,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A metric family: name, help text, type, and the counter it reads.
type Family = (&'static str, &'static str, &'static str, fn(&ListenerConnections) -> &AtomicU64);

/// Every listener's counters, by the listener's name, and the requests
/// whose body did not arrive in time.
#[derive(Debug, Default)]
pub struct Connections {
    listeners: [Arc<ListenerConnections>; NAMES.len()],
    body_timeouts_rest: AtomicU64,
    body_timeouts_grpc: AtomicU64,
    body_stalled_rest: AtomicU64,
}

impl Connections {
    /// The counters of the listener named `name` (`http`, `grpc`,
    /// `admin-http` or `admin-grpc`).
    pub fn listener(&self, name: &str) -> Arc<ListenerConnections> {
        let at = NAMES.iter().position(|n| *n == name).unwrap_or(0);
        Arc::clone(&self.listeners[at])
    }

    /// Counts a REST request whose body did not arrive within the body
    /// read timeout.
    pub fn body_timed_out(&self) {
        self.body_timeouts_rest.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a REST request refused because its body arrived too slowly
    /// while its listener was full, to make room.
    pub fn body_stalled(&self) {
        self.body_stalled_rest.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a gRPC call whose message did not arrive within the body
    /// read timeout.
    pub fn grpc_body_timed_out(&self) {
        self.body_timeouts_grpc.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes the connection metrics of the listeners that serve.
    pub fn render(&self, out: &mut String) {
        let serving: Vec<(&str, &ListenerConnections)> = NAMES
            .iter()
            .zip(&self.listeners)
            .filter(|(_, l)| l.max.load(Ordering::Relaxed) > 0)
            .map(|(n, l)| (*n, l.as_ref()))
            .collect();
        let families: [Family; 4] = [
            ("baton_connections", "Client connections open now, by listener.", "gauge", |l| &l.open),
            ("baton_connections_max", "Client connections a listener holds at most.", "gauge", |l| &l.max),
            ("baton_connections_accepted_total", "Client connections accepted, by listener.", "counter", |l| {
                &l.accepted
            }),
            (
                "baton_connections_at_bound_total",
                "Times a listener reached its bound and stopped accepting until a connection closed.",
                "counter",
                |l| &l.at_bound,
            ),
        ];
        for (name, text, kind, value) in families {
            help(out, name, kind, text);
            for (listener, l) in &serving {
                let _ = writeln!(out, "{name}{{listener=\"{listener}\"}} {}", value(l).load(Ordering::Relaxed));
            }
        }
        let name = "baton_connections_closed_total";
        help(out, name, "counter", "Client connections the server closed, by listener and reason.");
        for (listener, l) in &serving {
            let reasons = [
                (Closed::HeaderTimeout, &l.closed_header),
                (Closed::IdleTimeout, &l.closed_idle),
                (Closed::Evicted, &l.closed_evicted),
                (Closed::SendTimeout, &l.closed_send),
            ];
            for (why, value) in reasons {
                let (reason, n) = (why.as_str(), value.load(Ordering::Relaxed));
                let _ = writeln!(out, "{name}{{listener=\"{listener}\",reason=\"{reason}\"}} {n}");
            }
        }
        let name = "baton_body_stalled_total";
        help(
            out,
            name,
            "counter",
            "Requests refused because their body arrived too slowly while their listener was full.",
        );
        let _ = writeln!(out, "{name}{{protocol=\"rest\"}} {}", self.body_stalled_rest.load(Ordering::Relaxed));
        let name = "baton_body_timeouts_total";
        help(out, name, "counter", "Requests refused because their body did not arrive within the body read timeout.");
        for (protocol, value) in [("rest", &self.body_timeouts_rest), ("grpc", &self.body_timeouts_grpc)] {
            let _ = writeln!(out, "{name}{{protocol=\"{protocol}\"}} {}", value.load(Ordering::Relaxed));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listeners_that_serve_are_shown() {
        let connections = Connections::default();
        let grpc = connections.listener("grpc");
        grpc.set_max(3);
        grpc.opened();
        grpc.closed(Closed::IdleTimeout);
        let mut out = String::new();
        connections.render(&mut out);
        assert!(out.contains("baton_connections{listener=\"grpc\"} 1\n"), "{out}");
        assert!(out.contains("baton_connections_max{listener=\"grpc\"} 3\n"), "{out}");
        assert!(out.contains("baton_connections_closed_total{listener=\"grpc\",reason=\"idle_timeout\"} 1\n"));
        assert!(!out.contains("listener=\"http\""), "{out}");
    }
}
