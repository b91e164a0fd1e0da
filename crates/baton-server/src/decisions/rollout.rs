//! The rollout operations as REST, gRPC and the CLI run them: start, status,
//! pause, resume, promote, abort. Each answers with the rollout's status.
//! What a rollout has reached is kept in the state file (see
//! [`super::Decisions`]) so that a restart resumes it rather than swapping
//! the candidate in for all traffic.

use std::sync::Arc;

use baton_core::registry::load::RolloutStart;
use baton_core::rollout::plan::Overrides;
use serde_json::{Value, json};

use crate::app::App;
use crate::error::{Class, ServeError};

/// The answer to every rollout operation: the model, what serves, and the
/// rollout (in progress, or the last one that ended).
pub fn view(app: &App, model: &str) -> Value {
    let serving = app.registry.snapshot().model(model).map(|r| r.stable.number());
    let mut view = json!({ "model": model, "serving": serving, "rollout": app.registry.rollout(model) });
    if let Some(rollout) = view.get_mut("rollout") {
        crate::status::add_rollout_times(rollout);
    }
    view
}

/// Starts a rollout of `version` (the newest when `None`) and answers once
/// the candidate has gone through the load transaction and takes its first
/// share.
pub async fn start(
    app: &Arc<App>,
    model: &str,
    version: Option<u64>,
    overrides: Overrides,
) -> Result<Value, ServeError> {
    let _working = super::operate::claim(app, model, "roll out").await?;
    let start = RolloutStart { version, overrides, ..RolloutStart::default() };
    app.registry.start_rollout(model, start)?.finished().await?;
    super::journal::record(app, model).await?;
    Ok(view(app, model))
}

/// The rollout of `model`; not found when it never had one.
pub fn status(app: &App, model: &str) -> Result<Value, ServeError> {
    match app.registry.rollout(model) {
        Some(_) => Ok(view(app, model)),
        None => Err(ServeError::new(
            Class::NotFound,
            "no_rollout",
            format!("model '{model}' has had no rollout since the server started"),
        )),
    }
}

/// Pauses the rollout: the candidate keeps its share, windows are not
/// judged.
pub async fn pause(app: &Arc<App>, model: &str, reason: Option<String>) -> Result<Value, ServeError> {
    let reason = reason.unwrap_or_else(|| "paused by an operator".to_owned());
    app.registry.pause_rollout(model, &reason)?;
    super::journal::record(app, model).await?;
    Ok(view(app, model))
}

/// Resumes a paused rollout.
pub async fn resume(app: &Arc<App>, model: &str) -> Result<Value, ServeError> {
    app.registry.resume_rollout(model)?;
    super::journal::record(app, model).await?;
    Ok(view(app, model))
}

/// Promotes the candidate now.
pub async fn promote(app: &Arc<App>, model: &str) -> Result<Value, ServeError> {
    let _working = super::operate::claim(app, model, "promote").await?;
    app.registry.promote_rollout(model)?.finished().await?;
    super::journal::record(app, model).await?;
    Ok(view(app, model))
}

/// Aborts the rollout: the candidate leaves traffic now.
pub async fn abort(app: &Arc<App>, model: &str) -> Result<Value, ServeError> {
    let _working = super::operate::claim(app, model, "abort").await?;
    app.registry.abort_rollout(model)?.finished().await?;
    super::journal::record(app, model).await?;
    Ok(view(app, model))
}
