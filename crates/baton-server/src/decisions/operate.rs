//! The management operations that change what a model serves, as REST and
//! gRPC both run them: the registry's operation, then the decision it makes
//! written to the state file, then the answer. An answer of success means
//! the decision is on disk.
//!
//! - A rollback, or the load of a version older than the repository's
//!   newest, records that version; an unload records that the model stays
//!   out of service. Each yields to the first version newer than the
//!   newest present when it was made.
//! - A load of the newest version returns the model to the normal choice.
//! - A pin holds whatever is published, until unpinned; while a model is
//!   pinned, its other operations are refused (`model_pinned`).

use std::sync::Arc;

use baton_core::files::source::FetchError;
use baton_core::registry::error::LoadError;
use baton_core::registry::events::LoadReport;
use serde_json::{Value, json};

use super::{Change, Decision, Kind, StateError, Working, now, view};
use crate::app::App;
use crate::error::{Class, ServeError};
use crate::serving::blocking;

/// How long an operator's call waits for the repository watcher's pass
/// over the model (a pass that starts a model's first load holds it until
/// that load ends).
const WATCHER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Claims `model` for an operation, refusing while another operator's
/// runs on it. The watcher's pass over the model is waited for, within
/// [`WATCHER_WAIT`]: a call that lands while the watcher looks at the
/// model is not the conflict a concurrent operation is.
///
/// An upgrade that began after the access check let the call in is seen
/// here, once the model is claimed: the call is refused as the access
/// check would have, or the upgrade waits for it (it waits until no model
/// is claimed before it reads the state file).
pub(crate) async fn begin(app: &App, model: &str) -> Result<Working, ServeError> {
    let until = std::time::Instant::now() + WATCHER_WAIT;
    loop {
        if let Some(working) = app.decisions.begin(model) {
            if app.operations_held().load(std::sync::atomic::Ordering::SeqCst) {
                return Err(crate::access::upgrade_in_progress());
            }
            return Ok(working);
        }
        if !app.decisions.watcher_holds(model) || std::time::Instant::now() >= until {
            return Err(LoadError::InProgress { model: model.to_owned() }.into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// Refuses an operation other than unpin on a pinned model.
fn refuse_if_pinned(app: &App, model: &str, operation: &str) -> Result<(), ServeError> {
    match app.decisions.get(model) {
        Some(Decision { kind: Kind::Pin, version: Some(pinned), .. }) => Err(ServeError::new(
            Class::Conflict,
            "model_pinned",
            format!(
                "model '{model}' is pinned to version {pinned}; unpin it first (baton unpin {model}) to {operation} it"
            ),
        )),
        _ => Ok(()),
    }
}

/// Claims `model` for an operation that pinning forbids.
pub(crate) async fn claim(app: &App, model: &str, operation: &str) -> Result<Working, ServeError> {
    let working = begin(app, model).await?;
    refuse_if_pinned(app, model, operation)?;
    Ok(working)
}

/// Whether the repository has `model` (it reads `model.toml`: off the
/// async workers).
async fn in_repository(app: &Arc<App>, model: &str) -> bool {
    let (app, model) = (Arc::clone(app), model.to_owned());
    blocking(move || app.registry.source().spec(&model).is_ok()).await
}

/// The error for a decision that took effect but could not be written.
fn not_recorded(operation: &str, error: &StateError) -> ServeError {
    ServeError::new(
        Class::Internal,
        "state_write_failed",
        format!(
            "the {operation} took effect, but it could not be written to the state file ({error}); \
             a restart would not keep it"
        ),
    )
}

/// The repository's newest complete version of `model`, if it can be listed.
fn newest(app: &App, model: &str) -> Option<u64> {
    app.registry.source().versions(model).ok().and_then(|v| v.last().copied())
}

/// Writes what an operation that went through decided, from its report.
pub(crate) async fn settle(app: &Arc<App>, kind: Kind, report: &LoadReport) -> Result<(), ServeError> {
    let (app, model) = (Arc::clone(app), report.model.clone());
    let (chosen, replaced) = (report.version, report.replaced);
    let written = blocking(move || {
        // Were the repository unreadable just now, what served is the
        // best guess at its newest.
        let newest = newest(&app, &model).or(chosen.max(replaced));
        let change = match (kind, chosen, newest) {
            (Kind::Unload, _, _) => {
                Change::Recorded(Decision { kind, version: None, at: now(), yields_to: newest, rollout: None })
            }
            (_, Some(v), Some(newest)) if v < newest => {
                Change::Recorded(Decision { kind, version: Some(v), at: now(), yields_to: Some(newest), rollout: None })
            }
            _ => Change::Removed,
        };
        app.decisions.apply(&app.registry, &model, change)
    })
    .await;
    written.map_err(|e| not_recorded(kind.as_str(), &e))
}

/// Loads a version (the newest when `None`) and records it when it is older
/// than the newest.
pub async fn load(app: &Arc<App>, model: &str, version: Option<u64>) -> Result<LoadReport, ServeError> {
    let _working = begin(app, model).await?;
    refuse_if_pinned(app, model, "load")?;
    let report = app.registry.load(model, version)?.finished().await?;
    settle(app, Kind::Load, &report).await?;
    Ok(report)
}

/// baton's own load: [`load`], except that a load naming no version,
/// when `if_new`, loads nothing when the repository's newest version
/// already serves, can answer, and no decision holds the model elsewhere;
/// then `Err(version)` says which serves.
pub async fn load_if_new(
    app: &Arc<App>,
    model: &str,
    version: Option<u64>,
    if_new: bool,
) -> Result<Result<LoadReport, u64>, ServeError> {
    let _working = begin(app, model).await?;
    refuse_if_pinned(app, model, "load")?;
    if version.is_none() && if_new && app.decisions.get(model).is_none() {
        let serving = app.registry.snapshot().model(model).filter(|r| r.stable.alive()).map(|r| r.stable.number());
        let newest = {
            let (app, model) = (Arc::clone(app), model.to_owned());
            blocking(move || newest(&app, &model)).await
        };
        if let Some(serving) = serving.filter(|s| Some(*s) == newest) {
            return Ok(Err(serving));
        }
    }
    let report = app.registry.load(model, version)?.finished().await?;
    settle(app, Kind::Load, &report).await?;
    Ok(Ok(report))
}

/// Rolls back to the kept previous version and records it.
pub async fn rollback(app: &Arc<App>, model: &str) -> Result<LoadReport, ServeError> {
    let _working = begin(app, model).await?;
    refuse_if_pinned(app, model, "roll back")?;
    let report = app.registry.rollback(model)?.finished().await?;
    settle(app, Kind::Rollback, &report).await?;
    Ok(report)
}

/// Takes the model out of service and records that it stays out. `None`
/// when the model is known but was not loaded (not an error, and nothing
/// is recorded).
pub async fn unload(app: &Arc<App>, model: &str) -> Result<Option<LoadReport>, ServeError> {
    let _working = begin(app, model).await?;
    refuse_if_pinned(app, model, "unload")?;
    let report = match app.registry.unload(model) {
        Ok(handle) => handle.finished().await?,
        Err(LoadError::NotLoaded { .. }) if in_repository(app, model).await => return Ok(None),
        Err(LoadError::NotLoaded { .. }) => return Err(ServeError::unknown_model(model)),
        Err(e) => return Err(e.into()),
    };
    settle(app, Kind::Unload, &report).await?;
    Ok(Some(report))
}

/// The answer to a pin or unpin: the model, what serves, the decision in
/// force, and the report of the load it ran, if it ran one.
fn answer(app: &App, model: &str, report: Option<&LoadReport>) -> Value {
    let serving = app.registry.snapshot().model(model).map(|r| r.stable.number());
    json!({
        "model": model,
        "serving": serving,
        "decision": app.decisions.get(model).as_ref().map(view),
        "report": report,
    })
}

/// Pins `version`: loads it if it does not serve, then records the pin.
pub async fn pin(app: &Arc<App>, model: &str, version: u64) -> Result<Value, ServeError> {
    let _working = begin(app, model).await?;
    let listed = {
        let (app, model) = (Arc::clone(app), model.to_owned());
        blocking(move || app.registry.source().versions(&model)).await
    };
    let versions = listed.map_err(|e| match e {
        FetchError::ModelNotFound { .. } => ServeError::unknown_model(model),
        other => LoadError::Fetch(other).into(),
    })?;
    if !versions.contains(&version) {
        let listed: Vec<String> = versions.iter().map(u64::to_string).collect();
        return Err(ServeError::new(
            Class::NotFound,
            "version_not_found",
            format!(
                "version {version} of model '{model}' is not in the repository (it has: {})",
                if listed.is_empty() { "none".to_owned() } else { listed.join(", ") }
            ),
        ));
    }
    let serving = app.registry.snapshot().model(model).map(|r| r.stable.number());
    let report =
        if serving == Some(version) { None } else { Some(app.registry.load(model, Some(version))?.finished().await?) };
    let decision = Decision { kind: Kind::Pin, version: Some(version), at: now(), yields_to: None, rollout: None };
    let (shared, name) = (Arc::clone(app), model.to_owned());
    blocking(move || shared.decisions.apply(&shared.registry, &name, Change::Recorded(decision)))
        .await
        .map_err(|e| not_recorded("pin", &e))?;
    Ok(answer(app, model, report.as_ref()))
}

/// Removes a pin and returns the model to the newest version, loading it
/// if it does not serve. The pin is removed first: a newest version that
/// is refused is answered with the refusal, and the pinned version serves
/// until another loads. Unpinning a model that is not pinned changes
/// nothing.
pub async fn unpin(app: &Arc<App>, model: &str) -> Result<Value, ServeError> {
    let _working = begin(app, model).await?;
    if app.decisions.get(model).is_none_or(|d| d.kind != Kind::Pin) {
        if app.registry.status(model).is_none() && !in_repository(app, model).await {
            return Err(ServeError::unknown_model(model));
        }
        return Ok(answer(app, model, None));
    }
    let newest = {
        let (app, name) = (Arc::clone(app), model.to_owned());
        blocking(move || {
            app.decisions.apply(&app.registry, &name, Change::Removed)?;
            Ok::<_, StateError>(newest(&app, &name))
        })
        .await
        .map_err(|e| not_recorded("unpin", &e))?
    };
    let serving = app.registry.snapshot().model(model).map(|r| r.stable.number());
    let report = if newest.is_some() && serving != newest {
        Some(app.registry.load(model, newest)?.finished().await?)
    } else {
        None
    };
    Ok(answer(app, model, report.as_ref()))
}
