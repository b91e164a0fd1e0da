//! How a rollout proceeds: `model.toml`'s `[rollout]` section, and the plan
//! a rollout runs by (the section, with whatever the operator overrode when
//! starting it).
//!
//! ```toml
//! [rollout]
//! auto = false               # a newly published version starts a rollout, not a full swap
//! mode = "canary"            # canary | ab | shadow
//! steps = [1, 5, 25, 50, 100] # percent of traffic (ab and shadow hold the first)
//! interval_ms = 30000        # one window: judged at its end
//! failure_limit = 1          # failed windows that roll the candidate back
//! max_inconclusive = 10      # inconclusive windows in a row that pause the rollout
//! paired = true              # canary/ab: also run answered requests on stable, off the response path, to compare
//! queue = 64                 # comparison copies waiting at most; more are dropped and counted
//! watch_ms = 300000          # after promotion, keep judging against the old version this long; 0: no watch
//! twin_max_mb = 256          # paired copies run on a twin of stable when stable holds at most this; 0: never
//!
//! [rollout.guards]           # see Guards
//! min_samples = 100
//! max_error_rate_increase = 0.01
//! max_p99_ratio = 1.5
//! max_rel_l2 = 0.05
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::FULL;
use crate::files::rollout_spec::{Guards, Mode, RolloutPolicy};

/// What an operator may override when starting a rollout; unset fields
/// come from the model's `[rollout]` section.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Overrides {
    /// The mode.
    pub mode: Option<Mode>,
    /// The steps, in percent.
    pub steps: Option<Vec<f64>>,
    /// The window length, in milliseconds.
    pub interval_ms: Option<u64>,
    /// Failed windows that roll back.
    pub failure_limit: Option<u32>,
    /// Inconclusive windows in a row that pause.
    pub max_inconclusive: Option<u32>,
    /// Whether answered requests are paired with the stable version.
    pub paired: Option<bool>,
    /// The watch after promotion, in milliseconds.
    pub watch_ms: Option<u64>,
    /// The guards, whole.
    pub guards: Option<Guards>,
}

/// A plan as status and events show it: `steps` in percent, as
/// `[rollout] steps`, a start request and `weight_percent` say shares. The
/// plan itself keeps basis points, and so does the state file it is
/// restored from.
#[derive(Serialize)]
struct PlanInPercent<'a> {
    mode: Mode,
    steps: Vec<f64>,
    interval_ms: u64,
    failure_limit: u32,
    max_inconclusive: u32,
    paired: bool,
    queue: usize,
    watch_ms: u64,
    guards: &'a Guards,
}

/// Serializes a plan with its steps in percent (`serialize_with`).
pub fn in_percent<S: serde::Serializer>(plan: &Plan, serializer: S) -> Result<S::Ok, S::Error> {
    PlanInPercent {
        mode: plan.mode,
        steps: plan.steps.iter().map(|&bp| super::control::percent(bp)).collect(),
        interval_ms: plan.interval_ms,
        failure_limit: plan.failure_limit,
        max_inconclusive: plan.max_inconclusive,
        paired: plan.paired,
        queue: plan.queue,
        watch_ms: plan.watch_ms,
        guards: &plan.guards,
    }
    .serialize(serializer)
}

/// The plan one rollout runs by.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The mode.
    pub mode: Mode,
    /// The candidate's share at each step, in basis points.
    pub steps: Vec<u32>,
    /// The window length, in milliseconds.
    pub interval_ms: u64,
    /// Failed windows that roll back.
    pub failure_limit: u32,
    /// Inconclusive windows in a row that pause.
    pub max_inconclusive: u32,
    /// Whether answered requests are paired with the stable version.
    pub paired: bool,
    /// Comparison copies that may wait.
    pub queue: usize,
    /// The watch after promotion, in milliseconds (0: none).
    #[serde(default)]
    pub watch_ms: u64,
    /// What each window is held to.
    pub guards: Guards,
}

/// Why a plan cannot run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid rollout plan: {0}")]
pub struct PlanError(pub String);

impl Plan {
    /// The plan `policy` makes with `overrides` applied, checked.
    pub fn new(policy: &RolloutPolicy, overrides: &Overrides) -> Result<Plan, PlanError> {
        let percents = overrides.steps.as_ref().unwrap_or(&policy.steps);
        let mut steps = Vec::with_capacity(percents.len());
        for &p in percents {
            if !(p.is_finite() && p > 0.0 && p <= 100.0) {
                return Err(PlanError(format!("a step must be a percentage above 0 and at most 100, not {p}")));
            }
            let bp = (p * f64::from(FULL) / 100.0).round() as u32;
            if steps.last().is_some_and(|&last| bp <= last) {
                return Err(PlanError(format!("steps must rise; {p}% does not rise above the step before")));
            }
            steps.push(bp.max(1));
        }
        if steps.is_empty() {
            return Err(PlanError("a rollout needs at least one step".to_owned()));
        }
        let plan = Plan {
            mode: overrides.mode.unwrap_or(policy.mode),
            steps,
            interval_ms: overrides.interval_ms.unwrap_or(policy.interval_ms),
            failure_limit: overrides.failure_limit.unwrap_or(policy.failure_limit),
            max_inconclusive: overrides.max_inconclusive.unwrap_or(policy.max_inconclusive),
            paired: overrides.paired.unwrap_or(policy.paired),
            queue: policy.queue,
            watch_ms: overrides.watch_ms.unwrap_or(policy.watch_ms),
            guards: overrides.guards.clone().unwrap_or_else(|| policy.guards.clone()),
        };
        plan.check(false)?;
        Ok(plan)
    }

    /// Refuses a plan that cannot run, wherever it comes from: an
    /// operator's request, the model's section, the state file a restart
    /// reads, or a fleet's coordinator. Only a `steered` plan (a fleet's)
    /// may start at 0 %: the coordinator raises it.
    pub fn check(&self, steered: bool) -> Result<(), PlanError> {
        let Some(&first) = self.steps.first() else {
            return Err(PlanError("a rollout needs at least one step".to_owned()));
        };
        if first == 0 && !steered {
            return Err(PlanError("the first step must be above 0 %".to_owned()));
        }
        for pair in self.steps.windows(2) {
            if pair[1] <= pair[0] {
                return Err(PlanError(format!(
                    "steps must rise: {}% after {}% would move users back to the stable version",
                    super::control::percent(pair[1]),
                    super::control::percent(pair[0])
                )));
            }
        }
        if self.steps.iter().any(|&s| s > FULL) {
            return Err(PlanError("a step may not exceed 100 %".to_owned()));
        }
        if self.interval_ms < 10 {
            return Err(PlanError(format!("interval_ms must be at least 10, not {}", self.interval_ms)));
        }
        if self.failure_limit == 0 || self.max_inconclusive == 0 {
            return Err(PlanError("failure_limit and max_inconclusive must be at least 1".to_owned()));
        }
        if self.queue == 0 {
            return Err(PlanError("queue must be at least 1".to_owned()));
        }
        // At 100 % the stable version answers nothing: without paired
        // copies there is no stable side to judge the candidate against.
        if !self.paired && self.mode != Mode::Shadow && self.steps.contains(&FULL) {
            return Err(PlanError(
                "an unpaired canary or A/B rollout cannot be judged at a step of 100 %, where the stable \
                 version answers nothing; set paired = true or stop below 100 %"
                    .to_owned(),
            ));
        }
        self.guards.check().map_err(PlanError)
    }

    /// The window length.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }

    /// The watch after promotion, if any.
    pub fn watch(&self) -> Option<Duration> {
        (self.watch_ms > 0).then(|| Duration::from_millis(self.watch_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_become_basis_points_and_must_rise() {
        let policy = RolloutPolicy::default();
        let plan = Plan::new(&policy, &Overrides::default()).unwrap();
        assert_eq!(plan.steps, vec![100, 500, 2500, 5000, 10_000]);
        let falling = Overrides { steps: Some(vec![10.0, 5.0]), ..Overrides::default() };
        assert!(Plan::new(&policy, &falling).is_err());
        let zero = Overrides { steps: Some(vec![0.0]), ..Overrides::default() };
        assert!(Plan::new(&policy, &zero).is_err());
        let nan = Overrides { steps: Some(vec![f64::NAN]), ..Overrides::default() };
        assert!(Plan::new(&policy, &nan).is_err());
    }

    #[test]
    fn the_section_parses_with_guards() {
        let text = "mode = \"shadow\"\nsteps = [100]\n[guards]\nmax_rel_l2 = 0.05\nmin_samples = 20\n";
        let policy: RolloutPolicy = toml::from_str(text).unwrap();
        assert_eq!(policy.mode, Mode::Shadow);
        assert_eq!(policy.guards.max_rel_l2, Some(0.05));
        assert_eq!(policy.guards.min_samples, 20);
        assert_eq!(policy.guards.max_p99_ratio, Some(1.5));
    }

    #[test]
    fn status_shows_every_field_of_the_plan_with_steps_in_percent() {
        let plan = Plan::new(&RolloutPolicy::default(), &Overrides::default()).unwrap();
        let kept = serde_json::to_value(&plan).unwrap();
        let shown = in_percent(&plan, serde_json::value::Serializer).unwrap();
        let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&kept), keys(&shown), "the view leaves no field of the plan out");
        assert_eq!(kept["steps"], serde_json::json!([100, 500, 2500, 5000, 10_000]));
        assert_eq!(shown["steps"], serde_json::json!([1.0, 5.0, 25.0, 50.0, 100.0]));
    }
}
