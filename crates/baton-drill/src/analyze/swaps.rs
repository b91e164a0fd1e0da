//! Each swap after the fact: when its new version first answered, its
//! commit, its window, and the answers that came from a version they
//! should not have.
//!
//! - commit = the later of the action returning and the first answer from
//!   the new version (when the new version is known and differs from the
//!   one answering before the trigger; else the action returning). A known version that never answered has no commit: its
//!   window runs to the next trigger or the end of the load.
//! - window = [trigger, commit + W), cut at the next trigger.
//! - stale on the worker: an answer from another version on a worker
//!   (connection) after that worker got an answer from the new version,
//!   before the next trigger.
//! - stale after served: an answer from another version to a request
//!   started after the new version's first answer ended, anywhere, before
//!   the next trigger.

use std::collections::HashMap;

use serde::Serialize;

use super::stats::Stats;
use crate::record::Record;
use crate::swap::SwapRecord;

/// One swap, as measured.
#[derive(Clone, Debug, Serialize)]
pub struct SwapReport {
    /// 1-based.
    pub index: usize,
    /// The version the swap should bring, when known.
    pub version: Option<String>,
    /// The version of the last successful answer before the trigger.
    pub previous: Option<String>,
    /// When the schedule wanted the swap, s since the start.
    pub scheduled_s: f64,
    /// When the action started.
    pub trigger_s: f64,
    /// How long the action took, ms.
    pub action_ms: f64,
    /// Whether the action succeeded.
    pub action_ok: bool,
    /// What the action said.
    pub action_detail: String,
    /// When the first answer from the new version ended.
    pub first_served_s: Option<f64>,
    /// From the trigger to that answer, ms.
    pub time_to_serve_ms: Option<f64>,
    /// Whether the new version answered (none when the version is unknown).
    pub served: Option<bool>,
    /// The commit (see the module documentation); none when never served.
    pub commit_s: Option<f64>,
    /// The end of the swap's window.
    pub window_end_s: f64,
    /// The requests started in the window.
    pub stats: Stats,
    /// Answers from another version on a worker that had already had the new one.
    pub stale_on_worker: u64,
    /// Answers from another version to requests started after the new version first answered.
    pub stale_after_served: u64,
    /// Why the swap could not be fully measured, if it could not.
    pub note: Option<String>,
    /// An upgrade's handover: the processes, when the new one served and
    /// when the old one exited.
    pub handover: Option<crate::swap::upgrade::Handover>,
}

/// The span of a swap's window, ns.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    /// Trigger.
    pub from: u64,
    /// Commit (the window's end when there was none): where the loading
    /// part of the window ends and the part after commit begins.
    pub commit: u64,
    /// Window end.
    pub to: u64,
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Measures each swap. `records` are sorted by start; `version_of` maps a
/// version string to its id in the records. Stats are left for the caller.
pub fn measure(
    swaps: &[SwapRecord],
    records: &[Record],
    versions: &[String],
    end: u64,
    window: u64,
    flagged: &mut [bool],
) -> (Vec<SwapReport>, Vec<Span>) {
    let ids: HashMap<&str, u32> = versions.iter().enumerate().map(|(i, v)| (v.as_str(), i as u32)).collect();
    let mut reports = Vec::new();
    let mut spans = Vec::new();
    for (k, swap) in swaps.iter().enumerate() {
        let next = swaps.get(k + 1).map_or(end, |s| s.trigger).max(swap.trigger);
        let previous = records
            .iter()
            .filter(|r| r.ok() && r.end() <= swap.trigger)
            .max_by_key(|r| r.end())
            .map(|r| versions[r.version as usize].clone())
            .filter(|v| !v.is_empty());
        // A swap to the version already answering cannot be told apart by
        // its answers: it is measured like a swap to an unknown version.
        let same = swap.version.is_some() && swap.version == previous;
        let known = swap.version.as_deref().filter(|_| swap.ok && !same);
        let id = known.and_then(|v| ids.get(v).copied());
        let first = id.and_then(|id| {
            records.iter().filter(|r| r.ok() && r.version == id && r.end() > swap.trigger).map(Record::end).min()
        });
        let commit = match (known, first) {
            (None, _) => Some(swap.done),
            (Some(_), Some(first)) => Some(first.max(swap.done)),
            (Some(_), None) => None,
        };
        let to = commit.map_or(next, |c| (c + window).min(next)).max(swap.trigger);
        let (mut on_worker, mut after) = (0, 0);
        if let (Some(id), Some(first)) = (id, first) {
            let mut seen_new: HashMap<u32, u64> = HashMap::new();
            for (i, r) in records.iter().enumerate() {
                if r.start >= next {
                    break;
                }
                if !r.ok() {
                    continue;
                }
                if r.version == id {
                    if r.end() > swap.trigger {
                        let e = seen_new.entry(r.worker).or_insert(r.end());
                        *e = (*e).min(r.end());
                    }
                    continue;
                }
                if r.start > first {
                    after += 1;
                    flagged[i] = true;
                }
                if seen_new.get(&r.worker).is_some_and(|&e| r.start >= e) {
                    on_worker += 1;
                    flagged[i] = true;
                }
            }
        }
        reports.push(SwapReport {
            index: swap.index,
            version: swap.version.clone(),
            previous,
            scheduled_s: secs(swap.scheduled),
            trigger_s: secs(swap.trigger),
            action_ms: swap.done.saturating_sub(swap.trigger) as f64 / 1e6,
            action_ok: swap.ok,
            action_detail: swap.detail.clone(),
            first_served_s: first.map(secs),
            time_to_serve_ms: first.map(|f| (f - swap.trigger) as f64 / 1e6),
            served: known.map(|_| first.is_some()),
            commit_s: commit.map(secs),
            window_end_s: secs(to),
            stats: Stats::default(),
            stale_on_worker: on_worker,
            stale_after_served: after,
            note: same.then(|| {
                "the swap loads the version already answering: old and new answers look alike, so time to serve \
                 is unknown and the commit is the action's return"
                    .to_owned()
            }),
            handover: swap.handover.clone(),
        });
        spans.push(Span { from: swap.trigger, commit: commit.map_or(to, |c| c.clamp(swap.trigger, to)), to });
    }
    (reports, spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(start: u64, latency: u64, version: u32, worker: u32) -> Record {
        Record { start, latency, version, error: 0, worker, role: 0 }
    }

    fn swap(trigger: u64, done: u64, version: &str) -> SwapRecord {
        SwapRecord {
            index: 1,
            scheduled: trigger,
            trigger,
            done,
            ok: true,
            detail: String::new(),
            version: Some(version.into()),
            handover: None,
        }
    }

    #[test]
    fn commit_window_and_stale_answers() {
        let versions = vec![String::new(), "1".into(), "2".into()];
        // Worker 0 sees 1, then 2 from 120; worker 1 sees 1 at 130 (after 2 served at 120).
        let records = vec![
            rec(0, 10, 1, 0),
            rec(50, 10, 1, 1),
            rec(100, 20, 2, 0),
            rec(125, 5, 1, 1),
            rec(130, 5, 1, 0),
            rec(140, 5, 2, 1),
        ];
        let mut flagged = vec![false; records.len()];
        let (reports, spans) = measure(&[swap(90, 110, "2")], &records, &versions, 1000, 50, &mut flagged);
        let r = &reports[0];
        assert_eq!(r.previous.as_deref(), Some("1"));
        assert_eq!((r.first_served_s, r.served), (Some(120e-9), Some(true)));
        assert_eq!(r.commit_s, Some(120e-9));
        assert_eq!((spans[0].from, spans[0].to), (90, 170));
        assert_eq!((r.stale_after_served, r.stale_on_worker), (2, 1));
        assert_eq!(flagged, [false, false, false, true, true, false]);
    }

    #[test]
    fn never_served_runs_to_the_end() {
        let versions = vec![String::new(), "1".into()];
        let records = vec![rec(0, 10, 1, 0), rec(200, 10, 1, 0)];
        let mut flagged = vec![false; 2];
        let (reports, spans) = measure(&[swap(100, 110, "9")], &records, &versions, 500, 50, &mut flagged);
        assert_eq!((reports[0].served, reports[0].commit_s), (Some(false), None));
        assert_eq!(spans[0].to, 500);
    }
}
