//! Rollouts over gRPC: the start message read into the same request REST
//! reads ([`crate::rollout_start`]), and the status answer as a message
//! with a few typed fields beside the REST JSON.

use baton_core::rollout::plan::Overrides;
use serde_json::Value;

use super::pb_baton::{RolloutResponse, RolloutStartRequest};
use crate::error::ServeError;
use crate::rollout_start::{self, StartRequest};

/// The start request a message asks for; refused as REST refuses its body.
pub fn start_request(message: RolloutStartRequest) -> Result<StartRequest, ServeError> {
    let overrides = Overrides {
        mode: message.mode.as_deref().map(rollout_start::mode).transpose()?,
        steps: (!message.steps.is_empty()).then_some(message.steps),
        interval_ms: message.interval_ms,
        failure_limit: message.failure_limit,
        max_inconclusive: message.max_inconclusive,
        paired: message.paired,
        watch_ms: message.watch_ms,
        guards: message.guards_json.as_deref().map(rollout_start::guards).transpose()?,
    };
    rollout_start::checked(StartRequest { version: message.version, overrides })
}

/// The answer of a rollout operation (`{"model", "serving", "rollout"}`)
/// as a message.
pub fn response(answer: &Value) -> RolloutResponse {
    let rollout = &answer["rollout"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    RolloutResponse {
        model: text(&answer["model"]),
        serving: answer["serving"].as_u64(),
        candidate: rollout["candidate"].as_u64(),
        phase: text(&rollout["phase"]),
        mode: text(&rollout["mode"]),
        weight_percent: rollout["weight_percent"].as_f64().unwrap_or_default(),
        step: rollout["step"].as_u64().unwrap_or_default(),
        status_json: answer.to_string(),
    }
}
