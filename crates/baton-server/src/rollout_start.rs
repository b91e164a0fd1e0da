//! What an operator asks for when starting a rollout, as the REST body and
//! the gRPC message carry it: the candidate version and the overrides of
//! the model's `[rollout]` section. Checked here, before the candidate goes
//! through the load transaction, so that a plan that cannot run is refused
//! at once rather than after a load.

use baton_core::files::rollout_spec::{Guards, Mode, RolloutPolicy};
use baton_core::rollout::plan::{Overrides, Plan};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ServeError;

/// The kind of every refusal of a start request that parses but asks for
/// something a rollout cannot do, or names a field baton does not know.
pub const INVALID: &str = "invalid_rollout";

/// A rollout to start: the candidate (the newest version when `None`) and
/// what overrides the model's `[rollout]` section.
#[derive(Debug, Default)]
pub struct StartRequest {
    /// The candidate.
    pub version: Option<u64>,
    /// The overrides.
    pub overrides: Overrides,
}

/// The fields of the JSON body of `POST /baton/v1/models/{m}/rollout`.
const FIELDS: [&str; 9] =
    ["version", "mode", "steps", "interval_ms", "failure_limit", "max_inconclusive", "paired", "watch_ms", "guards"];

/// Reads a start request from a JSON body; an empty body asks for the
/// newest version with the model's own section. Malformed JSON is
/// `invalid_json`; a body that is not an object, an unknown field, a value
/// of the wrong type or a plan that cannot run is [`INVALID`]; both are
/// 400 and say what is wrong, naming the field.
pub fn from_json(body: &[u8]) -> Result<StartRequest, ServeError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(StartRequest::default());
    }
    let body: Value = serde_json::from_slice(body)
        .map_err(|e| ServeError::bad_request("invalid_json", format!("rollout request body: {e}")))?;
    let Value::Object(fields) = body else {
        return Err(ServeError::bad_request(INVALID, "the rollout request body must be a JSON object"));
    };
    let mut request = StartRequest::default();
    let o = &mut request.overrides;
    for (name, value) in fields {
        match name.as_str() {
            "version" => request.version = field(&name, value)?,
            "mode" => o.mode = field(&name, value)?,
            "steps" => o.steps = field(&name, value)?,
            "interval_ms" => o.interval_ms = field(&name, value)?,
            "failure_limit" => o.failure_limit = field(&name, value)?,
            "max_inconclusive" => o.max_inconclusive = field(&name, value)?,
            "paired" => o.paired = field(&name, value)?,
            "watch_ms" => o.watch_ms = field(&name, value)?,
            "guards" => o.guards = field(&name, value)?,
            other => {
                return Err(ServeError::bad_request(
                    INVALID,
                    format!("unknown rollout request field '{other}'; the fields are {}", FIELDS.join(", ")),
                ));
            }
        }
    }
    checked(request)
}

/// One field of the body, read as its type.
fn field<T: DeserializeOwned>(name: &str, value: Value) -> Result<T, ServeError> {
    serde_json::from_value(value)
        .map_err(|e| ServeError::bad_request(INVALID, format!("rollout request field '{name}': {e}")))
}

/// Parses a mode name, refusing an unknown one with the names baton takes.
pub fn mode(text: &str) -> Result<Mode, ServeError> {
    Mode::parse(text).ok_or_else(|| {
        ServeError::bad_request(INVALID, format!("unknown rollout mode '{text}': use canary, ab or shadow"))
    })
}

/// Parses guards written as a JSON object (the `[rollout.guards]` fields).
pub fn guards(text: &str) -> Result<Guards, ServeError> {
    serde_json::from_str(text).map_err(|e| ServeError::bad_request(INVALID, format!("rollout guards: {e}")))
}

/// The request, if every value it overrides can make a plan. A value left
/// unset comes from the model's section, which the load transaction checks
/// when it reads it; the default section stands in for it here, and every
/// default is valid, so only what the operator gave is judged.
pub fn checked(request: StartRequest) -> Result<StartRequest, ServeError> {
    Plan::new(&RolloutPolicy::default(), &request.overrides)
        .map_err(|e| ServeError::bad_request(INVALID, e.to_string()))?;
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(body: &str) -> &'static str {
        from_json(body.as_bytes()).err().map_or("ok", |e| e.kind)
    }

    #[test]
    fn bodies_map_onto_the_overrides() {
        let request = from_json(
            br#"{"version": 2, "mode": "ab", "steps": [1, 5], "interval_ms": 1000, "paired": false,
                 "guards": {"max_rel_l2": 0.05, "min_samples": 20}}"#,
        )
        .unwrap();
        assert_eq!(request.version, Some(2));
        assert_eq!(request.overrides.mode, Some(Mode::Ab));
        assert_eq!(request.overrides.steps, Some(vec![1.0, 5.0]));
        assert_eq!(request.overrides.paired, Some(false));
        let guards = request.overrides.guards.unwrap();
        assert_eq!((guards.max_rel_l2, guards.min_samples), (Some(0.05), 20));
        assert_eq!(from_json(b" ").unwrap().overrides, Overrides::default());
    }

    #[test]
    fn malformed_bodies_say_what_is_wrong() {
        assert_eq!(kind("{"), "invalid_json");
        assert_eq!(kind(r#"{"versoin": 2}"#), INVALID);
        assert_eq!(kind(r#"{"mode": "blue"}"#), INVALID);
        assert_eq!(kind(r#"{"steps": "1,5"}"#), INVALID);
        assert_eq!(kind(r#"{"steps": [5, 1]}"#), INVALID);
        assert_eq!(kind(r#"{"interval_ms": 1}"#), INVALID);
        assert_eq!(kind(r#"{"failure_limit": 0}"#), INVALID);
        assert_eq!(kind(r#"{"guards": {"max_rel": 1}}"#), INVALID);
        assert_eq!(kind("[1]"), INVALID);
        for (body, needle) in [(r#"{"versoin": 2}"#, "versoin"), (r#"{"steps": "1,5"}"#, "'steps'")] {
            let error = from_json(body.as_bytes()).unwrap_err();
            assert!(error.message.contains(needle), "{}", error.message);
        }
        assert_eq!(mode("shadow").unwrap(), Mode::Shadow);
        assert!(mode("blue").unwrap_err().message.contains("canary, ab or shadow"));
        assert!(guards("{\"nope\": 1}").is_err());
    }
}
