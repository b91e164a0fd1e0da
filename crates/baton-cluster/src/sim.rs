//! Simulated replicas: participants that speak the whole protocol with
//! no model behind them, so that a benchmark can measure the fleet's
//! protocol at hundreds or thousands of replicas on one machine.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use baton_core::rollout::window::Sums;
use baton_core::threads::sync::Lock;

use crate::etcd::StoreConfig;
use crate::health::Health;
use crate::node::{Node, Refusal};
use crate::participant::{Participant, ReplicaConfig};
use crate::records::Serving;

/// A replica that serves nothing: preparing takes a fixed time, switching
/// is a write to a map.
pub struct SimNode {
    models: Vec<String>,
    prepare: Duration,
    serving: Lock<BTreeMap<String, Serving>>,
}

impl SimNode {
    /// A node offering version 1 of each of `models`, taking `prepare` to
    /// prepare a candidate.
    pub fn new(models: Vec<String>, prepare: Duration) -> SimNode {
        SimNode { models, prepare, serving: Lock::default() }
    }

    fn change(&self, model: &str, change: impl FnOnce(&mut Serving)) {
        change(self.serving.lock().entry(model.to_owned()).or_default());
    }
}

impl Node for SimNode {
    async fn available(&self) -> Result<BTreeMap<String, Option<u64>>, Refusal> {
        Ok(self.models.iter().map(|m| (m.clone(), Some(1))).collect())
    }

    fn serving(&self, model: &str) -> Serving {
        self.serving.lock().get(model).cloned().unwrap_or_default()
    }

    async fn prepare(&self, model: &str, version: u64) -> Result<(), Refusal> {
        tokio::time::sleep(self.prepare).await;
        self.change(model, |s| s.candidate = Some(version));
        Ok(())
    }

    async fn share_all(&self, model: &str) -> Result<(), Refusal> {
        self.change(model, |s| s.candidate_percent = 100.0);
        Ok(())
    }

    async fn promote(&self, model: &str) -> Result<(), Refusal> {
        self.change(model, |s| {
            s.stable = s.candidate.take().or(s.stable);
            s.candidate_percent = 0.0;
        });
        Ok(())
    }

    async fn drop_candidate(&self, model: &str, _rolled_back: bool) -> Result<(), Refusal> {
        self.change(model, |s| {
            s.candidate = None;
            s.candidate_percent = 0.0;
        });
        Ok(())
    }

    async fn converge(&self, model: &str, version: u64) -> Result<(), Refusal> {
        self.change(model, |s| *s = Serving { stable: Some(version), ..Serving::default() });
        Ok(())
    }

    fn take_sums(&self, _model: &str) -> Option<Sums> {
        None
    }

    fn set_ready(&self, _ready: Option<BTreeSet<String>>) {}
}

/// Runs `count` simulated replicas named `<prefix>-<n>`, each with its own
/// connection and lease, until `stop` turns true.
pub async fn simulate(
    store: &StoreConfig,
    name: &str,
    prefix: &str,
    count: usize,
    models: Vec<String>,
    prepare: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tasks = Vec::with_capacity(count);
    for n in 0..count {
        let config = ReplicaConfig {
            store: store.clone(),
            name: name.to_owned(),
            id: format!("{prefix}-{n}"),
            address: String::new(),
            labels: BTreeMap::new(),
            lease_ttl: 5,
            coordinate: false,
            agent: false,
        };
        let node = Arc::new(SimNode::new(models.clone(), prepare));
        let participant = Participant::new(config, node, Arc::new(Health::default()));
        tasks.push(tokio::spawn(participant.run(stop.clone())));
    }
    for task in tasks {
        let _ = task.await;
    }
}
