//! The routing table: everything that must change together, behind one
//! pointer. A request loads the table once and keeps that snapshot for all it
//! does; a commit builds a whole new table and publishes it with one
//! store.
//!
//! Each table also tells when the last request holding it has finished: it
//! owns the sending half of a channel whose receiver the registry takes at
//! commit time, and the channel closes when the table is dropped. The drain
//! stage waits on that, so requests pay nothing for being counted.

use std::collections::BTreeMap;
use std::sync::{Arc, mpsc};

use crate::files::rollout_spec::Mode;
use crate::registry::pause::Pause;
use crate::rollout::{Compare, Role, Rollout, assign};
use crate::run::error::InferError;
use crate::run::version::Version;
use crate::tensors::tensor::Tensor;
use crate::threads::sync::Lock;

/// How one model is routed.
#[derive(Clone, Debug)]
pub struct ModelRoute {
    /// The version that answers requests that name no version.
    pub stable: Arc<Version>,
    /// Earlier versions kept loaded for rollback, newest first.
    pub previous: Vec<Arc<Version>>,
    /// The rollout in progress, if any: its candidate, mode and weight.
    pub rollout: Option<Rollout>,
}

impl ModelRoute {
    /// A route with a stable version, previous ones and no rollout.
    pub fn new(stable: Arc<Version>, previous: Vec<Arc<Version>>) -> ModelRoute {
        ModelRoute { stable, previous, rollout: None }
    }

    /// Every version of this route: stable, the candidate, then previous.
    pub fn versions(&self) -> impl Iterator<Item = &Arc<Version>> {
        std::iter::once(&self.stable).chain(self.rollout.as_ref().map(|r| &r.candidate)).chain(&self.previous)
    }

    /// The role `version` plays in this route.
    pub fn role_of(&self, version: &Version) -> Role {
        if std::ptr::eq(version, Arc::as_ptr(&self.stable)) {
            Role::Stable
        } else if self.rollout.as_ref().is_some_and(|r| std::ptr::eq(version, Arc::as_ptr(&r.candidate))) {
            Role::Candidate
        } else {
            Role::Previous
        }
    }
}

/// Where one request goes: the version that answers it, in which role, and
/// whether a copy of it is to be run on the other side of a rollout, off
/// the response path, to compare their outputs.
#[derive(Clone, Debug)]
pub struct Routed<'a> {
    /// The version that answers.
    pub version: &'a Arc<Version>,
    /// Its role.
    pub role: Role,
    /// The side of the rollout's windows its observations count on: its
    /// role, except during the watch after promotion, where the new stable
    /// version's answers are the side under judgement (the candidate's).
    pub side: Role,
    /// Where a copy of this request goes to compare outputs, when it is
    /// copied: to the candidate (shadow mode) or, paired, to the stable
    /// version (during the watch, to the version that served before).
    pub compare: Option<Compare<'a>>,
    /// The rollout this request's model is in, if any: where its latency
    /// and errors are recorded.
    pub rollout: Option<&'a Rollout>,
}

/// One immutable routing table.
pub struct Routing {
    generation: u64,
    models: BTreeMap<String, ModelRoute>,
    /// Models whose version is being replaced under the resource swap
    /// policy: no route, a gate to wait at.
    paused: BTreeMap<String, Arc<Pause>>,
    _alive: mpsc::Sender<()>,
    released: Lock<Option<mpsc::Receiver<()>>>,
}

/// What a request carries: one routing table, for its whole life.
pub type Snapshot = Arc<Routing>;

/// An inference answer and the version that produced it.
#[derive(Clone, Debug)]
pub struct Inference {
    /// The version that answered.
    pub version: u64,
    /// The outputs.
    pub outputs: Vec<Tensor>,
}

impl Routing {
    /// A table with these routes.
    pub fn new(generation: u64, models: BTreeMap<String, ModelRoute>) -> Routing {
        Routing::with_paused(generation, models, BTreeMap::new())
    }

    /// A table with these routes and these models paused.
    pub(crate) fn with_paused(
        generation: u64,
        models: BTreeMap<String, ModelRoute>,
        paused: BTreeMap<String, Arc<Pause>>,
    ) -> Routing {
        let (alive, released) = mpsc::channel();
        Routing { generation, models, paused, _alive: alive, released: Lock::new(Some(released)) }
    }

    /// The gate of `model` while its version is being replaced under the
    /// resource swap policy: the model has no route meanwhile, and a
    /// request waits for the gate to open, without holding this table,
    /// then takes a new snapshot ([`crate::registry::Registry::snapshot_serving`]).
    pub fn paused(&self, model: &str) -> Option<&Arc<Pause>> {
        self.paused.get(model)
    }

    /// Every paused model's gate, by model name.
    pub(crate) fn all_paused(&self) -> &BTreeMap<String, Arc<Pause>> {
        &self.paused
    }

    /// Whether `model` serves, or is paused while a new version replaces
    /// the old one: what readiness counts as serving.
    pub fn holds(&self, model: &str) -> bool {
        self.models.contains_key(model) || self.paused.contains_key(model)
    }

    /// Whether `model` can answer: it [holds](Snapshot::holds) it, and its
    /// stable version's engine is alive (a version whose worker process
    /// ended is held, but answers nothing until it is replaced).
    pub fn serves(&self, model: &str) -> bool {
        self.paused.contains_key(model) || self.models.get(model).is_some_and(|route| route.stable.alive())
    }

    /// Increases by one with every publish.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The route of a model.
    pub fn model(&self, name: &str) -> Option<&ModelRoute> {
        self.models.get(name)
    }

    /// All routes, by model name.
    pub fn models(&self) -> &BTreeMap<String, ModelRoute> {
        &self.models
    }

    /// The version that serves `model` — a named version if it is loaded,
    /// else the stable one.
    pub fn resolve(&self, model: &str, version: Option<u64>) -> Result<&Arc<Version>, InferError> {
        let route = self.models.get(model).ok_or_else(|| InferError::ModelNotFound(model.to_owned()))?;
        match version {
            None => Ok(&route.stable),
            Some(v) => route
                .versions()
                .find(|x| x.number() == v)
                .ok_or_else(|| InferError::VersionNotFound { model: model.to_owned(), version: v }),
        }
    }

    /// Where a request goes. A request that names a version gets it, in the
    /// role it plays; one that names none gets the stable version, or the
    /// candidate when its bucket (its sticky `key`'s, else a random one)
    /// falls within the candidate's weight in canary and A/B modes.
    pub fn route(&self, model: &str, version: Option<u64>, key: Option<&[u8]>) -> Result<Routed<'_>, InferError> {
        let route = self.models.get(model).ok_or_else(|| InferError::ModelNotFound(model.to_owned()))?;
        if let Some(v) = version {
            let target = self.resolve(model, Some(v))?;
            let role = route.role_of(target);
            let rollout = route.rollout.as_ref().filter(|_| role != Role::Previous);
            let side = if rollout.is_some_and(|r| r.baseline.is_some()) { Role::Candidate } else { role };
            return Ok(Routed { version: target, role, side, compare: None, rollout });
        }
        let Some(rollout) = &route.rollout else {
            let stable = &route.stable;
            return Ok(Routed {
                version: stable,
                role: Role::Stable,
                side: Role::Stable,
                compare: None,
                rollout: None,
            });
        };
        if let Some(baseline) = &rollout.baseline {
            // The watch after promotion: stable answers all, judged against
            // the version it replaced.
            let compare = rollout.paired.then_some(Compare { rollout, other: baseline, role: Role::Stable });
            let version = &route.stable;
            return Ok(Routed { version, role: Role::Stable, side: Role::Candidate, compare, rollout: Some(rollout) });
        }
        let stable = Routed {
            version: &route.stable,
            role: Role::Stable,
            side: Role::Stable,
            compare: None,
            rollout: Some(rollout),
        };
        let bucket = key.map_or_else(assign::random_bucket, |key| assign::bucket(rollout.salt, key));
        let chosen = assign::to_candidate(bucket, rollout.weight);
        Ok(match (rollout.mode, chosen) {
            (_, false) => stable,
            (Mode::Shadow, true) => Routed {
                compare: Some(Compare { rollout, other: &rollout.candidate, role: Role::Candidate }),
                ..stable
            },
            (Mode::Canary | Mode::Ab, true) => Routed {
                version: &rollout.candidate,
                role: Role::Candidate,
                side: Role::Candidate,
                compare: rollout.paired.then(|| Compare {
                    rollout,
                    other: rollout.paired_with(&route.stable),
                    role: Role::Stable,
                }),
                rollout: Some(rollout),
            },
        })
    }

    /// Runs an inference on the version this snapshot routes to, blocking
    /// the calling thread until it is answered (see [`Version::infer`]).
    pub fn infer(&self, model: &str, version: Option<u64>, inputs: &[Tensor]) -> Result<Inference, InferError> {
        let target = self.resolve(model, version)?;
        let outputs = target.infer(inputs)?;
        Ok(Inference { version: target.number(), outputs })
    }

    /// Serves one request that names no version as the server does, on the
    /// calling thread: assigns it a side of a rollout by its `key`, runs
    /// it, records it in the rollout's window, and runs its comparison copy
    /// when it has one, waiting for it. For tools and tests; the server
    /// runs copies off the response path.
    pub fn serve(&self, model: &str, key: Option<&[u8]>, inputs: &[Tensor]) -> Result<(Inference, Role), InferError> {
        let routed = self.route(model, None, key)?;
        let (outcome, ran) = routed.version.infer_timed(inputs);
        if let Some(rollout) = routed.rollout {
            rollout.observations.record(routed.side, ran, outcome.is_err());
        }
        // A request that failed in the version is copied too (one with bad
        // inputs is nobody's failure).
        let copied = !matches!(outcome, Err(InferError::InvalidInput(_)));
        if let Some(copy) =
            routed.compare.filter(|_| copied).and_then(|c| c.start(inputs.to_vec(), outcome.as_deref().ok()))
        {
            copy.wait(outcome.as_deref().ok());
        }
        let outputs = outcome?;
        Ok((Inference { version: routed.version.number(), outputs }, routed.role))
    }

    /// Takes the receiver that reports when this table is dropped. Only the
    /// first caller gets it.
    pub(crate) fn take_released(&self) -> Option<mpsc::Receiver<()>> {
        self.released.lock().take()
    }
}

impl std::fmt::Debug for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routing")
            .field("generation", &self.generation)
            .field("models", &self.models)
            .field("paused", &self.paused.keys())
            .finish()
    }
}
