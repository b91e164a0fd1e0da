//! The records a fleet keeps in etcd, as JSON.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use baton_core::files::rollout_spec::Guards;
use baton_core::rollout::guard::Verdict;
use baton_core::rollout::window::Sums;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// Fields of a record this baton does not know, written by a newer one:
/// kept, so that rewriting the record does not drop them.
pub type Unknown = BTreeMap<String, Value>;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    now_us() / 1000
}

/// Microseconds since the Unix epoch, now: the clock replicas stamp their
/// switches with (one clock when they share a host; NTP's accuracy across
/// hosts).
pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// A live replica, under its lease.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReplicaRecord {
    /// Its ID (a pod name, a host name).
    pub id: String,
    /// Where it serves inference.
    pub address: String,
    /// Its labels, for gray release by selector.
    pub labels: BTreeMap<String, String>,
    /// What it serves, per model.
    pub models: BTreeMap<String, Serving>,
    /// Whether it serves what the fleet committed.
    pub ready: bool,
    /// A sidecar agent speaking for another server, rather than a baton
    /// replica.
    pub agent: bool,
    /// Why it does not serve what the fleet committed, when it does not
    /// (a load under way, a switch retried).
    pub note: Option<String>,
    /// When it registered.
    pub since_ms: u64,
}

/// What a replica serves of one model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Serving {
    /// The stable version.
    pub stable: Option<u64>,
    /// The candidate prepared or committed beside it.
    pub candidate: Option<u64>,
    /// The candidate's share of this replica's traffic, in percent.
    pub candidate_percent: f64,
}

/// The version the fleet committed for a model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Desired {
    /// The version every replica serves.
    pub version: u64,
    /// The rollout that committed it; none when a replica seeded it.
    pub rollout: Option<u64>,
    /// When it was written.
    pub at_ms: u64,
}

/// The default lead from the commit write to the switch: long enough for
/// the commit to reach every replica of a fleet of hundreds under load
/// (docs/BENCHMARKS.md), short next to any prepare.
pub const DEFAULT_SWITCH_LEAD_MS: u64 = 250;

/// How a fleet rollout proceeds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FleetPlan {
    /// Replicas committed at each step, in percent of the participants;
    /// the last is 100 (every replica promotes). `[100]` is a plain
    /// two-phase commit.
    pub steps: Vec<f64>,
    /// Labels that pick the first step's replicas instead of a share.
    pub selector: BTreeMap<String, String>,
    /// How long the committed subset is observed before it is judged.
    pub interval_ms: u64,
    /// How long replicas have to prepare before the rollout aborts.
    pub prepare_timeout_ms: u64,
    /// Failed judgements that roll the subset back.
    pub failure_limit: u32,
    /// Inconclusive judgements in a row that pause the rollout.
    pub max_inconclusive: u32,
    /// Participants that may be lost (or fail to prepare) before the
    /// commit without aborting: they are left out and converge later.
    pub allow_missing: usize,
    /// What the subset is held to, over the fleet's merged observations.
    pub guards: PlanGuards,
    /// How long after the commit write every replica switches, at one
    /// instant on its clock, rather than each when its watch delivers the
    /// commit: replicas then switch together however unevenly the commit
    /// reaches them. 0 switches on delivery.
    pub switch_lead_ms: u64,
    /// Fields of a newer baton's plan.
    #[serde(flatten)]
    pub unknown: Unknown,
}

impl Default for FleetPlan {
    fn default() -> Self {
        FleetPlan {
            steps: vec![100.0],
            selector: BTreeMap::new(),
            interval_ms: 30_000,
            prepare_timeout_ms: 120_000,
            failure_limit: 1,
            max_inconclusive: 10,
            allow_missing: 0,
            guards: PlanGuards::default(),
            switch_lead_ms: DEFAULT_SWITCH_LEAD_MS,
            unknown: Unknown::new(),
        }
    }
}

impl FleetPlan {
    /// Refuses a plan that cannot run.
    pub fn check(&self) -> Result<(), String> {
        if self.steps.is_empty() {
            return Err("a plan needs at least one step".into());
        }
        let mut last = 0.0;
        for &step in &self.steps {
            if !(step > last && step <= 100.0) {
                return Err(format!("steps must rise within (0, 100]: {:?}", self.steps));
            }
            last = step;
        }
        if last != 100.0 {
            return Err(format!("the last step must be 100 (every replica): {:?}", self.steps));
        }
        if self.interval_ms == 0 || self.prepare_timeout_ms == 0 {
            return Err("the interval and the prepare timeout must be above 0".into());
        }
        if self.failure_limit == 0 || self.max_inconclusive == 0 {
            return Err("failure_limit and max_inconclusive must be at least 1".into());
        }
        if !self.guards.known.metrics.is_empty() {
            // The coordinator has no Prometheus to ask.
            return Err("metric guards are not judged in a fleet's rollouts yet; drop guards.metrics".into());
        }
        self.guards.known.check()
    }
}

/// A plan's guards as a newer baton may write them: the guards this baton
/// knows, each read as it would be from a model's configuration, and the
/// others kept aside, unjudged (the newer coordinator that wrote them
/// judges them), and written back where they were when the plan is
/// rewritten.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanGuards {
    /// The guards this baton judges.
    pub known: Guards,
    /// A newer baton's guards.
    pub unknown: Unknown,
}

impl From<Guards> for PlanGuards {
    fn from(known: Guards) -> Self {
        PlanGuards { known, unknown: Unknown::new() }
    }
}

impl Serialize for PlanGuards {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut fields = match serde_json::to_value(&self.known).map_err(serde::ser::Error::custom)? {
            Value::Object(fields) => fields,
            _ => return Err(serde::ser::Error::custom("guards are not a JSON object")),
        };
        for (name, value) in &self.unknown {
            // A field this baton knows is written as this baton holds it.
            fields.entry(name.clone()).or_insert_with(|| value.clone());
        }
        fields.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for PlanGuards {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = serde_json::Map::deserialize(deserializer)?;
        let names = serde_json::to_value(Guards::default()).map_err(serde::de::Error::custom)?;
        let names = names.as_object().ok_or_else(|| serde::de::Error::custom("guards are not a JSON object"))?;
        let mut unknown = Unknown::new();
        fields.retain(|name, value| {
            let known = names.contains_key(name);
            if !known {
                unknown.insert(name.clone(), value.take());
            }
            known
        });
        let known = serde_json::from_value(Value::Object(fields)).map_err(serde::de::Error::custom)?;
        Ok(PlanGuards { known, unknown })
    }
}

/// Where a fleet rollout stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FleetPhase {
    /// Participants prepare the candidate beside their stable version,
    /// with no traffic.
    Preparing,
    /// A subset of the replicas serves the candidate and is being judged.
    Committed,
    /// Every replica promotes the candidate; the fleet committed it.
    Promoted,
    /// The guards failed: the subset went back to the stable version.
    RolledBack,
    /// Stopped before any switch, or by an operator: every replica drops
    /// the candidate.
    Aborted,
}

impl FleetPhase {
    /// Whether the rollout is still in progress.
    pub fn in_progress(self) -> bool {
        matches!(self, FleetPhase::Preparing | FleetPhase::Committed)
    }

    /// The name, as in metrics and events.
    pub fn as_str(self) -> &'static str {
        match self {
            FleetPhase::Preparing => "preparing",
            FleetPhase::Committed => "committed",
            FleetPhase::Promoted => "promoted",
            FleetPhase::RolledBack => "rolled_back",
            FleetPhase::Aborted => "aborted",
        }
    }
}

/// One fleet rollout: the coordinator's whole state. Whoever coordinates
/// reads it, decides, and writes the next state with a compare-and-swap,
/// so a coordinator that dies is replaced without losing anything.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    /// Unique per rollout (microseconds since the epoch when it began).
    pub id: u64,
    /// The model.
    pub model: String,
    /// The candidate.
    pub version: u64,
    /// The version the fleet served when it began.
    pub from: Option<u64>,
    /// How it proceeds.
    pub plan: FleetPlan,
    /// The replicas taking part, fixed when it began.
    pub participants: Vec<String>,
    /// Participants left out (lost or failed to prepare, within
    /// `allow_missing`).
    #[serde(default)]
    pub missing: Vec<String>,
    /// Where it stands.
    pub phase: FleetPhase,
    /// The step committed (0-based), once committed.
    pub step: Option<usize>,
    /// The replicas serving the candidate: the committed steps' subsets.
    #[serde(default)]
    pub members: Vec<String>,
    /// Set while paused: why.
    pub paused: Option<String>,
    /// Failed judgements so far at this step.
    #[serde(default)]
    pub failures: u32,
    /// Inconclusive judgements in a row.
    #[serde(default)]
    pub inconclusive: u32,
    /// When the current step was committed, in microseconds since the
    /// epoch on the coordinator's clock (the commit write).
    pub commit_us: Option<u64>,
    /// When the committed subset is judged next, in milliseconds since the
    /// epoch.
    #[serde(default)]
    pub judge_at_ms: Option<u64>,
    /// When replicas switch to the committed step, in microseconds since
    /// the epoch: the commit write plus the plan's lead. A replica that
    /// learns of the commit later switches at once.
    #[serde(default)]
    pub switch_at_us: Option<u64>,
    /// Why it ended, when it did not promote.
    pub reason: Option<String>,
    /// What it decided so far, newest last (the latest few).
    #[serde(default)]
    pub decisions: Vec<FleetDecision>,
    /// The switch timings, once every member reported.
    pub switch: Option<SwitchSummary>,
    /// When it began.
    pub started_ms: u64,
    /// Fields of a newer baton's record.
    #[serde(flatten)]
    pub unknown: Unknown,
}

impl RolloutRecord {
    /// A rollout of `model` to `version`, from `from`, about to prepare on
    /// `participants`.
    pub fn new(model: &str, version: u64, from: Option<u64>, plan: FleetPlan, participants: Vec<String>) -> Self {
        RolloutRecord {
            id: now_us(),
            model: model.to_owned(),
            version,
            from,
            plan,
            participants,
            missing: Vec::new(),
            phase: FleetPhase::Preparing,
            step: None,
            members: Vec::new(),
            paused: None,
            failures: 0,
            inconclusive: 0,
            commit_us: None,
            judge_at_ms: None,
            switch_at_us: None,
            reason: None,
            decisions: Vec::new(),
            switch: None,
            started_ms: now_ms(),
            unknown: Unknown::new(),
        }
    }
}

/// One decision of a fleet rollout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetDecision {
    /// When.
    pub at_ms: u64,
    /// What: prepared, committed, advanced, promoted, rolled_back,
    /// aborted, paused, resumed, held.
    pub action: String,
    /// Who: coordinator ID or `operator`.
    pub by: String,
    /// The fleet's merged verdict, when a judgement decided it.
    pub verdict: Option<Verdict>,
    /// What happened, for people.
    pub message: String,
    /// Fields of a newer baton's decision.
    #[serde(flatten)]
    pub unknown: Unknown,
}

/// How far apart the replicas switched, from their own timestamps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SwitchSummary {
    /// Replicas that reported.
    pub replicas: usize,
    /// The last switch minus the first, in milliseconds.
    pub skew_ms: f64,
    /// From the commit write to the first and the last switch, in
    /// milliseconds.
    pub first_ms: f64,
    /// See `first_ms`.
    pub last_ms: f64,
    /// The last replica to learn of the commit minus the first: the skew a
    /// switch on delivery would have had.
    #[serde(default)]
    pub delivery_skew_ms: f64,
    /// From the commit write to the last replica learning of it.
    #[serde(default)]
    pub last_seen_ms: f64,
}

/// A replica's prepare result, under its lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ack {
    /// The rollout.
    pub rollout: u64,
    /// Prepared: loaded, verified, validated and warmed, with no traffic.
    pub ok: bool,
    /// The stage that failed.
    pub stage: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// How long preparing took, in milliseconds.
    pub prepare_ms: u64,
}

/// When a replica switched.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Switched {
    /// The rollout.
    pub rollout: u64,
    /// The phase it switched for: committed (a subset) or promoted.
    pub phase: FleetPhase,
    /// The step.
    pub step: Option<usize>,
    /// When the store happened, in microseconds since the epoch.
    pub at_us: u64,
    /// When the replica's watch delivered the commit.
    #[serde(default)]
    pub seen_us: u64,
    /// From the commit write, in microseconds (negative across hosts
    /// whose clocks disagree).
    pub delay_us: i64,
}

/// What a replica observed during one step, as sums the coordinator merges.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepSums {
    /// The rollout.
    pub rollout: u64,
    /// The step.
    pub step: usize,
    /// Everything observed since the replica saw the step committed.
    pub sums: Sums,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{FleetPlan, RolloutRecord};

    #[test]
    fn a_newer_batons_guards_and_decision_fields_survive_a_rewrite() {
        let mut record = RolloutRecord::new("m", 2, Some(1), FleetPlan::default(), vec!["a".into()]);
        crate::ops::decide(&mut record, "started", "test", "began".into());
        let mut written = serde_json::to_value(&record).unwrap();
        written["plan"]["guards"]["max_gpu_seconds_ratio"] = json!(1.25);
        written["plan"]["guards"]["max_p99_ratio"] = json!(2.0);
        written["decisions"][0]["signed_by"] = json!("key-7");
        let read: RolloutRecord = serde_json::from_value(written).unwrap();
        assert_eq!(read.plan.guards.known.max_p99_ratio, Some(2.0), "a known guard is read");
        assert!(read.plan.check().is_ok(), "an unknown guard is not judged here");
        let rewritten = serde_json::to_value(&read).unwrap();
        assert_eq!(rewritten["plan"]["guards"]["max_gpu_seconds_ratio"], 1.25, "{rewritten}");
        assert_eq!(rewritten["plan"]["guards"]["max_p99_ratio"], 2.0, "{rewritten}");
        assert_eq!(rewritten["decisions"][0]["signed_by"], "key-7", "{rewritten}");
        // A plan without guards takes the defaults.
        let bare: FleetPlan = serde_json::from_value(json!({ "steps": [100.0] })).unwrap();
        assert_eq!(bare.guards, FleetPlan::default().guards);
    }
}
