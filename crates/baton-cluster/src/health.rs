//! What a process knows of its own part in the fleet, for status and
//! metrics: connected or not, and the timings of the last phases.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use baton_core::threads::sync::Lock;
use serde::Serialize;

use crate::records::{SwitchSummary, now_ms};

/// Shared by the participant (and the coordinator it may run) and the
/// server's status and metrics.
#[derive(Debug, Default)]
pub struct Health {
    connected: AtomicBool,
    state: Lock<State>,
    leases: Lock<Leases>,
    acting: Acting,
    /// What this process's coordinators measured, kept while they hold
    /// their keys (see [`crate::coordinator::Clocks`]).
    pub(crate) clocks: crate::coordinator::Clocks,
}

/// Whether this process acts for its replica: registers it, acks its
/// prepares and coordinates rollouts. A new process of an upgrade does
/// not until it serves and owns the lease; the old one stops once it has
/// handed over. Until then it only reads the fleet's records and loads
/// what they say.
#[derive(Debug)]
struct Acting(tokio::sync::watch::Sender<bool>);

impl Default for Acting {
    fn default() -> Self {
        Acting(tokio::sync::watch::channel(true).0)
    }
}

/// The lease this process acts under, and one it shares with another
/// process of the same replica.
#[derive(Debug, Default)]
struct Leases {
    current: Option<i64>,
    shared: Option<i64>,
}

/// A copy of [`Health`] for status.
#[derive(Clone, Debug, Default, Serialize)]
pub struct State {
    /// Whether the replica holds a live lease and watches the store.
    pub connected: bool,
    /// Since when it has not, in milliseconds since the epoch.
    pub disconnected_since_ms: Option<u64>,
    /// Why it lost the store last.
    pub last_error: Option<String>,
    /// Per model, how long the last prepare took, in seconds.
    pub prepare_seconds: BTreeMap<String, f64>,
    /// Per model, from the last commit write to this replica's switch, in
    /// seconds.
    pub commit_delay_seconds: BTreeMap<String, f64>,
    /// Per model, the last fleet switch this process coordinated.
    pub fleet_switch: BTreeMap<String, SwitchSummary>,
    /// Rollouts this process aborted or rolled back, by reason.
    pub aborted: BTreeMap<String, u64>,
    /// Live replicas it saw last.
    pub replicas: usize,
    /// Per model, why this replica does not serve what the fleet
    /// committed (a switch or a load that failed and is retried, a load
    /// under way); empty when it does.
    pub problems: BTreeMap<String, String>,
    /// Times this process found its lease gone: it expired while the
    /// process could not renew it, and it registered again.
    pub leases_lost: u64,
    /// The etcd member the replica's session speaks to, once joined.
    pub endpoint: Option<String>,
    /// Sessions this process began: it joined the fleet (read every record
    /// and watched from there) this many times. More than one means the
    /// store was lost and found again.
    pub sessions: u64,
    /// Per model, what a prepare waits for before it can begin (another
    /// operation of the model on this server, such as the drain after the
    /// last switch); empty when none waits.
    pub waiting: BTreeMap<String, String>,
}

impl Health {
    /// Whether the store is reachable and the lease live.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    /// A copy for status and metrics.
    pub fn state(&self) -> State {
        let mut state = self.state.lock().clone();
        state.connected = self.connected();
        state
    }

    /// Marks the store reached, through `endpoint`.
    pub fn connect(&self, endpoint: &str) {
        let mut state = self.state.lock();
        state.disconnected_since_ms = None;
        state.endpoint = Some(endpoint.to_owned());
        state.sessions += 1;
        self.connected.store(true, Ordering::SeqCst);
    }

    /// Marks the store lost, with why.
    pub fn disconnect(&self, why: String) {
        let was = self.connected.swap(false, Ordering::SeqCst);
        let mut state = self.state.lock();
        if was || state.disconnected_since_ms.is_none() {
            state.disconnected_since_ms = Some(now_ms());
        }
        state.last_error = Some(why);
    }

    /// Records a prepare's duration.
    pub fn prepared(&self, model: &str, seconds: f64) {
        self.state.lock().prepare_seconds.insert(model.to_owned(), seconds);
    }

    /// Records this replica's delay from the commit write to its switch.
    pub fn switched(&self, model: &str, seconds: f64) {
        self.state.lock().commit_delay_seconds.insert(model.to_owned(), seconds);
    }

    /// Records a fleet switch this process coordinated.
    pub fn switched_fleet(&self, model: &str, summary: &SwitchSummary) {
        self.state.lock().fleet_switch.insert(model.to_owned(), summary.clone());
    }

    /// Counts a rollout this process ended without promoting.
    pub fn aborted(&self, reason: &str) {
        *self.state.lock().aborted.entry(reason.to_owned()).or_default() += 1;
    }

    /// Records why `model` is not served as the fleet committed, or that
    /// it is (`None`).
    pub fn problem(&self, model: &str, why: Option<String>) {
        let mut state = self.state.lock();
        match why {
            Some(why) => state.problems.insert(model.to_owned(), why),
            None => state.problems.remove(model),
        };
    }

    /// Records what a prepare of `model` waits for, or that it waits for
    /// nothing (`None`).
    pub fn waiting(&self, model: &str, what: Option<String>) {
        let mut state = self.state.lock();
        match what {
            Some(what) => state.waiting.insert(model.to_owned(), what),
            None => state.waiting.remove(model),
        };
    }

    /// Counts a lease found gone.
    pub fn lease_lost(&self) {
        self.state.lock().leases_lost += 1;
    }

    /// The lease this process acts under now, when it holds one.
    pub fn lease(&self) -> Option<i64> {
        self.leases.lock().current
    }

    /// Starts this process under `lease`, a live lease of the process it
    /// replaces: the registration, acks and coordinator keys under it stay
    /// where they are, so the fleet sees the replica go on. Until
    /// [`Health::own_lease`], the lease is shared (this process leaves it
    /// alone when it stops: a replacement that fails to start must not
    /// take its predecessor's lease with it), and this process does not
    /// act for the replica: it reads the fleet's records and loads, but
    /// neither registers, acks nor coordinates.
    /// `None`: the process it replaces held no live lease (it had lost the
    /// store); this one grants its own, and still does not act until
    /// [`Health::own_lease`].
    pub fn inherit_lease(&self, lease: Option<i64>) {
        *self.leases.lock() = Leases { current: lease, shared: lease };
        self.acting.0.send_replace(false);
    }

    /// The lease is this process's alone from now on (the process it
    /// replaced has been told this one serves), and it acts for the
    /// replica: it takes over the coordinator keys under the lease, so
    /// that the old process's late writes are refused.
    pub fn own_lease(&self) {
        self.leases.lock().shared = None;
        self.acting.0.send_replace(true);
    }

    /// This process has handed the replica over to a new process that
    /// acts under `lease` (the one this process handed on, if any) from now
    /// on: this one leaves that lease alone when it stops, and no longer
    /// acts for the replica.
    pub fn hand_over_lease(&self, lease: Option<i64>) {
        self.leases.lock().shared = lease;
        self.acting.0.send_replace(false);
    }

    /// Whether this process acts for the replica (see [`Health::own_lease`]).
    pub fn acting(&self) -> bool {
        *self.acting.0.borrow()
    }

    /// Waits until this process acts for the replica.
    pub(crate) async fn until_acting(&self) {
        let mut acting = self.acting.0.subscribe();
        // The sender lives as long as `self`: this fails never.
        let _ = acting.wait_for(|acting| *acting).await;
    }

    /// Records the lease this process acts under.
    pub(crate) fn set_lease(&self, lease: Option<i64>) {
        self.leases.lock().current = lease;
    }

    /// Whether another process shares `lease`.
    pub(crate) fn shares(&self, lease: i64) -> bool {
        self.leases.lock().shared == Some(lease)
    }

    /// Records how many replicas are live.
    pub fn replicas(&self, count: usize) {
        self.state.lock().replicas = count;
    }
}
