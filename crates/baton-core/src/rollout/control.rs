//! The controller's side of a rollout: where it stands (the step, the
//! failures, whether it is paused), what it decided and on which values,
//! and the rules that turn a judged window into the next decision.
//!
//! The registry keeps one [`Progress`] per rollout and ticks it from a
//! thread of its own at serving priority ([`crate::registry`]); what a
//! decision changes in the routing table (a weight, a promotion, a
//! rollback) is one store there.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};

use super::FULL;
use super::guard::{self, Outcome, Verdict};
use super::plan::Plan;
use super::window::{Baseline, Observations, Window};
use crate::files::rollout_spec::Mode;

/// Decisions kept per rollout for its status.
const KEPT_DECISIONS: usize = 32;

/// What a decision did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The candidate started taking traffic at the first step.
    Started,
    /// A window passed and the candidate moved to the next step.
    Advanced,
    /// A window was judged and the step held: inconclusive, failed below
    /// the failure limit, or passed in a mode that waits for an operator.
    Held,
    /// The candidate became stable.
    Promoted,
    /// The candidate was taken out of traffic because its guards failed.
    RolledBack,
    /// The rollout stopped judging: too many inconclusive windows, an
    /// operator, or a restart that could not vouch for it.
    Paused,
    /// The rollout judges windows again.
    Resumed,
    /// An operator took the candidate out of traffic.
    Aborted,
    /// The watch after promotion ended with no failed window: the promoted
    /// version stays, and the one it replaced is only kept as previous.
    Watched,
}

impl Action {
    /// The name, as in events and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Started => "started",
            Action::Advanced => "advanced",
            Action::Held => "held",
            Action::Promoted => "promoted",
            Action::RolledBack => "rolled_back",
            Action::Paused => "paused",
            Action::Resumed => "resumed",
            Action::Aborted => "aborted",
            Action::Watched => "watched",
        }
    }
}

/// How a rollout ends when it is told to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The candidate becomes stable.
    Promote,
    /// The candidate leaves because it was judged bad.
    RollBack,
    /// The candidate leaves because someone stopped the rollout.
    Abort,
}

/// Who decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum By {
    /// The guards, judging a window.
    Guards,
    /// An operator, through the management API.
    Operator,
    /// The server, restoring the rollout after a restart.
    Restart,
    /// A fleet's coordinator, which judges the fleet's windows and steers
    /// every server's rollout.
    Fleet,
    /// The server itself, acting on a fault: a version's worker process
    /// that ended.
    Server,
}

/// One decision, with what it was decided on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Decision {
    /// The model.
    pub model: String,
    /// The candidate.
    pub candidate: u64,
    /// The stable version when it was decided.
    pub stable: u64,
    /// What was decided.
    pub action: Action,
    /// Who decided.
    pub by: By,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The step after the decision (0-based).
    pub step: usize,
    /// The candidate's share after the decision, in percent.
    pub weight_percent: f64,
    /// The judged window's verdict: every guard's value, threshold and
    /// sample count.
    pub verdict: Option<Verdict>,
    /// When the judged window ended, in milliseconds since the Unix epoch:
    /// the decision follows within one tick of the controller.
    pub window_end_ms: Option<u64>,
    /// What happened, for people.
    pub message: String,
}

/// Where a rollout stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Windows are judged and decide.
    Running,
    /// Windows are not judged; the candidate keeps its share.
    Paused,
    /// Ended: the candidate is stable.
    Promoted,
    /// Ended: the guards took the candidate out.
    RolledBack,
    /// Ended: an operator took the candidate out.
    Aborted,
    /// Promoted, and still judged against the version it replaced, which
    /// stays loaded: a failed window rolls back to it.
    Watching,
}

impl Phase {
    /// Whether a rollout in this phase is still in progress: running,
    /// paused, or watched after promotion.
    pub fn in_progress(self) -> bool {
        matches!(self, Phase::Running | Phase::Paused | Phase::Watching)
    }
}

/// A rollout as status shows it: the plan, where it stands, the values of
/// the last judged window and the decisions so far.
#[derive(Clone, Debug, Serialize)]
pub struct RolloutStatus {
    /// The model.
    pub model: String,
    /// The stable version when it started.
    pub stable: u64,
    /// The candidate.
    pub candidate: u64,
    /// The mode.
    pub mode: Mode,
    /// Where it stands.
    pub phase: Phase,
    /// Why it is paused, when it is.
    pub paused: Option<String>,
    /// The step reached (0-based).
    pub step: usize,
    /// The candidate's share now, in percent.
    pub weight_percent: f64,
    /// Failed windows so far.
    pub failures: u32,
    /// Inconclusive windows in a row.
    pub inconclusive: u32,
    /// When the open window is judged, in milliseconds from now (running
    /// and watched rollouts only).
    pub next_window_ms: Option<u64>,
    /// While watched after promotion: the version it is judged against
    /// (the one it replaced), and how long the watch still runs, in
    /// milliseconds.
    #[serde(default)]
    pub watch: Option<WatchStatus>,
    /// What runs the paired copies and times the stable side: a twin of
    /// the stable version, or why there is none.
    pub twin: TwinStatus,
    /// The plan, its steps in percent.
    #[serde(serialize_with = "super::plan::in_percent")]
    pub plan: Plan,
    /// Whether a fleet's coordinator steers it: this server does not judge
    /// its windows, and its share changes only when the coordinator says.
    #[serde(default)]
    pub steered: bool,
    /// The last judged window.
    pub last_window: Option<Window>,
    /// Everything observed since the start.
    pub totals: Window,
    /// The decisions, oldest first (the latest few).
    pub decisions: Vec<Decision>,
}

/// Whether a rollout has a twin of its stable version (see
/// [`super::Rollout::twin`]), as status shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TwinStatus {
    /// Whether paired copies run on a twin, which alone times the stable
    /// side; else the stable version runs them and all its runs time it.
    pub loaded: bool,
    /// What the twin holds, measured while it loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_held: Option<u64>,
    /// Why there is none, when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The watch after promotion, as status shows it.
#[derive(Clone, Debug, Serialize)]
pub struct WatchStatus {
    /// The version it is judged against, kept loaded to go back to.
    pub against: u64,
    /// How long the watch still runs, in milliseconds.
    pub left_ms: u64,
}

/// The controller's state for one rollout.
pub(crate) struct Progress {
    /// The rollout's identity ([`super::Rollout::id`]).
    pub(crate) id: u64,
    pub(crate) stable: u64,
    pub(crate) candidate: u64,
    pub(crate) plan: Plan,
    pub(crate) step: usize,
    pub(crate) phase: Phase,
    pub(crate) paused: Option<String>,
    pub(crate) failures: u32,
    pub(crate) inconclusive: u32,
    pub(crate) window_started: Instant,
    pub(crate) last_window: Option<Window>,
    pub(crate) decisions: VecDeque<Decision>,
    pub(crate) observations: Arc<Observations>,
    /// Steered from outside (a fleet's coordinator): windows are not
    /// judged here, and the share changes only when told.
    pub(crate) steered: bool,
    /// Whether a promotion is watched: the plan asks for a watch and the
    /// version it replaces can stay loaded to go back to.
    pub(crate) watchable: bool,
    /// While watched: when the watch ends.
    pub(crate) watch_until: Option<Instant>,
    /// While watched: what the replaced version showed before the
    /// promotion, for the outcome and metric guards.
    pub(crate) baseline: Option<Baseline>,
    /// The twin of the stable version, or why there is none.
    pub(crate) twin: TwinStatus,
}

/// What the registry must do to the routing table after a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Nothing.
    None,
    /// Publish the candidate's new weight.
    Weight(u32),
    /// Make the candidate stable.
    Promote,
    /// Make the candidate stable and watch it against the old stable
    /// version, kept loaded.
    Watch,
    /// Take the candidate out.
    RollBack,
    /// End a watch by going back to the version it replaced.
    Restore,
    /// End a watch that did not fail: the comparison copies stop.
    EndWatch,
}

/// Milliseconds since the Unix epoch, now.
fn now_ms() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A weight in basis points as a percentage.
pub fn percent(weight: u32) -> f64 {
    f64::from(weight) * 100.0 / f64::from(FULL)
}

impl Progress {
    pub(crate) fn new(
        id: u64,
        (stable, candidate): (u64, u64),
        plan: Plan,
        step: usize,
        observations: Arc<Observations>,
    ) -> Self {
        let step = step.min(plan.steps.len() - 1);
        Progress {
            id,
            stable,
            candidate,
            plan,
            step,
            phase: Phase::Running,
            paused: None,
            failures: 0,
            inconclusive: 0,
            window_started: Instant::now(),
            last_window: None,
            decisions: VecDeque::new(),
            observations,
            steered: false,
            watchable: false,
            watch_until: None,
            baseline: None,
            twin: TwinStatus::default(),
        }
    }

    /// The candidate's share at the current step, in basis points.
    pub(crate) fn weight(&self) -> u32 {
        self.plan.steps[self.step]
    }

    /// Whether the open window has run its interval, or the watch its
    /// time.
    pub(crate) fn due(&self, now: Instant) -> bool {
        let judged = matches!(self.phase, Phase::Running | Phase::Watching);
        let window_over = now.duration_since(self.window_started) >= self.plan.interval();
        !self.steered && judged && (window_over || self.watch_over(now))
    }

    /// Whether a watch after promotion has run its time.
    pub(crate) fn watch_over(&self, now: Instant) -> bool {
        self.phase == Phase::Watching && self.watch_until.is_some_and(|until| now >= until)
    }

    /// Starts the watch after a promotion, now: the window starts afresh
    /// on `observations`, and failures count from zero.
    pub(crate) fn start_watch(&mut self, observations: Arc<Observations>) {
        // The replaced version answers nobody from now on: what it showed
        // before stands in for it (recorded when the candidate took all of
        // the traffic, if it did before the promotion).
        if self.baseline.is_none() {
            self.record_baseline();
        }
        self.phase = Phase::Watching;
        self.watch_until = self.plan.watch().map(|watch| Instant::now() + watch);
        self.window_started = Instant::now();
        self.failures = 0;
        self.inconclusive = 0;
        self.observations = observations;
    }

    /// Records what the stable version showed until now, for the windows in
    /// which it answers nobody: its outcome value per answer over the
    /// rollout, and each metric guard's last reading of it.
    pub(crate) fn record_baseline(&mut self) {
        let totals = self.observations.totals();
        let metrics = self.last_window.iter().flat_map(|w| &w.metrics);
        self.baseline = Some(Baseline {
            version: self.stable,
            requests: totals.stable.answered,
            outcome_rate: totals.stable.outcome_rate(),
            metrics: metrics.filter_map(|r| Some((r.name.clone(), r.stable?))).collect(),
        });
    }

    /// Whether the stable version answers nobody now: the candidate takes
    /// all of the traffic (a canary's or A/B's last step of 100 %), or the
    /// rollout is watched after promotion. Its outcomes and business
    /// metrics then come from the baseline.
    pub(crate) fn stable_answers_nobody(&self) -> bool {
        self.phase == Phase::Watching || (self.plan.mode != Mode::Shadow && self.weight() == FULL)
    }

    /// Records a decision and returns it, for the event.
    pub(crate) fn decide(&mut self, model: &str, action: Action, by: By, verdict: Option<Verdict>) -> Decision {
        let weight = match action {
            Action::RolledBack | Action::Aborted => 0,
            Action::Promoted | Action::Watched => FULL,
            _ if self.phase == Phase::Watching => FULL,
            _ => self.weight(),
        };
        let message = describe(model, self, action, by, verdict.as_ref());
        let decision = Decision {
            model: model.to_owned(),
            candidate: self.candidate,
            stable: self.stable,
            action,
            by,
            at_ms: now_ms(),
            step: self.step,
            weight_percent: percent(weight),
            verdict,
            window_end_ms: None,
            message,
        };
        if self.decisions.len() == KEPT_DECISIONS {
            self.decisions.pop_front();
        }
        self.decisions.push_back(decision.clone());
        decision
    }

    /// Judges the window that just ended and decides what follows.
    pub(crate) fn judge(&mut self, model: &str, mut window: Window) -> (Decision, Effect) {
        let now = Instant::now();
        let late = self.window_started.elapsed().saturating_sub(self.plan.interval());
        let window_end_ms = now_ms().saturating_sub(late.as_millis() as u64);
        self.window_started = now;
        let watching = self.phase == Phase::Watching;
        if self.stable_answers_nobody() {
            window.baseline.clone_from(&self.baseline);
        }
        let shadowed = self.plan.mode == Mode::Shadow && !watching;
        let verdict = guard::evaluate(&self.plan.guards, &window, shadowed);
        self.last_window = Some(window);
        let (action, effect) = if self.phase == Phase::Watching {
            self.judge_watched(verdict.outcome, now)
        } else {
            self.judge_running(verdict.outcome, &verdict.reason)
        };
        let mut decision = self.decide(model, action, By::Guards, Some(verdict));
        decision.window_end_ms = Some(window_end_ms);
        if let Some(kept) = self.decisions.back_mut() {
            kept.window_end_ms = Some(window_end_ms);
        }
        (decision, effect)
    }

    /// A window of the watch after promotion: a failure (up to the limit)
    /// goes back to the version it replaced; otherwise the watch holds
    /// until its time is up. Inconclusive windows neither fail nor pause it.
    fn judge_watched(&mut self, outcome: Outcome, now: Instant) -> (Action, Effect) {
        if outcome == Outcome::Fail {
            self.failures += 1;
            if self.failures >= self.plan.failure_limit {
                self.phase = Phase::RolledBack;
                return (Action::RolledBack, Effect::Restore);
            }
        }
        if self.watch_over(now) {
            self.phase = Phase::Promoted;
            return (Action::Watched, Effect::EndWatch);
        }
        (Action::Held, Effect::None)
    }

    /// A window of a rollout taking traffic.
    fn judge_running(&mut self, outcome: Outcome, reason: &str) -> (Action, Effect) {
        match outcome {
            Outcome::Fail => {
                self.failures += 1;
                self.inconclusive = 0;
                if self.failures >= self.plan.failure_limit {
                    self.phase = Phase::RolledBack;
                    (Action::RolledBack, Effect::RollBack)
                } else {
                    (Action::Held, Effect::None)
                }
            }
            Outcome::Inconclusive => {
                self.inconclusive += 1;
                if self.inconclusive >= self.plan.max_inconclusive {
                    self.phase = Phase::Paused;
                    self.paused = Some(format!("{} windows in a row were inconclusive ({reason})", self.inconclusive));
                    (Action::Paused, Effect::None)
                } else {
                    (Action::Held, Effect::None)
                }
            }
            Outcome::Pass => {
                self.inconclusive = 0;
                match self.plan.mode {
                    Mode::Canary if self.step + 1 < self.plan.steps.len() => {
                        self.step += 1;
                        if self.stable_answers_nobody() {
                            self.record_baseline();
                        }
                        (Action::Advanced, Effect::Weight(self.weight()))
                    }
                    Mode::Canary => self.promotion(),
                    Mode::Ab | Mode::Shadow => (Action::Held, Effect::None),
                }
            }
        }
    }

    /// What promoting the candidate does now: watched, when it can be.
    pub(crate) fn promotion(&mut self) -> (Action, Effect) {
        if self.watchable {
            // The phase becomes Watching once the store is done.
            (Action::Promoted, Effect::Watch)
        } else {
            self.phase = Phase::Promoted;
            (Action::Promoted, Effect::Promote)
        }
    }

    /// The status of this rollout, for `model`.
    pub(crate) fn status(&self, model: &str) -> RolloutStatus {
        let weight = match self.phase {
            Phase::RolledBack | Phase::Aborted => 0,
            Phase::Promoted | Phase::Watching => FULL,
            _ => self.weight(),
        };
        let judged = matches!(self.phase, Phase::Running | Phase::Watching);
        let watch_left = self.watch_until.map(|until| until.saturating_duration_since(Instant::now()));
        let next_window_ms = (judged && !self.steered).then(|| {
            let window_left = self.plan.interval().saturating_sub(self.window_started.elapsed());
            let watch_left = watch_left.filter(|_| self.phase == Phase::Watching).unwrap_or(window_left);
            window_left.min(watch_left).as_millis() as u64
        });
        let watch = (self.phase == Phase::Watching).then(|| WatchStatus {
            against: self.stable,
            left_ms: watch_left.map_or(0, |left| left.as_millis() as u64),
        });
        RolloutStatus {
            model: model.to_owned(),
            stable: self.stable,
            candidate: self.candidate,
            mode: self.plan.mode,
            phase: self.phase,
            paused: self.paused.clone(),
            step: self.step,
            weight_percent: percent(weight),
            failures: self.failures,
            inconclusive: self.inconclusive,
            next_window_ms,
            watch,
            twin: match self.phase {
                Phase::Watching => TwinStatus {
                    loaded: false,
                    bytes_held: None,
                    reason: Some("watching after promotion: the version it replaced runs the copies".to_owned()),
                },
                _ => self.twin.clone(),
            },
            plan: self.plan.clone(),
            steered: self.steered,
            last_window: self.last_window.clone(),
            totals: self.observations.totals(),
            decisions: self.decisions.iter().cloned().collect(),
        }
    }
}

/// A sentence for a decision.
fn describe(model: &str, p: &Progress, action: Action, by: By, verdict: Option<&Verdict>) -> String {
    let who = match by {
        By::Guards => "the guards",
        By::Operator => "an operator",
        By::Restart => "a restart",
        By::Fleet => "the fleet's coordinator",
        By::Server => "the server, as a worker process ended",
    };
    let why = verdict.map(|v| format!(": {}", v.reason)).unwrap_or_default();
    let share = percent(p.weight());
    let (stable, candidate) = (p.stable, p.candidate);
    match action {
        Action::Started => format!(
            "Model {model} started {} rollout of version {candidate} beside version {stable}, at {share}%.",
            p.plan.mode.in_words()
        ),
        Action::Advanced => format!("Model {model} version {candidate} advanced to {share}% ({who}){why}."),
        Action::Held if p.phase == Phase::Watching => {
            format!("Model {model} version {candidate} is watched against version {stable} ({who}){why}.")
        }
        Action::Held => format!("Model {model} version {candidate} holds at {share}% ({who}){why}."),
        Action::Promoted if p.watchable => format!(
            "Model {model} version {candidate} was promoted to stable by {who}{why}; it is watched against version \
             {stable} for {} s.",
            p.plan.watch_ms / 1000
        ),
        Action::Promoted => format!("Model {model} version {candidate} was promoted to stable by {who}{why}."),
        Action::RolledBack if p.watch_until.is_some() => format!(
            "Model {model} version {candidate} was rolled back by {who} during the watch after its promotion; \
             version {stable} serves all again{why}."
        ),
        Action::RolledBack => {
            format!("Model {model} version {candidate} was rolled back by {who}; version {stable} serves all{why}.")
        }
        Action::Watched => format!(
            "Model {model} version {candidate} ended its watch after promotion ({who}){why}; version {stable} \
             is kept only as previous."
        ),
        Action::Paused => format!(
            "Model {model} rollout of version {candidate} paused at {share}% by {who}: {}.",
            p.paused.as_deref().unwrap_or("no reason given")
        ),
        Action::Resumed => format!("Model {model} rollout of version {candidate} resumed at {share}% by {who}."),
        Action::Aborted if p.watch_until.is_some() => format!(
            "Model {model} version {candidate} was aborted by {who} during the watch after its promotion; version \
             {stable} serves all again."
        ),
        Action::Aborted => {
            format!("Model {model} rollout of version {candidate} was aborted by {who}; version {stable} serves all.")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::rollout_spec::RolloutPolicy;
    use crate::rollout::plan::Overrides;

    #[test]
    fn a_start_names_its_mode_with_the_right_article() {
        for (mode, words) in [(Mode::Canary, "a canary"), (Mode::Ab, "an A/B"), (Mode::Shadow, "a shadow")] {
            let mut plan = Plan::new(&RolloutPolicy::default(), &Overrides::default()).unwrap();
            plan.mode = mode;
            let progress = Progress::new(1, (1, 2), plan, 0, Arc::default());
            let sentence = describe("ranker", &progress, Action::Started, By::Operator, None);
            assert!(sentence.starts_with(&format!("Model ranker started {words} rollout of version 2")), "{sentence}");
        }
    }

    #[test]
    fn an_abort_during_the_watch_says_the_replaced_version_serves_again() {
        let plan = Plan::new(&RolloutPolicy::default(), &Overrides::default()).unwrap();
        let mut progress = Progress::new(1, (1, 2), plan, 0, Arc::default());
        let sentence = describe("ranker", &progress, Action::Aborted, By::Operator, None);
        assert_eq!(sentence, "Model ranker rollout of version 2 was aborted by an operator; version 1 serves all.");
        progress.phase = Phase::Watching;
        progress.watch_until = Some(Instant::now());
        let sentence = describe("ranker", &progress, Action::Aborted, By::Operator, None);
        assert!(sentence.contains("during the watch after its promotion; version 1 serves all again"), "{sentence}");
    }
}
