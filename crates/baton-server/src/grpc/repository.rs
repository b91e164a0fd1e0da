//! The model repository extension over gRPC: index, load, unload, with the
//! same semantics as the REST endpoints under `/v2/repository`.

use std::collections::HashMap;

use super::pb::model_repository_parameter::ParameterChoice;
use super::pb::repository_index_response::ModelIndex;
use super::pb::{ModelRepositoryParameter, ModelStatistics};
use crate::app::App;
use crate::error::ServeError;

/// The index as gRPC messages; see [`crate::repository::index`].
pub fn index(app: &App, ready: bool) -> Result<Vec<ModelIndex>, ServeError> {
    Ok(crate::repository::index(app, ready)?
        .into_iter()
        .map(|r| ModelIndex {
            name: r.name,
            version: r.version.to_string(),
            state: r.state.to_owned(),
            reason: r.reason,
        })
        .collect())
}

/// The `version` load parameter, as an integer or a string; any other
/// parameter is refused, as over REST.
pub fn requested_version(parameters: &HashMap<String, ModelRepositoryParameter>) -> Result<Option<u64>, ServeError> {
    if let Some(other) = parameters.keys().find(|k| k.as_str() != "version") {
        return Err(ServeError::bad_request(
            "unsupported_parameter",
            format!("load parameter '{other}' is not supported; baton takes 'version'"),
        ));
    }
    let invalid =
        |shown: String| ServeError::bad_request("invalid_version", format!("version {shown} is not a version number"));
    match parameters.get("version").and_then(|p| p.parameter_choice.as_ref()) {
        None => Ok(None),
        Some(ParameterChoice::Int64Param(n)) => u64::try_from(*n).map(Some).map_err(|_| invalid(n.to_string())),
        Some(ParameterChoice::StringParam(s)) => crate::serving::parse_version(s).map(Some),
        Some(ParameterChoice::BoolParam(b)) => Err(invalid(b.to_string())),
        Some(ParameterChoice::BytesParam(_)) => Err(invalid("(bytes)".to_owned())),
    }
}

/// Loads the newest complete version (or the one named) and waits until the
/// swap, drain included, is done.
pub async fn load(
    app: &std::sync::Arc<App>,
    model: &str,
    version: Option<u64>,
) -> Result<baton_core::registry::events::LoadReport, ServeError> {
    crate::decisions::operate::load(app, model, version).await
}

/// Takes the model out of service and waits until it is drained; unloading
/// a model that is known but not loaded is not an error.
pub async fn unload(
    app: &std::sync::Arc<App>,
    model: &str,
    parameters: &HashMap<String, ModelRepositoryParameter>,
) -> Result<(), ServeError> {
    if let Some(other) = parameters.keys().find(|k| k.as_str() != "unload_dependents") {
        return Err(ServeError::bad_request(
            "unsupported_parameter",
            format!("unload parameter '{other}' is not supported"),
        ));
    }
    crate::decisions::operate::unload(app, model).await.map(drop)
}

/// Triton's statistics of every loaded version of the models asked for:
/// every model (`name` empty) or one, every version (`version` `None`) or
/// one. Counters come from the metrics both front ends feed.
pub fn statistics(app: &App, name: &str, version: Option<u64>) -> Result<Vec<ModelStatistics>, ServeError> {
    use super::pb::{InferStatistics, MemoryUsage, StatisticDuration};

    let snapshot = app.registry.snapshot();
    let mut targets = Vec::new();
    if name.is_empty() {
        for route in snapshot.models().values() {
            targets.extend(route.versions().filter(|v| version.is_none_or(|n| v.number() == n)).cloned());
        }
    } else if let Some(n) = version {
        targets.push(std::sync::Arc::clone(crate::serving::resolve(app, &snapshot, name, Some(n))?));
    } else {
        let route = snapshot.model(name).ok_or_else(|| crate::serving::not_serving(app, name))?;
        targets.extend(route.versions().cloned());
    }
    targets.sort_by(|a, b| (a.model(), a.number()).cmp(&(b.model(), b.number())));
    let duration = |count: u64, ns: u64| Some(StatisticDuration { count, ns });
    Ok(targets
        .iter()
        .map(|v| {
            let s = app.metrics.version_stats(v.model(), v.number());
            ModelStatistics {
                name: v.model().to_owned(),
                version: v.number().to_string(),
                last_inference: s.last_ms,
                inference_count: s.inferences,
                execution_count: s.successes,
                inference_stats: Some(InferStatistics {
                    success: duration(s.successes, s.success_nanos),
                    fail: duration(s.failures, s.failure_nanos),
                    queue: duration(s.successes, 0),
                    compute_input: duration(s.successes, 0),
                    compute_infer: duration(s.successes, s.success_nanos),
                    compute_output: duration(s.successes, 0),
                    cache_hit: duration(0, 0),
                    cache_miss: duration(0, 0),
                }),
                batch_stats: Vec::new(),
                memory_usage: vec![MemoryUsage { r#type: "CPU".to_owned(), id: 0, byte_size: v.bytes_held() }],
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Class;

    fn param(choice: ParameterChoice) -> HashMap<String, ModelRepositoryParameter> {
        HashMap::from([("version".to_owned(), ModelRepositoryParameter { parameter_choice: Some(choice) })])
    }

    #[test]
    fn the_version_parameter_takes_integers_and_strings() {
        assert_eq!(requested_version(&HashMap::new()).unwrap(), None);
        assert_eq!(requested_version(&param(ParameterChoice::Int64Param(2))).unwrap(), Some(2));
        assert_eq!(requested_version(&param(ParameterChoice::StringParam("3".into()))).unwrap(), Some(3));
        let e = requested_version(&param(ParameterChoice::Int64Param(-1))).unwrap_err();
        assert_eq!((e.kind, e.message.as_str()), ("invalid_version", "version -1 is not a version number"));
        let e = requested_version(&param(ParameterChoice::StringParam("x".into()))).unwrap_err();
        assert_eq!((e.kind, e.message.as_str()), ("invalid_version", "'x' is not a version number"));
        let config = HashMap::from([("config".to_owned(), ModelRepositoryParameter::default())]);
        let e = requested_version(&config).unwrap_err();
        assert_eq!((e.class, e.kind), (Class::BadRequest, "unsupported_parameter"));
    }
}
