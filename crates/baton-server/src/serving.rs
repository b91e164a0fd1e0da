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

/// Parses a version number as a client writes it: a path segment, a gRPC
/// field or a load parameter.
pub fn parse_version(text: &str) -> Result<u64, ServeError> {
    text.parse().map_err(|_| ServeError::bad_request("invalid_version", format!("'{text}' is not a version number")))
}

/// The largest batch a version accepts; 0 when the model does not batch.
pub fn max_batch_size(version: &Version) -> usize {
    if version.signature().is_batched() { version.spec().max_batch_size.unwrap_or(DEFAULT_MAX_BATCH_SIZE) } else { 0 }
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

fn check_batch(target: &Version, max: usize, inputs: &[Tensor]) -> Result<(), ServeError> {
    if max == 0 {
        return Ok(());
    }
    for input in inputs {
        // Only a tensor that otherwise fits has a batch size to speak of; for
        // any other (wrong rank, width or name) the signature check says
        // precisely what is wrong.
        let fits = target.signature().input(&input.name).is_some_and(|spec| spec.accepts(&input.shape));
        if fits
            && let Some(&batch) = input.shape.first()
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

/// The number of inferences a request asks for: its batch size when the
/// model batches (`max` > 0), else 1.
fn batch_size(max: usize, inputs: &[Tensor]) -> u64 {
    if max == 0 {
        return 1;
    }
    inputs.first().and_then(|t| t.shape.first()).map_or(1, |&b| u64::try_from(b).unwrap_or(0))
}

/// Runs an unbatched inference: inline, or with `block_in_place` for a heavy
/// model (see [`baton_core::batcher::HEAVY_INFERENCE`]).
fn run(target: &Version, inputs: &[Tensor]) -> Result<Vec<Tensor>, baton_core::error::InferError> {
    baton_core::batcher::run_inference(target.heavy(), || target.infer(inputs))
}

/// Runs one inference on the version the snapshot routes `model` (and
/// `version`, if named) to — through the version's batcher when it batches
/// — and counts it in the metrics either way.
pub async fn infer<'a>(
    app: &App,
    snapshot: &'a Routing,
    model: &str,
    version: Option<u64>,
    inputs: Vec<Tensor>,
) -> Result<(&'a Arc<Version>, Vec<Tensor>), ServeError> {
    let resolved = resolve(app, snapshot, model, version).and_then(|t| {
        let max = max_batch_size(t);
        check_batch(t, max, &inputs).map(|()| (t, max))
    });
    let (target, max) = resolved.inspect_err(|e| app.metrics.rejected(model, e.kind))?;
    let series = app.metrics.version(model, target.number());
    let rows = batch_size(max, &inputs);
    let started = Instant::now();
    let outcome = if target.batches() {
        match target.submit(inputs) {
            Ok(pending) => pending.await,
            Err(e) => Err(e),
        }
    } else {
        run(target, &inputs)
    };
    let outcome = outcome.map_err(ServeError::from);
    series.record(started.elapsed(), rows, outcome.as_ref().err().map(|e| e.kind));
    Ok((target, outcome?))
}
