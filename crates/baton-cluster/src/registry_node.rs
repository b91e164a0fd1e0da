//! A baton registry as a fleet participant: the candidate is a steered
//! rollout at weight 0, the switches are the registry's single stores.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use baton_core::files::rollout_spec::Guards;
use baton_core::registry::Registry;
use baton_core::registry::error::LoadError;
use baton_core::registry::load::RolloutStart;
use baton_core::rollout::FULL;
use baton_core::rollout::control::{By, Ending};
use baton_core::rollout::plan::Plan;
use baton_core::rollout::window::Sums;

use crate::node::{Node, Refusal};
use crate::records::Serving;

/// Reports readiness to whoever serves the registry.
pub type Readiness = Arc<dyn Fn(Option<BTreeSet<String>>) + Send + Sync>;

/// A registry driven by the fleet.
#[derive(Clone)]
pub struct RegistryNode {
    registry: Registry,
    ready: Readiness,
}

impl RegistryNode {
    /// Drives `registry`, reporting readiness through `ready`.
    pub fn new(registry: Registry, ready: Readiness) -> RegistryNode {
        RegistryNode { registry, ready }
    }

    /// Prepares `version` as the candidate of a steered rollout whose
    /// identity is `rollout` (a fresh one when `None`). A candidate of the
    /// same version and rollout is kept; one of an earlier rollout (ended
    /// unseen, or of the same version under another rollout) is dropped
    /// first, so that its outcome ids are not taken for this one's.
    async fn prepare_rollout(&self, model: &str, version: u64, rollout: Option<u64>) -> Result<(), Refusal> {
        let serving = self.serving(model);
        if serving.stable == Some(version) && serving.candidate.is_none() {
            // It serves that version already (a rollout back to it, on a
            // replica that could not load what the fleet committed since).
            return Ok(());
        }
        if let Some(candidate) = serving.candidate {
            let same = candidate == version && rollout.is_none_or(|id| self.rollout_id(model) == Some(id));
            if same {
                return Ok(());
            }
            self.drop_candidate(model, false).await?;
        }
        let paired = true;
        let start = RolloutStart {
            version: Some(version),
            plan: Some(steered_plan(paired)),
            steered: true,
            id: rollout,
            ..RolloutStart::default()
        };
        let handle = self.registry.start_rollout(model, start).map_err(|e| refusal(&e))?;
        handle.finished().await.map(drop).map_err(|e| refusal(&e))
    }

    /// The identity of `model`'s rollout in the routing table, if any.
    fn rollout_id(&self, model: &str) -> Option<u64> {
        self.registry.snapshot().model(model)?.rollout.as_ref().map(|r| r.id)
    }
}

/// The plan of a steered rollout: no traffic, then all of it; windows are
/// judged by the fleet's coordinator, not here.
fn steered_plan(paired: bool) -> Plan {
    Plan {
        mode: baton_core::files::rollout_spec::Mode::Canary,
        steps: vec![0, FULL],
        interval_ms: 1000,
        failure_limit: 1,
        max_inconclusive: 1,
        paired,
        queue: 64,
        // The fleet's coordinator watches, or not; a server does not.
        watch_ms: 0,
        guards: Guards::default(),
    }
}

fn refusal(error: &LoadError) -> Refusal {
    let stage = error.stage().map_or_else(|| error.kind().to_owned(), |s| s.as_str().to_owned());
    Refusal { stage, reason: error.to_string() }
}

impl Node for RegistryNode {
    async fn available(&self) -> Result<BTreeMap<String, Option<u64>>, Refusal> {
        let source = Arc::clone(self.registry.source());
        let listed = tokio::task::spawn_blocking(move || crate::node::newest_versions(source.as_ref())).await;
        match listed {
            Ok(Ok(newest)) => Ok(newest),
            Ok(Err(error)) => Err(Refusal { stage: "fetch".into(), reason: error.to_string() }),
            Err(error) => Err(Refusal { stage: "fetch".into(), reason: error.to_string() }),
        }
    }

    fn serving(&self, model: &str) -> Serving {
        let snapshot = self.registry.snapshot();
        let Some(route) = snapshot.model(model) else { return Serving::default() };
        let rollout = route.rollout.as_ref();
        Serving {
            stable: Some(route.stable.number()),
            candidate: rollout.map(|r| r.candidate.number()),
            candidate_percent: rollout.map_or(0.0, |r| baton_core::rollout::control::percent(r.weight)),
        }
    }

    async fn prepare(&self, model: &str, version: u64) -> Result<(), Refusal> {
        self.prepare_rollout(model, version, None).await
    }

    async fn prepare_for(&self, model: &str, version: u64, rollout: u64) -> Result<(), Refusal> {
        self.prepare_rollout(model, version, Some(rollout)).await
    }

    async fn share_all(&self, model: &str) -> Result<(), Refusal> {
        self.registry.step_rollout(model, 1, By::Fleet).map(drop).map_err(|e| refusal(&e))
    }

    async fn promote(&self, model: &str) -> Result<(), Refusal> {
        let handle = self.registry.end_rollout(model, Ending::Promote, By::Fleet).map_err(|e| refusal(&e))?;
        // The store is done; the old version drains on its own.
        tokio::spawn(handle.finished());
        Ok(())
    }

    async fn drop_candidate(&self, model: &str, rolled_back: bool) -> Result<(), Refusal> {
        let ending = if rolled_back { Ending::RollBack } else { Ending::Abort };
        let handle = self.registry.end_rollout(model, ending, By::Fleet).map_err(|e| refusal(&e))?;
        tokio::spawn(handle.finished());
        Ok(())
    }

    async fn converge(&self, model: &str, version: u64) -> Result<(), Refusal> {
        if self.serving(model).candidate.is_some() {
            self.drop_candidate(model, false).await?;
        }
        if self.serving(model).stable == Some(version) {
            return Ok(());
        }
        let handle = self.registry.load(model, Some(version)).map_err(|e| refusal(&e))?;
        handle.finished().await.map(drop).map_err(|e| refusal(&e))
    }

    fn take_sums(&self, model: &str) -> Option<Sums> {
        self.registry.take_rollout_sums(model)
    }

    fn set_ready(&self, ready: Option<BTreeSet<String>>) {
        (self.ready)(ready);
    }

    async fn until_free(&self, model: &str) {
        self.registry.until_free(model).await;
    }
}
