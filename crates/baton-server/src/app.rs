//! What every front end shares: the registry, the metrics, and the server's
//! readiness.

use std::collections::BTreeSet;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use baton_core::registry::Registry;

use crate::metrics::Metrics;

/// Shared server state.
pub struct App {
    /// The model registry.
    pub registry: Registry,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Largest request body accepted, in bytes.
    pub max_request_bytes: usize,
    draining: AtomicBool,
    /// Whether the repository has been listed once, so `required` is known.
    listed: AtomicBool,
    required: RwLock<BTreeSet<String>>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl App {
    /// Shared state around a registry.
    pub fn new(registry: Registry, max_request_bytes: usize) -> App {
        App {
            registry,
            metrics: Metrics::default(),
            max_request_bytes,
            draining: AtomicBool::new(false),
            listed: AtomicBool::new(false),
            required: RwLock::new(BTreeSet::new()),
            shutdown: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Ready means: not shutting down, the repository has been listed, and
    /// every required model serves. This is the contract a load balancer
    /// acts on: before the first listing the required models are not known
    /// yet, and an empty list must not read as "all of them serve".
    pub fn ready(&self) -> bool {
        if self.draining() || !self.listed.load(Ordering::SeqCst) {
            return false;
        }
        let snapshot = self.registry.snapshot();
        self.required.read().unwrap_or_else(|e| e.into_inner()).iter().all(|m| snapshot.model(m).is_some())
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

    /// Changes to `true` when shutdown begins.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Sets the models readiness waits for.
    pub fn set_required(&self, models: BTreeSet<String>) {
        *self.required.write().unwrap_or_else(|e| e.into_inner()) = models;
        self.listed.store(true, Ordering::SeqCst);
    }

    /// The models readiness waits for.
    pub fn required(&self) -> BTreeSet<String> {
        self.required.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
