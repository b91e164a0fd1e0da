//! What a participant drives: a baton registry in the same process, or,
//! through the sidecar agent, another KServe V2 server.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use baton_core::files::source::{FetchError, Source};
use baton_core::rollout::window::Sums;

use crate::records::Serving;

/// Why a node could not do what it was told: the stage and the reason, as
/// the fleet's status shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The stage that failed (`fetch`, `verify`, `validate`, `load`, …).
    pub stage: String,
    /// Why.
    pub reason: String,
}

/// The stage of a refusal because another operation of the model is under
/// way on the node (a load, the drain after a switch): a prepare refused so
/// waits for it to end ([`Node::until_free`]) and tries again, within the
/// rollout's prepare timeout.
pub const BUSY: &str = "load_in_progress";

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.stage, self.reason)
    }
}

/// A server taking part in fleet rollouts.
///
/// The switches (`share_all`, `promote`, `drop_candidate`) return once the
/// server answers with the new version: for a baton registry that is one
/// store, done before the call returns.
pub trait Node: Send + Sync + 'static {
    /// The models the node can serve, each with its newest version.
    fn available(&self) -> impl Future<Output = Result<BTreeMap<String, Option<u64>>, Refusal>> + Send;

    /// What the node serves of `model` now.
    fn serving(&self, model: &str) -> Serving;

    /// Fetches, verifies, loads, validates and warms `version` beside the
    /// stable one, with no traffic.
    fn prepare(&self, model: &str, version: u64) -> impl Future<Output = Result<(), Refusal>> + Send;

    /// [`Node::prepare`], for the fleet's rollout `rollout`: a node that
    /// serves the rollout itself takes the id as the rollout's identity,
    /// which its answers' outcome ids are bound to, so that every replica
    /// takes the ids any of them issued. By default, as `prepare`.
    fn prepare_for(&self, model: &str, version: u64, rollout: u64) -> impl Future<Output = Result<(), Refusal>> + Send {
        let _ = rollout;
        self.prepare(model, version)
    }

    /// The prepared candidate takes all of the node's traffic; the stable
    /// version stays loaded, to go back to.
    fn share_all(&self, model: &str) -> impl Future<Output = Result<(), Refusal>> + Send;

    /// The candidate becomes the stable version.
    fn promote(&self, model: &str) -> impl Future<Output = Result<(), Refusal>> + Send;

    /// The candidate leaves; the stable version serves everything.
    fn drop_candidate(&self, model: &str, rolled_back: bool) -> impl Future<Output = Result<(), Refusal>> + Send;

    /// Serves `version` as stable, by a whole load: how a replica that
    /// missed a commit (or just started) converges.
    fn converge(&self, model: &str, version: u64) -> impl Future<Output = Result<(), Refusal>> + Send;

    /// What the candidate's rollout observed since the last call.
    fn take_sums(&self, model: &str) -> Option<Sums>;

    /// Reports ready, waiting for `models` to serve, or not ready (`None`).
    fn set_ready(&self, ready: Option<BTreeSet<String>>);

    /// Returns once no operation of `model` runs on the node, after a
    /// refusal whose stage is [`BUSY`]. A node that cannot tell never
    /// returns, and a waiting prepare tries again on a timer of its own.
    fn until_free(&self, model: &str) -> impl Future<Output = ()> + Send {
        let _ = model;
        std::future::pending()
    }
}

/// Every model of `source` with its newest complete version. Blocks: call
/// it from `spawn_blocking`.
pub fn newest_versions(source: &dyn Source) -> Result<BTreeMap<String, Option<u64>>, FetchError> {
    let mut newest = BTreeMap::new();
    for model in source.models()? {
        let version = source.versions(&model).ok().and_then(|v| v.into_iter().max());
        newest.insert(model, version);
    }
    Ok(newest)
}
