//! What every front end shares: the registry, the metrics, the server's
//! readiness, and the server-wide bounds on requests.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use baton_core::registry::Registry;

use crate::budget::Budget;
use crate::decisions::Decisions;
use crate::error::ServeError;
use crate::metrics::{InFlight, Metrics};
use crate::readiness::{Findings, Readiness};

/// The server-wide bounds on requests (`baton serve` flags; defaults and
/// why in docs/api.md).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServerLimits {
    /// Largest request body accepted, in bytes.
    pub max_request_bytes: usize,
    /// Inference requests the server holds at once, from arrival to answer.
    pub max_in_flight: usize,
    /// Bytes that request bodies, decoded tensors and outputs may hold at once.
    pub memory_budget: u64,
    /// The deadline of a request whose client sets none; `None` for none.
    pub request_timeout: Option<Duration>,
    /// How long a request's body may take to arrive; `None` for no limit.
    pub body_read_timeout: Option<Duration>,
    /// The largest value one posted outcome may carry: 1 (a click, a
    /// conversion) while posting is open to every inference client, the
    /// outcome's own bound once an outcomes token keeps it to the
    /// services given that token.
    pub outcome_value_max: f64,
}

/// The largest value an outcome posted without the outcomes token may
/// carry: one click or conversion per answer. A client that may post only
/// for its own answers, once each, then moves a side's rate by at most
/// what clicking every answer it got would.
pub const OPEN_OUTCOME_VALUE_MAX: f64 = 1.0;

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_request_bytes: 64 << 20,
            max_in_flight: 1024,
            memory_budget: 512 << 20,
            request_timeout: Some(Duration::from_secs(30)),
            body_read_timeout: Some(Duration::from_secs(30)),
            outcome_value_max: OPEN_OUTCOME_VALUE_MAX,
        }
    }
}

/// Shared server state.
pub struct App {
    /// The model registry.
    pub registry: Registry,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Largest request body accepted, in bytes.
    pub max_request_bytes: usize,
    /// The server-wide bounds on requests.
    pub limits: ServerLimits,
    /// The budget of request bytes in flight.
    pub budget: Arc<Budget>,
    /// Operators' decisions about what models serve, kept across restarts.
    pub decisions: Arc<Decisions>,
    draining: AtomicBool,
    /// Whether the repository has been listed once, so `required` is known.
    listed: AtomicBool,
    required: RwLock<BTreeSet<String>>,
    /// Only ready once every required model serves (`--readiness all`).
    strict: AtomicBool,
    /// What the repository watcher could not serve.
    findings: RwLock<Findings>,
    /// Held not ready by the fleet: converging on its committed version.
    held: AtomicBool,
    /// Why the server is not ready although nothing else holds it: its
    /// repository lists no model at all (a mistyped `--repo`, a bare
    /// `model.onnx` where a repository was expected).
    unservable: RwLock<Option<String>>,
    /// The replica's part in a fleet, in cluster mode.
    pub cluster: std::sync::OnceLock<Arc<baton_cluster::Health>>,
    /// The fleet's records as this replica reads them, in cluster mode.
    pub fleet: std::sync::OnceLock<Arc<crate::fleet_view::FleetView>>,
    /// This replica's ID in a fleet, resolved once: an upgrade hands it on.
    pub replica_id: std::sync::OnceLock<String>,
    /// The access policy's switch that holds model operations while an
    /// upgrade runs.
    pub operations_held: std::sync::OnceLock<Arc<AtomicBool>>,
    shutdown: tokio::sync::watch::Sender<bool>,
    /// What this server hands over to a new binary, once it listens.
    pub upgrade: std::sync::OnceLock<Arc<crate::upgrade::Source>>,
    upgrading: AtomicBool,
    /// A new process of an upgrade that the old one has not handed the
    /// service to (yet): it must not speak for the service to systemd.
    awaiting_handover: AtomicBool,
    /// How this process's service ends, decided once (see
    /// [`App::claim_stop`] and [`App::claim_handover`]).
    ending: std::sync::atomic::AtomicU8,
    /// Woken when an upgrade has handed the service over.
    handed_over: tokio::sync::Notify,
}

/// [`App::ending`]: neither a stop nor a handover yet.
const SERVING: u8 = 0;
/// [`App::ending`]: a signal began the shutdown.
const STOPPING: u8 = 1;
/// [`App::ending`]: an upgrade committed; the new process serves on.
const HANDED_OVER: u8 = 2;

impl App {
    /// Shared state around a registry and the decisions in force.
    pub fn new(registry: Registry, limits: ServerLimits, decisions: Decisions) -> App {
        App {
            metrics: Metrics::for_registry(registry.clone()),
            registry,
            decisions: Arc::new(decisions),
            max_request_bytes: limits.max_request_bytes,
            limits,
            budget: Budget::new(limits.memory_budget),
            draining: AtomicBool::new(false),
            listed: AtomicBool::new(false),
            required: RwLock::new(BTreeSet::new()),
            strict: AtomicBool::new(false),
            findings: RwLock::new(Findings::default()),
            held: AtomicBool::new(false),
            unservable: RwLock::new(None),
            cluster: std::sync::OnceLock::new(),
            fleet: std::sync::OnceLock::new(),
            upgrade: std::sync::OnceLock::new(),
            replica_id: std::sync::OnceLock::new(),
            operations_held: std::sync::OnceLock::new(),
            upgrading: AtomicBool::new(false),
            awaiting_handover: AtomicBool::new(false),
            ending: std::sync::atomic::AtomicU8::new(SERVING),
            handed_over: tokio::sync::Notify::new(),
            shutdown: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Ready means: not shutting down, the repository has been listed, and
    /// every required model serves — or, unless `--readiness all`, was
    /// given up on (every version refused, or none complete) while the
    /// server serves at least one model. This is the contract a load
    /// balancer acts on: before the first listing the required models are
    /// not known yet, and an empty list must not read as "all of them
    /// serve"; one new model that cannot load must not take a server that
    /// serves the others out of service (docs/api.md). A repository that
    /// lists no model at all (outside explicit mode) leaves a server that
    /// serves nothing not ready: it would otherwise pass every probe.
    pub fn ready(&self) -> bool {
        if self.draining() || !self.listed.load(Ordering::SeqCst) || self.held.load(Ordering::SeqCst) {
            return false;
        }
        let snapshot = self.registry.snapshot();
        // A repository that lists no model: not ready unless something
        // still serves (a listing that left out a model.toml it could not
        // read for a moment must not take a serving replica out).
        let serves_any = || snapshot.models().keys().any(|m| snapshot.serves(m));
        if self.unservable.read().unwrap_or_else(|e| e.into_inner()).is_some() && !serves_any() {
            return false;
        }
        let strict = self.strict.load(Ordering::SeqCst);
        self.forget_served();
        let findings = self.findings.read().unwrap_or_else(|e| e.into_inner());
        let mut excused = false;
        for model in self.required.read().unwrap_or_else(|e| e.into_inner()).iter() {
            if snapshot.serves(model) {
                continue;
            }
            if strict || !findings.cannot_serve.contains_key(model) {
                return false;
            }
            excused = true;
        }
        !excused || serves_any()
    }

    /// Sets how readiness treats models that cannot serve.
    pub fn set_readiness(&self, readiness: Readiness) {
        self.strict.store(readiness == Readiness::All, Ordering::SeqCst);
    }

    /// Reads what the repository watcher found.
    pub fn findings<T>(&self, read: impl FnOnce(&Findings) -> T) -> T {
        self.forget_served();
        read(&self.findings.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Drops the models given up on that serve now: an operator's load
    /// succeeded (a server that does not poll never scans again to notice).
    fn forget_served(&self) {
        let snapshot = self.registry.snapshot();
        let stale = |f: &Findings| f.cannot_serve.keys().any(|m| snapshot.holds(m));
        if stale(&self.findings.read().unwrap_or_else(|e| e.into_inner())) {
            self.find(|f| f.cannot_serve.retain(|m, _| !snapshot.holds(m)));
        }
    }

    /// Changes what the repository watcher found.
    pub(crate) fn find<T>(&self, change: impl FnOnce(&mut Findings) -> T) -> T {
        change(&mut self.findings.write().unwrap_or_else(|e| e.into_inner()))
    }

    /// Counts an inference request in flight until the guard drops, or
    /// refuses it at once (overloaded) when the server holds
    /// `--max-in-flight` already.
    pub fn admit(&self, model: &str) -> Result<InFlight<'_>, ServeError> {
        self.metrics.try_in_flight(self.limits.max_in_flight).ok_or_else(|| {
            self.metrics.shed(model, "server_in_flight");
            ServeError::overloaded(format!(
                "the server holds {} inference requests, as many as --max-in-flight allows; retry later or elsewhere",
                self.limits.max_in_flight
            ))
        })
    }

    /// Whether shutdown has begun.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Begins shutdown: from now on the server reports not ready, and
    /// long-lived streams are told to end.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.shutdown.send_replace(true);
    }

    /// Reports not ready (and draining) from now on without ending anything:
    /// during `--shutdown-delay` the server keeps serving and accepting
    /// while load balancers notice. [`App::start_draining`] follows.
    pub fn report_not_ready(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether this process is the new one of an upgrade that the old one
    /// has not handed the service to: a stop then is its own, not the
    /// service's (the old process serves on).
    pub fn awaiting_handover(&self) -> bool {
        self.awaiting_handover.load(Ordering::SeqCst)
    }

    /// Marks this process as the new one of an upgrade (`true`), or as
    /// handed the service (`false`).
    pub(crate) fn set_awaiting_handover(&self, awaiting: bool) {
        self.awaiting_handover.store(awaiting, Ordering::SeqCst);
    }

    /// A signal asks this process to stop: true when the stop wins (an
    /// upgrade running then fails at its commit), false when an upgrade
    /// committed first (the service goes on in the new process).
    pub(crate) fn claim_stop(&self) -> bool {
        match self.ending.compare_exchange(SERVING, STOPPING, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => true,
            Err(now) => now == STOPPING,
        }
    }

    /// An upgrade's commit: true when it may hand the service over, false
    /// when a signal began the shutdown first (the upgrade then fails).
    pub(crate) fn claim_handover(&self) -> bool {
        self.ending.compare_exchange(SERVING, HANDED_OVER, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// The service is handed over: this process shuts down as on a
    /// signal (but counts no signal).
    pub(crate) fn hand_over(&self) {
        self.handed_over.notify_one();
    }

    /// Resolves once [`App::hand_over`] was called.
    pub(crate) async fn wait_handed_over(&self) {
        self.handed_over.notified().await;
    }

    /// Marks an upgrade begun; false when one runs already.
    pub(crate) fn begin_upgrade(&self) -> bool {
        !self.upgrading.swap(true, Ordering::SeqCst)
    }

    /// Marks the upgrade that ran ended without a handover.
    pub(crate) fn end_upgrade(&self) {
        self.upgrading.store(false, Ordering::SeqCst);
    }

    /// The access policy's switch that holds model operations; a detached
    /// one when the policy gave none (a server inside a test).
    pub(crate) fn operations_held(&self) -> Arc<AtomicBool> {
        self.operations_held.get_or_init(Arc::default).clone()
    }

    /// Changes to `true` when shutdown begins.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Sets the models readiness waits for.
    pub fn set_required(&self, models: BTreeSet<String>) {
        *self.required.write().unwrap_or_else(|e| e.into_inner()) = models;
        self.listed.store(true, Ordering::SeqCst);
    }

    /// Not ready until [`App::release`]: the fleet is converging.
    pub fn hold(&self) {
        self.held.store(true, Ordering::SeqCst);
    }

    /// Ready again once `models` serve: the fleet converged.
    pub fn release(&self, models: BTreeSet<String>) {
        self.set_required(models);
        self.held.store(false, Ordering::SeqCst);
    }

    /// Holds the server not ready for `reason` (`None`: releases it): the
    /// repository lists no model, so the server would serve nothing.
    pub fn set_unservable(&self, reason: Option<String>) {
        *self.unservable.write().unwrap_or_else(|e| e.into_inner()) = reason;
    }

    /// Why the server cannot be ready whatever loads, if it cannot.
    pub fn unservable(&self) -> Option<String> {
        self.unservable.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The models readiness waits for.
    pub fn required(&self) -> BTreeSet<String> {
        self.required.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
