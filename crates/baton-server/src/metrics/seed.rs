//! The event counters of a model written at 0 as soon as the metrics know
//! the model: Prometheus's `increase()` and `rate()` see the first failed
//! load, rollback, update or rollout decision as a step from 0, where a
//! series that appeared at 1 would read as no change.

use baton_core::registry::events::Stage;
use baton_core::rollout::control::Action;
use baton_core::run::backend::UpdateReason;

use super::LoadMetrics;

/// Every stage a failure may name, every decision a rollout may take and
/// every kind of update with its reasons: the label values written at 0.
const SEEDED_STAGES: [Stage; 11] = [
    Stage::Config,
    Stage::Fetch,
    Stage::Verify,
    Stage::Vacate,
    Stage::Load,
    Stage::Validate,
    Stage::Warmup,
    Stage::Commit,
    Stage::Drain,
    Stage::Unload,
    Stage::Twin,
];
const SEEDED_DECISIONS: [Action; 9] = [
    Action::Started,
    Action::Advanced,
    Action::Held,
    Action::Promoted,
    Action::RolledBack,
    Action::Paused,
    Action::Resumed,
    Action::Aborted,
    Action::Watched,
];
const SEEDED_UPDATES: [UpdateReason; 5] = [
    UpdateReason::WeightsOnly,
    UpdateReason::NewGraph,
    UpdateReason::RuntimeLibrary,
    UpdateReason::OperatorChoice,
    UpdateReason::ProcessingOnly,
];

impl LoadMetrics {
    /// Writes the model's event counters at 0 the first time the model is
    /// seen, so that the first failed load, rollback, update or rollout
    /// decision is a change from 0 to 1 that `increase()` and `rate()`
    /// see, not a new series that starts at 1.
    pub(super) fn seed(&mut self, model: &str) {
        // Events about no model (the store's) name "".
        if model.is_empty() || self.seeded.contains(model) {
            return;
        }
        self.seeded.insert(model.to_owned());
        self.rollbacks.entry(model.to_owned()).or_default();
        for stage in SEEDED_STAGES {
            self.failures.entry((model.to_owned(), stage)).or_default();
        }
        for decision in SEEDED_DECISIONS {
            self.rollout_decisions.entry((model.to_owned(), decision.as_str())).or_default();
        }
        for reason in SEEDED_UPDATES {
            self.updates.entry((model.to_owned(), reason.kind().as_str(), reason.as_str())).or_default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_seeded_once_with_every_label_value_and_no_model_never() {
        let mut loads = LoadMetrics::default();
        loads.seed("");
        assert!(loads.rollbacks.is_empty() && loads.failures.is_empty() && loads.updates.is_empty());
        loads.seed("m");
        *loads.rollbacks.get_mut("m").expect("seeded") += 1;
        loads.seed("m");
        assert_eq!(loads.rollbacks["m"], 1, "a second seeding leaves the counts alone");
        assert_eq!(loads.failures.len(), SEEDED_STAGES.len());
        assert_eq!(loads.rollout_decisions.len(), SEEDED_DECISIONS.len());
        assert!(loads.updates.contains_key(&("m".to_owned(), "weights", "weights_only")));
        assert!(loads.updates.contains_key(&("m".to_owned(), "runtime", "operator_choice")));
        assert!(loads.updates.contains_key(&("m".to_owned(), "processing", "processing_only")));
        assert!(loads.failures.values().chain(loads.rollout_decisions.values()).all(|n| *n == 0));
    }
}
