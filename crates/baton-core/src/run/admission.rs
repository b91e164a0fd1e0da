//! Admission control of one version: how many requests it holds before it
//! refuses more.
//!
//! A version's requests wait in a queue of its own for one of its session
//! threads (see [`crate::run::executor`]). Two bounds, from the `[admission]`
//! table of `model.toml`, decide whether one more is taken:
//!
//! - `max_queue`: requests waiting for a session thread. Requests that an
//!   idle thread is about to take do not count, so with `max_queue = 0` a
//!   request is admitted exactly when a thread is free for it.
//! - `max_in_flight`: requests admitted and not yet answered, waiting or
//!   running (with dynamic batching a running batch holds many).
//!
//! A request beyond either is refused at once, never made to wait: a
//! client (or its load balancer) can try another server now, whereas a
//! request queued behind a long queue only grows the latency of every other
//! one. The state belongs to the version, so a new version starts with an
//! empty queue of its own, and requests pinned to the old one finish there.

use crate::files::spec::AdmissionPolicy;

/// Queue slots per engine instance when `max_queue` is not set. Enough for
/// a client holding 32 connections per instance open at once (baton's load
/// drills use 32 in all), and at 1 ms per inference a full queue is a wait
/// of about 32 ms.
pub const QUEUE_PER_INSTANCE: usize = 32;

/// The longest a request may be estimated to run, in microseconds, to run
/// inline on the async worker that submits it when an instance is free and
/// nobody waits (`[admission] inline_us`). Such a request holds its worker
/// for about that long, as long as a request's whole answer takes on a
/// small model; what running inline saves, and the measurement that decided
/// it, are in docs/serving.md ("Running cheap requests inline").
pub const INLINE_US: u64 = 1000;

/// The bounds of one version, resolved from its policy and its engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Requests admitted and not yet answered.
    pub max_in_flight: usize,
    /// Requests waiting beyond those an idle thread is about to take.
    pub max_queue: usize,
}

impl Limits {
    /// The bounds `policy` asks for, defaults filled in for a version with
    /// `instances` session threads, each running up to `per_run` requests at
    /// once (1, or `max_batch` with dynamic batching).
    pub fn resolve(policy: &AdmissionPolicy, instances: usize, per_run: usize) -> Limits {
        let instances = instances.max(1);
        let max_queue = policy.max_queue.unwrap_or(QUEUE_PER_INSTANCE * instances);
        let running = instances.saturating_mul(per_run.max(1));
        let max_in_flight = policy.max_in_flight.unwrap_or(max_queue.saturating_add(running)).max(1);
        Limits { max_in_flight, max_queue }
    }

    /// Whether one more request may be admitted to a version holding
    /// `queued` waiting and `running` running requests, while `idle` of its
    /// threads wait for work.
    pub fn admit(&self, queued: usize, running: usize, idle: usize) -> Result<(), Shed> {
        if queued >= self.max_queue.saturating_add(idle) {
            return Err(Shed::QueueFull);
        }
        if queued.saturating_add(running) >= self.max_in_flight {
            return Err(Shed::InFlight);
        }
        Ok(())
    }
}

/// Why a request was refused without being queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shed {
    /// The version's queue is full.
    QueueFull,
    /// The version holds `max_in_flight` requests.
    InFlight,
}

impl Shed {
    /// Stable reason string, for metric labels.
    pub fn reason(self) -> &'static str {
        match self {
            Shed::QueueFull => "queue_full",
            Shed::InFlight => "version_in_flight",
        }
    }
}

/// What a version holds right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Requests waiting for a session thread.
    pub queued: usize,
    /// Requests being run.
    pub running: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_in_flight: Option<usize>, max_queue: Option<usize>) -> AdmissionPolicy {
        AdmissionPolicy { max_in_flight, max_queue, inline_us: None }
    }

    #[test]
    fn defaults_follow_the_instances_and_the_batch() {
        assert_eq!(Limits::resolve(&policy(None, None), 2, 1), Limits { max_queue: 64, max_in_flight: 66 });
        assert_eq!(Limits::resolve(&policy(None, None), 2, 16), Limits { max_queue: 64, max_in_flight: 96 });
        assert_eq!(Limits::resolve(&policy(None, Some(0)), 3, 1), Limits { max_queue: 0, max_in_flight: 3 });
        assert_eq!(Limits::resolve(&policy(Some(5), None), 1, 1), Limits { max_queue: 32, max_in_flight: 5 });
    }

    #[test]
    fn idle_threads_take_requests_beyond_the_queue() {
        let limits = Limits { max_queue: 0, max_in_flight: 10 };
        assert_eq!(limits.admit(0, 0, 1), Ok(()), "an idle thread takes it");
        assert_eq!(limits.admit(1, 0, 1), Err(Shed::QueueFull), "the idle thread is taken already");
        assert_eq!(limits.admit(0, 1, 0), Err(Shed::QueueFull));
        let limits = Limits { max_queue: 2, max_in_flight: 3 };
        assert_eq!(limits.admit(1, 1, 0), Ok(()));
        assert_eq!(limits.admit(2, 1, 0), Err(Shed::QueueFull), "the queue is named when both bounds are reached");
        let limits = Limits { max_queue: 8, max_in_flight: 3 };
        assert_eq!(limits.admit(2, 1, 0), Err(Shed::InFlight));
        assert_eq!(Shed::InFlight.reason(), "version_in_flight");
    }
}
