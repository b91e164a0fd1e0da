//! The serving path both front ends share: resolve the version a request
//! names in its snapshot, check the batch, run, count. Protocol front ends
//! only decode and encode around it.

use std::sync::Arc;
use std::time::Instant;

use baton_core::error::InferError;
use baton_core::routing::Routing;
use baton_core::tensor::Tensor;
use baton_core::version::Version;

use crate::app::App;
use crate::error::{Class, ServeError};

/// `max_batch_size` when `model.toml` sets none and the model batches.
pub const DEFAULT_MAX_BATCH_SIZE: usize = 1024;

/// The largest batch a version accepts; 0 when the model does not batch.
pub fn max_batch_size(version: &Version) -> usize {
    if baton_kserve::is_batched(version.signature()) {
        version.spec().max_batch_size.unwrap_or(DEFAULT_MAX_BATCH_SIZE)
    } else {
        0
    }
}

/// The platform and backend names Triton clients expect.
pub fn platform(version: &Version) -> (&'static str, String) {
    match version.spec().backend.as_str() {
        "onnx" => ("onnxruntime_onnx", "onnxruntime".to_owned()),
        other => ("baton", other.to_owned()),
    }
}

/// The version a request names, or why it cannot be served: not found for
/// a model or version baton does not know, unavailable for one that is not
/// loaded yet.
pub fn resolve<'a>(
    app: &App,
    snapshot: &'a Routing,
    model: &str,
    version: Option<u64>,
) -> Result<&'a Arc<Version>, ServeError> {
    match snapshot.resolve(model, version) {
        Ok(v) => Ok(v),
        Err(InferError::ModelNotFound(_)) => Err(not_serving(app, model)),
        Err(e) => Err(e.into()),
    }
}

/// The error for a model with no route: known but not (yet) serving is
/// unavailable, unknown is not found.
pub fn not_serving(app: &App, model: &str) -> ServeError {
    let state = app.registry.status(model).map(|s| s.state.as_str());
    let known = state.is_some() || app.registry.source().spec(model).is_ok();
    if known {
        let state = state.unwrap_or("IDLE");
        ServeError::new(Class::Unavailable, "model_not_ready", format!("model '{model}' is not ready (state {state})"))
    } else {
        ServeError::unknown_model(model)
    }
}

fn check_batch(target: &Version, inputs: &[Tensor]) -> Result<(), ServeError> {
    let max = max_batch_size(target);
    if max == 0 {
        return Ok(());
    }
    for input in inputs {
        if let Some(&batch) = input.shape.first()
            && batch > max as i64
        {
            return Err(ServeError::bad_request(
                "batch_too_large",
                format!("input '{}': batch size {batch} exceeds the model's max_batch_size {max}", input.name),
            ));
        }
    }
    Ok(())
}

/// Runs one inference on the version the snapshot routes `model` (and
/// `version`, if named) to. Counts it in the metrics either way.
pub fn infer<'a>(
    app: &App,
    snapshot: &'a Routing,
    model: &str,
    version: Option<u64>,
    inputs: &[Tensor],
) -> Result<(&'a Arc<Version>, Vec<Tensor>), ServeError> {
    let target = resolve(app, snapshot, model, version).and_then(|t| check_batch(t, inputs).map(|()| t));
    let target = target.inspect_err(|e| app.metrics.rejected(model, e.kind))?;
    let series = app.metrics.version(model, target.number());
    let started = Instant::now();
    let outcome = target.infer(inputs).map_err(ServeError::from);
    series.record(started.elapsed(), outcome.as_ref().err().map(|e| e.kind));
    Ok((target, outcome?))
}
