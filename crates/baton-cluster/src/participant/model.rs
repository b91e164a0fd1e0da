//! One model on one replica: what the fleet's records say about it, and
//! the task that brings the node to it.
//!
//! Convergence is level-triggered. After every change of the records,
//! after every action, and every few seconds besides, the task compares
//! what the node serves with what the records say ([`decide`]) and takes
//! one step towards it. A step that fails is retried, with backoff, until
//! the node serves what the records say; meanwhile the replica reports
//! not ready, with the reason. The task lives as long as the participant,
//! across reconnects: a prepare that was running when the store was lost
//! is awaited, and its ack written under the session that follows.

use std::time::{Duration, Instant};

use baton_core::rollout::window::Sums;
use baton_core::threads::sync::Lock;

use crate::records::{Ack, Desired, FleetPhase, RolloutRecord, Serving, now_us};

/// The first wait before a failed step is tried again; it doubles up to
/// [`RETRY_LAST`], each wait spread by jitter (up to twice as long).
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between two tries of a failed step, before jitter.
pub(crate) const RETRY_LAST: Duration = Duration::from_secs(8);
/// The first wait before a whole load of the committed version that the
/// node refused (it could not verify, load or validate it) is tried again;
/// it doubles up to [`RELOAD_LAST`], spread by jitter. Such a load costs
/// the model's whole size (a copy, a hash, a second copy in memory beside
/// the one that serves), and a version refused once is most likely
/// refused again: it is not tried every few seconds. A load that could
/// not fetch the version, and a new committed version, are tried as any
/// other step.
pub(crate) const RELOAD_FIRST: Duration = Duration::from_secs(15);
pub(crate) const RELOAD_LAST: Duration = Duration::from_secs(600);
/// How often a settled model is compared with the records anyway.
const RECHECK: Duration = Duration::from_secs(5);

/// When this replica first saw a record's current phase and step, on its
/// own clocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen {
    key: (u64, FleetPhase, Option<usize>),
    at: Instant,
    wall_us: u64,
}

/// What one replica knows of one model.
#[derive(Debug, Default)]
pub(crate) struct View {
    /// The committed version, and the store's revision that wrote it.
    pub desired: Option<(Desired, i64)>,
    /// The latest rollout record, and its revision.
    pub record: Option<(RolloutRecord, i64)>,
    /// When the record's current phase and step were first seen here.
    pub seen: Option<Seen>,
    /// The outcome of this replica's prepare, per rollout.
    pub prepared: Option<(u64, Ack)>,
    /// The rollout and lease the ack was last written for.
    pub acked: Option<(u64, i64)>,
    /// What the candidate's rollout observed during the committed step.
    pub sums: Option<(u64, usize, Sums)>,
    /// Whether the sums changed since they were last published, and when.
    pub sums_changed: bool,
    pub sums_published: Option<Instant>,
    /// Why the node does not serve what the records say, when it does not.
    pub problem: Option<String>,
    /// Whether the node was found to serve what the records say at least
    /// once since the replica started.
    pub settled: bool,
    /// A committed version whose whole load failed here (the node still
    /// serves what it served): the replica takes part in the next rollout
    /// rather than retrying that load first.
    pub unloadable: Option<u64>,
}

impl View {
    /// The version the fleet committed: the newer of the committed-version
    /// record and a promoted rollout (the two are written together, but
    /// may be delivered one after the other).
    pub fn committed(&self) -> Option<u64> {
        let desired = self.desired.as_ref();
        match &self.record {
            Some((r, revision)) if r.phase == FleetPhase::Promoted && desired.is_none_or(|d| d.1 < *revision) => {
                Some(r.version)
            }
            // The commit's other half: a committed version written by the
            // promotion of a rollout whose promoted record has not been
            // delivered yet. Until it is, the rollout's stable version
            // stands (a whole load of the candidate would be wrong).
            Some((r, revision))
                if r.phase.in_progress() && desired.is_some_and(|d| d.0.rollout == Some(r.id) && d.1 > *revision) =>
            {
                r.from
            }
            _ => desired.map(|d| d.0.version),
        }
    }

    /// Takes a newer rollout record, noting when its phase or step changed.
    pub fn set_record(&mut self, record: RolloutRecord, revision: i64) {
        if self.record.as_ref().is_some_and(|(_, r)| *r > revision) {
            return;
        }
        let key = (record.id, record.phase, record.step);
        if self.seen.is_none_or(|s| s.key != key) {
            self.seen = Some(Seen { key, at: Instant::now(), wall_us: now_us() });
        }
        self.record = Some((record, revision));
    }

    /// Takes a newer committed version.
    pub fn set_desired(&mut self, desired: Desired, revision: i64) {
        if self.desired.as_ref().is_some_and(|(_, r)| *r > revision) {
            return;
        }
        self.desired = Some((desired, revision));
    }

    /// When, on the wall clock, the record's current phase and step were
    /// first seen here.
    pub fn seen_wall_us(&self) -> Option<u64> {
        self.seen.map(|s| s.wall_us)
    }

    /// Until when a prepare for `rollout` may wait for the node: the plan's
    /// prepare timeout after this replica saw the rollout's current phase
    /// (on its monotonic clock); `None` when the record is another
    /// rollout's, or is no longer preparing or committed.
    pub fn prepare_deadline(&self, rollout: u64) -> Option<Instant> {
        let (record, _) = self.record.as_ref().filter(|(r, _)| r.id == rollout && r.phase.in_progress())?;
        let seen = self.seen.filter(|s| s.key.0 == rollout)?;
        Some(seen.at + Duration::from_millis(record.plan.prepare_timeout_ms))
    }

    /// When to switch for the record's current step: the instant it names,
    /// but never later than its lead after this replica saw the commit,
    /// measured on this replica's clock, however far the clock of the
    /// coordinator that named it is off.
    fn switch_at(&self, record: &RolloutRecord, now: Instant) -> Instant {
        let Some(seen) = self.seen.filter(|s| s.key == (record.id, record.phase, record.step)) else { return now };
        let lead_us = record.plan.switch_lead_ms.saturating_mul(1000);
        let named = record.switch_at_us.map_or(0, |at| at.saturating_sub(seen.wall_us));
        seen.at + Duration::from_micros(named.min(lead_us))
    }
}

/// The one step that brings the node closer to what the records say.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Action {
    /// The node serves what the records say.
    Settled,
    /// Load the rollout's candidate beside the stable version, with no
    /// traffic; `retry` when a failure is to be retried (a subset member
    /// that lost its candidate) rather than acked.
    Prepare { rollout: u64, version: u64, retry: bool },
    /// The candidate takes all of this node's traffic, at `at`.
    Share { record: Box<RolloutRecord>, at: Instant },
    /// The candidate becomes stable, at `at`.
    Promote { record: Box<RolloutRecord>, at: Instant },
    /// The candidate leaves.
    Drop { rolled_back: bool },
    /// Nothing to do until the records change, but the node does not
    /// serve the committed version: not ready, for this reason (unless a
    /// more precise one stands).
    Hold { why: String },
    /// A whole load of the committed version.
    Converge { version: u64 },
}

/// What `me` should do next about a model, given what it knows and what
/// the node serves.
pub(crate) fn decide(me: &str, view: &View, have: &Serving, now: Instant) -> Action {
    let Some(committed) = view.committed() else { return Action::Settled };
    let record = view.record.as_ref().map(|(r, _)| r);
    let taking_part = record.filter(|r| {
        r.phase.in_progress() && r.participants.iter().any(|p| p == me) && !r.missing.iter().any(|p| p == me)
    });
    if let Some(r) = taking_part {
        let converged = have.stable == Some(committed);
        // A node that serves another version, or that failed to load the
        // committed one, prepares the candidate all the same: the promotion
        // converges it, and a version it cannot load must not keep it from
        // acking (a rollout would wait for it until its timeout). A node
        // that serves nothing yet loads the committed version first.
        let may_prepare = converged || have.stable.is_some() || view.unloadable == Some(committed);
        if !may_prepare {
            return Action::Converge { version: committed };
        }
        let prepare = |retry| Action::Prepare { rollout: r.id, version: r.version, retry };
        let hold = || Action::Hold {
            why: match have.stable {
                Some(stable) => format!("serves version {stable}, not version {committed}, which the fleet committed"),
                None => format!("serves no version; the fleet committed version {committed}"),
            },
        };
        if r.phase == FleetPhase::Preparing {
            // Only this rollout's own ack says it is prepared: a candidate
            // of the same version may be an earlier rollout's, whose load
            // ended after that rollout was aborted. Preparing again returns
            // at once when the candidate is this rollout's.
            let done = view.prepared.as_ref().is_some_and(|(id, _)| *id == r.id);
            return if !done {
                prepare(false)
            } else if converged {
                Action::Settled
            } else {
                hold()
            };
        }
        // Committed: a member serves the candidate, the others hold it.
        if !r.members.iter().any(|m| m == me) {
            return if converged { Action::Settled } else { Action::Converge { version: committed } };
        }
        if have.candidate != Some(r.version) {
            return prepare(true);
        }
        if have.candidate_percent < 100.0 {
            return Action::Share { record: Box::new(r.clone()), at: view.switch_at(r, now) };
        }
        return Action::Settled;
    }
    if let Some(candidate) = have.candidate {
        let promoted = record.filter(|r| r.phase == FleetPhase::Promoted && r.version == committed);
        if let Some(r) = promoted
            && candidate == committed
            && have.stable != Some(committed)
        {
            return Action::Promote { record: Box::new(r.clone()), at: view.switch_at(r, now) };
        }
        return Action::Drop { rolled_back: record.is_some_and(|r| r.phase == FleetPhase::RolledBack) };
    }
    if have.stable != Some(committed) {
        return Action::Converge { version: committed };
    }
    Action::Settled
}

/// The shared view of one model and a bell for its task.
pub(crate) struct Model {
    /// The model's name.
    pub name: String,
    /// What the replica knows of it.
    pub view: Lock<View>,
    changed: tokio::sync::watch::Sender<()>,
}

impl Model {
    /// A model nothing is known of yet.
    pub fn new(name: &str) -> Model {
        Model { name: name.to_owned(), view: Lock::default(), changed: tokio::sync::watch::channel(()).0 }
    }

    /// Changes the view and wakes the model's task.
    pub fn update(&self, change: impl FnOnce(&mut View)) {
        change(&mut self.view.lock());
        self.changed.send_replace(());
    }

    /// A receiver that says when the view changed.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }
}

/// Waits until `at`, or until the view changes (then the step is decided
/// again), or until the periodic check is due; whichever comes first.
pub(crate) async fn wait(changes: &mut tokio::sync::watch::Receiver<()>, until: Option<Instant>) {
    let until = until.unwrap_or_else(|| Instant::now() + RECHECK);
    tokio::select! {
        () = tokio::time::sleep_until(until.into()) => {}
        _ = changes.changed() => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Action, View, decide};
    use crate::records::{Desired, FleetPhase, FleetPlan, RolloutRecord, Serving, now_us};

    fn record(phase: FleetPhase, members: &[&str]) -> RolloutRecord {
        let mut record = RolloutRecord::new("m", 2, Some(1), FleetPlan::default(), vec!["a".into(), "b".into()]);
        record.id = 7;
        record.phase = phase;
        record.step = Some(0);
        record.members = members.iter().map(|m| (*m).to_owned()).collect();
        record
    }

    fn view(desired: u64, record: Option<(RolloutRecord, i64)>) -> View {
        let mut view = View::default();
        view.set_desired(Desired { version: desired, rollout: None, at_ms: 0 }, 5);
        if let Some((r, revision)) = record {
            view.set_record(r, revision);
        }
        view
    }

    fn serving(stable: u64, candidate: Option<u64>, percent: f64) -> Serving {
        Serving { stable: Some(stable), candidate, candidate_percent: percent }
    }

    #[test]
    fn a_participant_prepares_once_then_waits_for_the_commit() {
        let now = Instant::now();
        let mut v = view(1, Some((record(FleetPhase::Preparing, &[]), 6)));
        assert!(matches!(decide("a", &v, &serving(1, None, 0.0), now), Action::Prepare { retry: false, .. }));
        assert_eq!(decide("c", &v, &serving(1, None, 0.0), now), Action::Settled, "not a participant");
        v.prepared = Some((7, crate::records::Ack { rollout: 7, ok: false, stage: None, reason: None, prepare_ms: 0 }));
        assert_eq!(
            decide("a", &v, &serving(1, None, 0.0), now),
            Action::Settled,
            "a failed prepare is acked, not retried"
        );
        assert!(
            matches!(decide("a", &v, &serving(3, None, 0.0), now), Action::Hold { .. }),
            "prepared while serving another version: not ready, waiting for the commit"
        );
    }

    #[test]
    fn a_candidate_left_by_an_earlier_rollout_is_prepared_again_for_this_one() {
        let now = Instant::now();
        let mut v = view(1, Some((record(FleetPhase::Preparing, &[]), 6)));
        // Rollout 6 of the same version was aborted while its candidate
        // loaded; the load ended after rollout 7 began.
        v.prepared = Some((6, crate::records::Ack { rollout: 6, ok: true, stage: None, reason: None, prepare_ms: 0 }));
        assert!(matches!(decide("a", &v, &serving(1, Some(2), 0.0), now), Action::Prepare { rollout: 7, .. }));
        v.prepared = Some((7, crate::records::Ack { rollout: 7, ok: true, stage: None, reason: None, prepare_ms: 0 }));
        assert_eq!(decide("a", &v, &serving(1, Some(2), 0.0), now), Action::Settled);
    }

    #[test]
    fn a_node_off_the_committed_version_still_prepares_and_one_with_none_loads_it_first() {
        let now = Instant::now();
        let mut v = view(1, Some((record(FleetPhase::Preparing, &[]), 6)));
        // It serves 3 (it missed a commit, or could not load 1): it prepares.
        assert!(matches!(decide("a", &v, &serving(3, None, 0.0), now), Action::Prepare { retry: false, .. }));
        // It serves nothing: it loads the committed version first, unless
        // that load failed already.
        let nothing = Serving::default();
        assert_eq!(decide("a", &v, &nothing, now), Action::Converge { version: 1 });
        v.unloadable = Some(1);
        assert!(matches!(decide("a", &v, &nothing, now), Action::Prepare { retry: false, .. }));
        // Committed: a member shares the candidate it holds; another
        // replica loads the committed version.
        let v = view(1, Some((record(FleetPhase::Committed, &["a"]), 6)));
        assert!(matches!(decide("a", &v, &serving(3, Some(2), 0.0), now), Action::Share { .. }));
        assert_eq!(decide("b", &v, &serving(3, None, 0.0), now), Action::Converge { version: 1 });
    }

    #[test]
    fn a_member_shares_and_the_others_hold() {
        let now = Instant::now();
        let v = view(1, Some((record(FleetPhase::Committed, &["a"]), 6)));
        assert!(matches!(decide("a", &v, &serving(1, Some(2), 0.0), now), Action::Share { .. }));
        assert_eq!(decide("a", &v, &serving(1, Some(2), 100.0), now), Action::Settled);
        assert!(matches!(decide("a", &v, &serving(1, None, 0.0), now), Action::Prepare { retry: true, .. }));
        assert_eq!(decide("b", &v, &serving(1, Some(2), 0.0), now), Action::Settled);
    }

    #[test]
    fn a_promotion_delivered_before_the_committed_version_still_promotes() {
        let now = Instant::now();
        // The record (revision 9) arrives before desired/ (still 5).
        let v = view(1, Some((record(FleetPhase::Promoted, &["a", "b"]), 9)));
        assert_eq!(v.committed(), Some(2));
        assert!(matches!(decide("a", &v, &serving(1, Some(2), 0.0), now), Action::Promote { .. }));
        assert_eq!(decide("a", &v, &serving(1, None, 0.0), now), Action::Converge { version: 2 }, "missed it");
        assert_eq!(decide("a", &v, &serving(2, None, 0.0), now), Action::Settled);
        // A committed version written after the record wins.
        let mut later = view(1, Some((record(FleetPhase::Promoted, &["a"]), 9)));
        later.set_desired(Desired { version: 3, rollout: None, at_ms: 0 }, 12);
        assert_eq!(later.committed(), Some(3));
    }

    #[test]
    fn a_committed_version_delivered_before_the_promoted_record_waits_for_it() {
        let now = Instant::now();
        // desired/ (revision 9, written by rollout 7's promotion) arrives
        // while the record is still the preparing one (revision 6).
        let mut v = view(1, Some((record(FleetPhase::Preparing, &[]), 6)));
        v.prepared = Some((7, crate::records::Ack { rollout: 7, ok: true, stage: None, reason: None, prepare_ms: 0 }));
        v.set_desired(Desired { version: 2, rollout: Some(7), at_ms: 0 }, 9);
        assert_eq!(v.committed(), Some(1));
        assert_eq!(decide("a", &v, &serving(1, Some(2), 0.0), now), Action::Settled, "no whole load of the candidate");
        v.set_record(record(FleetPhase::Promoted, &["a", "b"]), 9);
        assert!(matches!(decide("a", &v, &serving(1, Some(2), 0.0), now), Action::Promote { .. }));
    }

    #[test]
    fn an_ended_rollout_leaves_no_candidate() {
        let now = Instant::now();
        let v = view(1, Some((record(FleetPhase::RolledBack, &["a"]), 6)));
        assert_eq!(decide("a", &v, &serving(1, Some(2), 100.0), now), Action::Drop { rolled_back: true });
        let v = view(1, Some((record(FleetPhase::Aborted, &[]), 6)));
        assert_eq!(decide("b", &v, &serving(1, Some(2), 0.0), now), Action::Drop { rolled_back: false });
    }

    #[test]
    fn a_prepare_may_wait_for_the_node_until_the_plans_timeout_after_the_rollout_was_seen() {
        let mut r = record(FleetPhase::Preparing, &[]);
        r.plan.prepare_timeout_ms = 30_000;
        let before = Instant::now();
        let v = view(1, Some((r.clone(), 6)));
        let deadline = v.prepare_deadline(7).expect("a deadline while preparing");
        assert!(deadline >= before + Duration::from_secs(30) && deadline <= Instant::now() + Duration::from_secs(30));
        assert_eq!(v.prepare_deadline(8), None, "another rollout's");
        r.phase = FleetPhase::Aborted;
        let ended = view(1, Some((r, 7)));
        assert_eq!(ended.prepare_deadline(7), None, "the rollout ended: nothing to wait for");
    }

    #[test]
    fn a_switch_never_waits_longer_than_the_lead_whatever_the_named_instant() {
        let now = Instant::now();
        let mut r = record(FleetPhase::Promoted, &["a"]);
        r.plan.switch_lead_ms = 250;
        r.switch_at_us = Some(now_us() + 600_000_000);
        let v = view(2, Some((r.clone(), 6)));
        let Action::Promote { at, .. } = decide("a", &v, &serving(1, Some(2), 0.0), now) else { panic!() };
        assert!(at <= Instant::now() + Duration::from_millis(250), "waits at most the lead");
        r.switch_at_us = Some(1);
        let v = view(2, Some((r, 6)));
        let Action::Promote { at, .. } = decide("a", &v, &serving(1, Some(2), 0.0), now) else { panic!() };
        assert!(at <= Instant::now(), "a past instant switches at once");
    }
}
