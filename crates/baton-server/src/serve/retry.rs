//! When the repository watcher tries a model again after a load failed:
//! which failures are the version's files (trying again changes nothing)
//! and which are of the moment, and how long it waits between tries.

use std::time::{Duration, Instant};

use baton_core::registry::error::LoadError;

/// The wait before a model whose load failed for a reason of the moment (a
/// store that did not answer, a memory budget full) is tried again; it
/// doubles with each failure in a row, up to [`MAX_RETRY`].
pub(super) const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two tries of a model whose load keeps failing
/// for a reason of the moment.
pub(super) const MAX_RETRY: Duration = Duration::from_secs(60);
/// Readiness waits for a model that serves nothing and fails for a reason
/// of the moment until its wait reaches this (its fourth failure in a
/// row, about 7 s after the first), then excuses it while it is tried
/// again: a replica that serves its other models is not held out of its
/// load balancer by one that cannot load.
pub(super) const EXCUSE_AFTER: Duration = Duration::from_secs(8);

/// When a model whose load failed for a reason of the moment is tried again.
#[derive(Clone, Copy, Debug)]
pub(super) struct Retry {
    /// Not before this.
    pub(super) due: Instant,
    /// The wait that led to `due`, doubled after the next failure.
    pub(super) wait: Duration,
}

/// Whether a load failure is a refusal of the version's files that trying
/// again cannot change: its `model.toml`, its files against their MANIFEST,
/// its tensors, the engine refusing the model, its warmup's outputs.
/// Anything else (a store or file system that failed to answer, a full
/// memory budget, a panic, shutdown) is of the moment.
pub(super) fn refuses_the_files(error: &LoadError) -> bool {
    use baton_core::registry::load::warmup::WarmupError;
    match error {
        LoadError::Config(_) | LoadError::Verify(_) | LoadError::Validate(_) | LoadError::Load(_) => true,
        LoadError::Warmup(error) => !matches!(error, WarmupError::TooSlow { .. } | WarmupError::Failed { .. }),
        _ => false,
    }
}

/// Whether a failure of the moment is the source's as a whole (a file
/// system or store that does not answer) rather than one version's (a
/// budget it does not fit, an object missing, its warmup).
pub(super) fn reaches_the_whole_source(error: &LoadError) -> bool {
    match error {
        LoadError::Fetch(fetch) => {
            let kind = fetch.kind();
            kind == "io" || (kind.starts_with("store_") && kind != "store_not_found")
        }
        _ => false,
    }
}
