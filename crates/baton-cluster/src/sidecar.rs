//! The sidecar agent: takes part in fleet rollouts on behalf of a KServe V2
//! server that has the model-repository extension (another baton without
//! cluster mode, Triton, MLServer) and shares a file system with it.
//!
//! Versions are published in a source repository in baton's layout. To
//! prepare, the agent verifies a version against its MANIFEST, copies it
//! into a staging directory outside the target's repository, in the layout
//! that server reads ([`TargetLayout`]), and has the server load it on
//! trial under a name of its own ([`probe`]): the candidate is prepared
//! only once the server answered ready for it and answered a request with
//! it; a version the server cannot load fails the prepare with the
//! server's reason, and the rollout aborts with nobody switched. To
//! switch, the agent renames the staged version into the target's
//! repository (the one in place moves aside) and asks the server to load
//! the model; the switch is done when that call returns and the version
//! answers ready.
//!
//! What this cannot give, compared with a baton replica (see
//! docs/fleet.md, "The sidecar agent"):
//! - a switch is a whole load by the server, not one store: the server may
//!   answer from either version while it loads, and the candidate is
//!   loaded twice (on trial, then for real);
//! - a subset step ([`Node::share_all`]) is that same whole switch on this
//!   server — it cannot split traffic — and going back is a load of the
//!   version kept aside;
//! - no observations ([`Node::take_sums`] is `None`): a sidecar sees no
//!   requests, so the fleet's guards judge on baton replicas' alone;
//! - the lease says the agent lives, not the server.

pub mod area;
pub mod layout;
pub mod probe;
pub mod target;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::files::source::{FetchError, Source};
use baton_core::rollout::window::Sums;
use baton_core::threads::sync::Lock;
use tokio::sync::Semaphore;

pub use area::Area;
pub use layout::TargetLayout;
pub use target::Target;

use crate::node::{BUSY, Node, Refusal};
use crate::records::Serving;

/// Where the agent reads versions, where it puts them, and whom it tells.
#[derive(Clone)]
pub struct SidecarConfig {
    /// Where versions are published, in baton's layout: a local
    /// repository, or an object store read through its cache.
    pub source: Arc<dyn Source>,
    /// The directory holding each source model's `model.toml`
    /// (`<dir>/<model>/model.toml`): the local repository, or the store's cache.
    pub specs: PathBuf,
    /// The target server's model repository.
    pub target_repo: PathBuf,
    /// Where candidates are staged: outside the target's repository, on its
    /// file system; by default `<target_repo>.baton-staging`.
    pub staging: Option<PathBuf>,
    /// The target's REST base URL, `http://HOST:PORT`.
    pub target_url: String,
    /// A bearer token for the target's load calls.
    pub target_token: Option<String>,
    /// The kind of server.
    pub layout: TargetLayout,
    /// How long one load, readiness included, may take.
    pub load_timeout: Duration,
}

/// What the agent put into place for one model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Placed {
    /// The version the server serves, as far as the agent knows: the last
    /// one it loaded. Usually the one in place; after a subset step was
    /// taken back and the server did not load the kept version again, the
    /// candidate it still holds (a server keeps the model it has when a
    /// reload fails), until the agent converges again.
    stable: Option<u64>,
    /// The version staged (or, when `shared`, in place).
    candidate: Option<u64>,
    /// The candidate is in place and loaded; `stable` is kept aside.
    shared: bool,
    /// The files in place are not `stable`'s (the server did not load the
    /// ones put back): it is served, but not from what is in place.
    stale: bool,
}

/// Another server, driven through its repository and its load call.
pub struct SidecarNode {
    source: Arc<dyn Source>,
    specs: PathBuf,
    area: Area,
    target: Target,
    layout: TargetLayout,
    placed: Lock<BTreeMap<String, Placed>>,
    /// One operation on each model at a time: a switch is several file
    /// moves and a load, which must not interleave with another's.
    turns: Lock<BTreeMap<String, Arc<Semaphore>>>,
    ready: Lock<Option<BTreeSet<String>>>,
}

fn refusal(stage: &str, reason: impl std::fmt::Display) -> Refusal {
    Refusal { stage: stage.to_owned(), reason: reason.to_string() }
}

/// Runs blocking work (files, HTTP) off the async workers.
async fn blocking<T: Send + 'static>(
    stage: &'static str,
    work: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| Err(refusal(stage, e)))
}

impl SidecarNode {
    /// An agent for the server and repositories of `config`. It has put
    /// nothing into place yet: on joining the fleet it loads the committed
    /// version once, whatever the server serves. Refuses a target URL with
    /// credentials, and a staging directory inside the target's repository
    /// or on another file system ([`Area::open`]), which it creates; has
    /// the server unload the probes an earlier agent left (blocks).
    pub fn new(config: SidecarConfig) -> Result<SidecarNode, String> {
        target::check_url(&config.target_url)?;
        let (area, probes) = Area::open(config.target_repo, config.staging)?;
        let target = Target::new(&config.target_url, config.target_token, config.load_timeout);
        // Blocks briefly: a probe an earlier agent left is unloaded (best effort).
        for probe in probes {
            if let Err(error) = target.unload(&probe) {
                tracing::debug!(%probe, %error, "Could not unload a probe an earlier agent left.");
            }
        }
        Ok(SidecarNode {
            source: config.source,
            specs: config.specs,
            area,
            target,
            layout: config.layout,
            placed: Lock::default(),
            turns: Lock::default(),
            ready: Lock::default(),
        })
    }

    /// What the participant reported last: ready with these models, or not
    /// ready (`None`).
    pub fn readiness(&self) -> Option<BTreeSet<String>> {
        self.ready.lock().clone()
    }

    /// What the agent put into place, per model it handled.
    pub fn placed_models(&self) -> BTreeMap<String, Serving> {
        let models: Vec<String> = self.placed.lock().keys().cloned().collect();
        models.into_iter().map(|m| (m.clone(), self.serving(&m))).collect()
    }

    fn placed(&self, model: &str) -> Placed {
        self.placed.lock().get(model).copied().unwrap_or_default()
    }

    fn set_placed(&self, model: &str, placed: Placed) {
        self.placed.lock().insert(model.to_owned(), placed);
    }

    fn turn(&self, model: &str) -> Arc<Semaphore> {
        Arc::clone(self.turns.lock().entry(model.to_owned()).or_insert_with(|| Arc::new(Semaphore::new(1))))
    }

    /// Waits for `model`'s turn.
    async fn take_turn(&self, model: &str) -> Result<tokio::sync::OwnedSemaphorePermit, Refusal> {
        self.turn(model).acquire_owned().await.map_err(|e| refusal("agent", e))
    }

    /// `model`'s turn, now, or a [`BUSY`] refusal: a prepare waits for the
    /// operation under way within its rollout's prepare timeout (see
    /// [`Node::until_free`]) rather than without a bound.
    fn turn_now(&self, model: &str) -> Result<tokio::sync::OwnedSemaphorePermit, Refusal> {
        self.turn(model).try_acquire_owned().map_err(|_| {
            refusal(
                BUSY,
                format!("another operation of model {model} is under way on the agent (a load in its server)"),
            )
        })
    }

    /// Stages `version` (see [`Area::stage`]), and checks that the server
    /// is given what it needs beside it ([`TargetLayout::model_files`]): a
    /// version without it is refused at stage `verify`, and unstaged.
    async fn stage(&self, model: &str, version: u64) -> Result<(), Refusal> {
        let (source, area, layout, name) = (self.source.clone(), self.area.clone(), self.layout, model.to_owned());
        let source_model = self.specs.join(model);
        blocking("fetch", move || {
            let fetch = |e: FetchError| refusal("fetch", e);
            let dir = source.fetch(&name, version).map_err(fetch)?.dir;
            let options = source.spec(&name).map_err(fetch)?.policy.verify_options();
            area.stage(&dir, &options, layout, &name, version)?;
            let staged = area.staged_dir(&name, version);
            if let Err(error) = layout.model_files(&staged, &area.model_dir(&name), &source_model, &name) {
                let _ = area.unstage(&name, version);
                return Err(refusal("verify", format!("version {version} of model {name}: {error}")));
            }
            Ok(())
        })
        .await?;
        tracing::info!(model, version, target = %self.target.base(), "Staged a verified version for the target server.");
        Ok(())
    }

    /// Stages `version` and has the server load it on trial
    /// ([`SidecarNode::probe`]); a version the server cannot serve is
    /// deleted from staging.
    async fn stage_and_probe(&self, model: &str, version: u64) -> Result<(), Refusal> {
        self.stage(model, version).await?;
        if let Err(refused) = self.probe(model, version).await {
            let (area, name) = (self.area.clone(), model.to_owned());
            let unstaged = blocking("place", move || area.unstage(&name, version).map_err(|e| refusal("place", e)));
            if let Err(error) = unstaged.await {
                tracing::warn!(model, version, %error, "Could not delete a staged version the server could not serve.");
            }
            return Err(refused);
        }
        Ok(())
    }

    /// Asks the server to load `version` of `model`, now in place, and waits
    /// until it answers ready.
    async fn load(&self, model: &str, version: u64) -> Result<(), Refusal> {
        let (target, name, body) = (self.target.clone(), model.to_owned(), self.layout.load_body(version));
        let started = Instant::now();
        let until = started + self.target.load_timeout();
        blocking("load", move || {
            target
                .load(&name, &body, until)
                .and_then(|()| target.wait_ready(&name, version, until))
                .map_err(|e| refusal("load", e))
        })
        .await?;
        let load_ms = started.elapsed().as_millis() as u64;
        tracing::info!(model, version, load_ms, target = %self.target.base(), "The target server loaded a version.");
        Ok(())
    }

    /// Puts the staged candidate into place and loads it. The version in
    /// place moves aside; it is kept when `keep`, else deleted once the load
    /// succeeded. A failed load puts the files back as they were.
    async fn switch(&self, model: &str, version: u64, keep: bool) -> Result<(), Refusal> {
        let (area, layout, name) = (self.area.clone(), self.layout, model.to_owned());
        let source_model = self.specs.join(model);
        blocking("place", move || {
            let place = |e: std::io::Error| refusal("place", e);
            let staged = area.staged_dir(&name, version);
            layout.finish_model(&staged, &area.model_dir(&name), &source_model, &name).map_err(place)?;
            area.put_in_place(&name, version).map_err(place)
        })
        .await?;
        if let Err(failed) = self.load(model, version).await {
            let (area, name) = (self.area.clone(), model.to_owned());
            let undone =
                blocking("place", move || area.take_back(&name, version, true).map_err(|e| refusal("place", e)));
            if let Err(refused) = undone.await {
                tracing::error!(model, version, %refused, "Could not put the target's repository back after a failed load.");
            }
            return Err(failed);
        }
        if !keep {
            self.forget_kept(model).await;
        }
        Ok(())
    }

    /// Deletes the version kept aside; a failure only leaves files behind.
    async fn forget_kept(&self, model: &str) {
        let (area, name) = (self.area.clone(), model.to_owned());
        let forgotten = blocking("place", move || area.forget_kept(&name).map_err(|e| refusal("place", e)));
        if let Err(refused) = forgotten.await {
            tracing::warn!(model, %refused, "Could not delete the version kept aside.");
        }
    }

    /// Removes the candidate: a staged one is deleted; one in place after a
    /// subset switch is deleted and the kept version returns and is loaded.
    /// When that load fails, the server still serves the candidate (it
    /// keeps what it has when a load fails): the agent says so, and the
    /// participant converges it on the committed version, not ready
    /// meanwhile.
    async fn drop_now(&self, model: &str) -> Result<(), Refusal> {
        let placed = self.placed(model);
        let Some(candidate) = placed.candidate else { return Ok(()) };
        let (area, name) = (self.area.clone(), model.to_owned());
        if placed.shared {
            let back =
                blocking("place", move || area.take_back(&name, candidate, false).map_err(|e| refusal("place", e)))
                    .await?;
            // Until the server loads what came back, it serves the candidate.
            let still = Placed { stable: Some(candidate), stale: true, ..Placed::default() };
            let Some(&kept) = back.iter().max() else {
                self.set_placed(model, still);
                return Err(refusal("place", format!("no version of model {model} was kept aside to go back to")));
            };
            if let Err(failed) = self.load(model, kept).await {
                tracing::error!(model, version = kept, candidate, %failed, "The target server did not load the kept version again: it still serves the candidate.");
                self.set_placed(model, still);
                return Err(failed);
            }
            self.set_placed(model, Placed { stable: Some(kept), ..Placed::default() });
        } else {
            blocking("place", move || area.unstage(&name, candidate).map_err(|e| refusal("place", e))).await?;
            self.set_placed(model, Placed { candidate: None, ..placed });
        }
        Ok(())
    }
}

impl Node for SidecarNode {
    async fn available(&self) -> Result<BTreeMap<String, Option<u64>>, Refusal> {
        let source = self.source.clone();
        blocking("fetch", move || crate::node::newest_versions(source.as_ref()).map_err(|e| refusal("fetch", e))).await
    }

    /// What the agent last put into place (stable) and staged (candidate);
    /// the candidate has all of this server's traffic after a subset switch.
    fn serving(&self, model: &str) -> Serving {
        let placed = self.placed(model);
        Serving {
            stable: placed.stable,
            candidate: placed.candidate,
            candidate_percent: if placed.shared { 100.0 } else { 0.0 },
        }
    }

    /// Stages and verifies the version, and has the server load it on
    /// trial and answer with it; what the server serves does not change.
    /// A version it serves already is prepared as it is.
    async fn prepare(&self, model: &str, version: u64) -> Result<(), Refusal> {
        let _turn = self.turn_now(model)?;
        let placed = self.placed(model);
        let serves = placed.stable == Some(version) && placed.candidate.is_none() && !placed.stale;
        if placed.candidate == Some(version) || serves {
            return Ok(());
        }
        self.drop_now(model).await?;
        self.stage_and_probe(model, version).await?;
        self.set_placed(model, Placed { candidate: Some(version), shared: false, ..self.placed(model) });
        Ok(())
    }

    /// A server behind a sidecar cannot split its traffic: a subset step
    /// switches it whole, keeping the stable version aside to go back to.
    async fn share_all(&self, model: &str) -> Result<(), Refusal> {
        let _turn = self.take_turn(model).await?;
        let placed = self.placed(model);
        let Some(candidate) = placed.candidate else {
            return Err(refusal("place", format!("model {model} has no staged candidate")));
        };
        if !placed.shared {
            self.switch(model, candidate, true).await?;
            self.set_placed(model, Placed { shared: true, ..placed });
        }
        Ok(())
    }

    /// The candidate becomes stable: put into place and loaded, unless a
    /// subset switch did that already; the version moved aside is deleted.
    async fn promote(&self, model: &str) -> Result<(), Refusal> {
        let _turn = self.take_turn(model).await?;
        let placed = self.placed(model);
        let Some(candidate) = placed.candidate else {
            return Err(refusal("place", format!("model {model} has no staged candidate")));
        };
        if placed.shared {
            self.forget_kept(model).await;
        } else {
            self.switch(model, candidate, false).await?;
        }
        self.set_placed(model, Placed { stable: Some(candidate), ..Placed::default() });
        Ok(())
    }

    /// Before a subset switch, deletes the staged copy; after one, brings
    /// the kept version back and loads it again (rolled back or aborted
    /// alike).
    async fn drop_candidate(&self, model: &str, _rolled_back: bool) -> Result<(), Refusal> {
        let _turn = self.take_turn(model).await?;
        self.drop_now(model).await
    }

    /// Stages, verifies and tries `version` (as a prepare does), then puts
    /// it into place and loads it. A version the server cannot load is
    /// refused before anything in place moves. A candidate in place is
    /// taken back first; one only staged (a replica left out of a gray
    /// step, converging meanwhile) stays, for the step that includes it.
    async fn converge(&self, model: &str, version: u64) -> Result<(), Refusal> {
        let _turn = self.take_turn(model).await?;
        let placed = self.placed(model);
        if placed.shared || placed.candidate == Some(version) {
            self.drop_now(model).await?;
        }
        let placed = self.placed(model);
        if placed.stable == Some(version) && !placed.stale {
            return Ok(());
        }
        self.stage_and_probe(model, version).await?;
        self.switch(model, version, false).await?;
        self.set_placed(model, Placed { stable: Some(version), candidate: placed.candidate, ..Placed::default() });
        Ok(())
    }

    /// Returns once no operation of `model` runs on the agent.
    async fn until_free(&self, model: &str) {
        // Taken and given back at once: the turn was free.
        let _ = self.turn(model).acquire().await;
    }

    /// A sidecar sees no requests: the fleet's guards judge on what baton
    /// replicas observe.
    fn take_sums(&self, _model: &str) -> Option<Sums> {
        None
    }

    fn set_ready(&self, ready: Option<BTreeSet<String>>) {
        let mut now = self.ready.lock();
        if *now != ready {
            match &ready {
                Some(models) => {
                    tracing::info!(models = ?models, "The agent is ready: the target serves what the fleet committed.")
                }
                None => tracing::info!("The agent is not ready."),
            }
        }
        *now = ready;
    }
}
