//! Everything the drill concludes from its records, after the load: totals,
//! steady windows against swap windows, each swap, errors grouped,
//! versions, unexpected answers, RSS, the time series and the verdict.

pub mod rollout;
pub mod series;
pub mod stalls;
pub mod stats;
pub mod swaps;

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;
use series::{RssReport, Series};
use stats::{Collector, EqualWorst, Stats};
use swaps::{Span, SwapReport};

use super::record::{Record, WorkerLog};
use super::rss::Samples;
use super::stalls::Probe;
use super::swap::SwapRecord;

/// The merged records of a run, and what else happened in it.
pub struct Run {
    /// Every request, sorted by start; version and error ids index the tables below.
    pub records: Vec<Record>,
    /// Version strings; 0 is "none".
    pub versions: Vec<String>,
    /// (kind, message) of each distinct error.
    pub errors: Vec<(String, String)>,
    /// When the load ended, ns.
    pub end: u64,
    /// The swaps made.
    pub swaps: Vec<SwapRecord>,
    /// The swaps planned.
    pub planned_swaps: usize,
    /// W, ns.
    pub window: u64,
    /// The server's pid and its RSS samples.
    pub rss: Option<(u32, Samples)>,
    /// --allow-versions.
    pub allow: Vec<String>,
    /// What the stall probe saw, when --stall-probe was given.
    pub probe: Option<Probe>,
    /// The rollout, with --swap rollout.
    pub rollout: Option<crate::rollout::RolloutRecord>,
}

/// Merges the workers' logs into one table of records sorted by start.
pub fn merge(logs: &[WorkerLog]) -> (Vec<Record>, Vec<String>, Vec<(String, String)>) {
    let mut versions = vec![String::new()];
    let mut errors: Vec<(String, String)> = Vec::new();
    let mut records = Vec::with_capacity(logs.iter().map(|l| l.records.len()).sum());
    for log in logs {
        let version_map: Vec<u32> = log
            .versions
            .iter()
            .map(|v| match versions.iter().position(|x| x == v) {
                Some(i) => i as u32,
                None => {
                    versions.push(v.clone());
                    (versions.len() - 1) as u32
                }
            })
            .collect();
        let error_map: Vec<u32> = log
            .errors
            .iter()
            .map(|e| match errors.iter().position(|x| x == e) {
                Some(i) => i as u32 + 1,
                None => {
                    errors.push(e.clone());
                    errors.len() as u32
                }
            })
            .collect();
        records.extend(log.records.iter().map(|r| Record {
            version: version_map[r.version as usize],
            error: if r.error == 0 { 0 } else { error_map[r.error as usize - 1] },
            ..*r
        }));
    }
    records.sort_by_key(|r| (r.start, r.worker));
    (records, versions, errors)
}

/// A steady or swap window.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    /// `steady` or `swap`.
    pub kind: &'static str,
    /// The swap, for a swap window.
    pub swap: Option<usize>,
    /// Start, s.
    pub from_s: f64,
    /// End, s.
    pub to_s: f64,
    /// Requests started in it.
    pub stats: Stats,
}

/// Errors of one kind and message.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorGroup {
    /// e.g. `connect`, `http 503`.
    pub kind: String,
    /// The message.
    pub message: String,
    /// How many.
    pub count: u64,
    /// First one's start, s.
    pub first_s: f64,
    /// Last one's start, s.
    pub last_s: f64,
}

/// Requests a version answered.
#[derive(Clone, Debug, Serialize)]
pub struct VersionCount {
    /// The version (empty: the answer named none).
    pub version: String,
    /// How many.
    pub requests: u64,
    /// First answer's start, s.
    pub first_s: f64,
    /// Last answer's start, s.
    pub last_s: f64,
}

/// Answers from versions that should not have answered.
#[derive(Clone, Debug, Serialize)]
pub struct Unexpected {
    /// The versions allowed to answer; none when it cannot be known (a
    /// swap's version is unknown and --allow-versions was not given).
    pub allowed: Option<Vec<String>>,
    /// Answers from a version outside `allowed`.
    pub outside_allowed: u64,
    /// Answers from an older version on a worker that already had the new one.
    pub stale_on_worker: u64,
    /// Answers from an older version after the new one first answered.
    pub stale_after_served: u64,
    /// Requests flagged by any of the three.
    pub total: u64,
    /// Up to 20 of them: (start s, worker, version).
    pub examples: Vec<(f64, u32, String)>,
}

/// Did the server keep the promise?
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// No failed request, every swap made and served, no unexpected version.
    pub clean: bool,
    /// What was not.
    pub problems: Vec<String>,
}

/// Everything concluded.
#[derive(Clone, Debug, Serialize)]
pub struct Analysis {
    /// Requests started.
    pub requests: u64,
    /// Of which failed.
    pub failed: u64,
    /// How long the load ran, s.
    pub duration_s: f64,
    /// Requests per second.
    pub rate_per_s: f64,
    /// Requests outside every swap window.
    pub steady: Stats,
    /// Requests inside swap windows.
    pub in_swaps: Stats,
    /// Of those, the ones started between a trigger and its commit, while
    /// the new version was being made ready.
    pub in_swaps_loading: Stats,
    /// The rest of them: started after a commit, before the window's end.
    pub in_swaps_after_commit: Stats,
    /// The worst latency of both, at the same number of requests.
    pub worst_at_equal_size: EqualWorst,
    /// Every window in time order.
    pub windows: Vec<Window>,
    /// Each swap.
    pub swaps: Vec<SwapReport>,
    /// Swaps planned (more than made if the load stopped first).
    pub planned_swaps: usize,
    /// Failures grouped, most frequent first.
    pub errors: Vec<ErrorGroup>,
    /// Versions that answered.
    pub versions: Vec<VersionCount>,
    /// Answers from unexpected versions.
    pub unexpected: Unexpected,
    /// The server's RSS, when --pid was given.
    pub rss: Option<RssReport>,
    /// The machine's stalls, when --stall-probe was given.
    pub stalls: Option<stalls::StallReport>,
    /// Latency over time.
    pub series: Series,
    /// The rollout, with --swap rollout.
    pub rollout: Option<rollout::RolloutReport>,
    /// The verdict.
    pub verdict: Verdict,
}

/// Nanoseconds as seconds.
pub(crate) fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Analyses a run.
pub fn analyze(run: &Run) -> Analysis {
    let records = &run.records;
    let mut flagged = vec![false; records.len()];
    let (mut swap_reports, spans) =
        swaps::measure(&run.swaps, records, &run.versions, run.end, run.window, &mut flagged);
    let windows = windows(records, &spans, &mut swap_reports, run.end);
    let (mut steady, mut in_swaps) = (Collector::default(), Collector::default());
    let (mut loading, mut after_commit) = (Collector::default(), Collector::default());
    let (mut slowest_steady, mut slowest_in_swaps) = (stalls::Slowest::default(), stalls::Slowest::default());
    let mut in_span = spans.iter().peekable();
    for (i, r) in records.iter().enumerate() {
        while in_span.peek().is_some_and(|s| r.start >= s.to) {
            in_span.next();
        }
        match in_span.peek() {
            Some(s) if r.start >= s.from => {
                in_swaps.add(r.latency, r.ok());
                if r.start < s.commit { &mut loading } else { &mut after_commit }.add(r.latency, r.ok());
                slowest_in_swaps.add(r, i);
            }
            _ => {
                steady.add(r.latency, r.ok());
                slowest_steady.add(r, i);
            }
        }
    }
    let unexpected = unexpected(run, &swap_reports, &mut flagged);
    let failed = records.iter().filter(|r| !r.ok()).count() as u64;
    let triggers: Vec<u64> = run.swaps.iter().map(|s| s.trigger).collect();
    let rss = run.rss.as_ref().and_then(|(pid, samples)| series::rss(*pid, samples, &triggers));
    let (steady_stats, in_swaps_stats) = (steady.stats(), in_swaps.stats());
    let worst_at_equal_size = EqualWorst::of(&mut steady, &mut in_swaps);
    let mut analysis = Analysis {
        requests: records.len() as u64,
        failed,
        duration_s: secs(run.end),
        rate_per_s: if run.end > 0 { records.len() as f64 / secs(run.end) } else { 0.0 },
        steady: steady_stats,
        in_swaps: in_swaps_stats,
        in_swaps_loading: loading.stats(),
        in_swaps_after_commit: after_commit.stats(),
        worst_at_equal_size,
        windows,
        swaps: swap_reports,
        planned_swaps: run.planned_swaps,
        errors: error_groups(run),
        versions: version_counts(run),
        unexpected,
        rss,
        stalls: run
            .probe
            .as_ref()
            .map(|p| stalls::report(p, &spans, run.end, records, [&slowest_steady, &slowest_in_swaps])),
        series: series::series(records, &run.versions, run.end),
        rollout: run.rollout.as_ref().map(|r| rollout::measure(r, records, run.end)),
        verdict: Verdict { clean: true, problems: Vec::new() },
    };
    analysis.verdict = verdict(&analysis);
    analysis
}

/// The steady and swap windows, with the stats of the requests started in
/// each; fills each swap report's stats.
fn windows(records: &[Record], spans: &[Span], reports: &mut [SwapReport], end: u64) -> Vec<Window> {
    let mut bounds: Vec<(u64, u64, Option<usize>)> = Vec::new();
    let mut at = 0;
    for (k, span) in spans.iter().enumerate() {
        if span.from > at {
            bounds.push((at, span.from, None));
        }
        bounds.push((span.from, span.to, Some(k)));
        at = span.to;
    }
    if end > at || bounds.is_empty() {
        bounds.push((at, end.max(at), None));
    }
    let mut collectors: Vec<Collector> = bounds.iter().map(|_| Collector::default()).collect();
    for r in records {
        let i = bounds.partition_point(|b| b.1 <= r.start).min(bounds.len() - 1);
        collectors[i].add(r.latency, r.ok());
    }
    bounds
        .iter()
        .zip(collectors.iter_mut())
        .map(|(&(from, to, swap), c)| {
            let stats = c.stats();
            if let Some(k) = swap {
                reports[k].stats = stats.clone();
            }
            Window {
                kind: if swap.is_some() { "swap" } else { "steady" },
                swap: swap.map(|k| reports[k].index),
                from_s: secs(from),
                to_s: secs(to),
                stats,
            }
        })
        .collect()
}

fn unexpected(run: &Run, reports: &[SwapReport], flagged: &mut [bool]) -> Unexpected {
    let first_trigger = run.swaps.first().map_or(u64::MAX, |s| s.trigger);
    let allowed: Option<BTreeSet<String>> = if !run.allow.is_empty() {
        Some(run.allow.iter().cloned().collect())
    } else if run.swaps.iter().all(|s| !s.ok || s.version.is_some()) {
        let mut set: BTreeSet<String> = run
            .records
            .iter()
            .filter(|r| r.ok() && r.end() <= first_trigger)
            .map(|r| run.versions[r.version as usize].clone())
            .collect();
        set.extend(run.swaps.iter().filter(|s| s.ok).filter_map(|s| s.version.clone()));
        Some(set)
    } else {
        None
    };
    let mut outside = 0;
    if let Some(allowed) = &allowed {
        for (i, r) in run.records.iter().enumerate() {
            if r.ok() && !allowed.contains(&run.versions[r.version as usize]) {
                outside += 1;
                flagged[i] = true;
            }
        }
    }
    let examples = run
        .records
        .iter()
        .zip(flagged.iter())
        .filter(|(_, f)| **f)
        .take(20)
        .map(|(r, _)| (secs(r.start), r.worker, run.versions[r.version as usize].clone()))
        .collect();
    Unexpected {
        allowed: allowed.map(|a| a.into_iter().collect()),
        outside_allowed: outside,
        stale_on_worker: reports.iter().map(|r| r.stale_on_worker).sum(),
        stale_after_served: reports.iter().map(|r| r.stale_after_served).sum(),
        total: flagged.iter().filter(|f| **f).count() as u64,
        examples,
    }
}

fn error_groups(run: &Run) -> Vec<ErrorGroup> {
    let mut groups: HashMap<u32, ErrorGroup> = HashMap::new();
    for r in run.records.iter().filter(|r| !r.ok()) {
        let (kind, message) = &run.errors[r.error as usize - 1];
        let g = groups.entry(r.error).or_insert_with(|| ErrorGroup {
            kind: kind.clone(),
            message: message.clone(),
            count: 0,
            first_s: secs(r.start),
            last_s: secs(r.start),
        });
        g.count += 1;
        g.last_s = secs(r.start);
    }
    let mut groups: Vec<ErrorGroup> = groups.into_values().collect();
    groups.sort_by(|a, b| b.count.cmp(&a.count).then(a.first_s.total_cmp(&b.first_s)));
    groups
}

fn version_counts(run: &Run) -> Vec<VersionCount> {
    let mut counts: Vec<Option<VersionCount>> = vec![None; run.versions.len()];
    for r in run.records.iter().filter(|r| r.ok()) {
        let c = counts[r.version as usize].get_or_insert_with(|| VersionCount {
            version: run.versions[r.version as usize].clone(),
            requests: 0,
            first_s: secs(r.start),
            last_s: secs(r.start),
        });
        c.requests += 1;
        c.last_s = secs(r.start);
    }
    let mut counts: Vec<VersionCount> = counts.into_iter().flatten().collect();
    counts.sort_by(|a, b| a.first_s.total_cmp(&b.first_s));
    counts
}

fn verdict(a: &Analysis) -> Verdict {
    let mut problems = Vec::new();
    if a.requests == 0 {
        problems.push("no request was sent".to_owned());
    }
    if a.failed > 0 {
        let top = a.errors.first().map(|e| format!(" (most: {} — {})", e.kind, e.message)).unwrap_or_default();
        problems.push(format!("{} of {} requests failed{top}", a.failed, a.requests));
    }
    for s in &a.swaps {
        if !s.action_ok {
            problems.push(format!("swap {}: the action failed: {}", s.index, s.action_detail));
        } else if s.served == Some(false) {
            let v = s.version.as_deref().unwrap_or("?");
            problems.push(format!("swap {}: version {v} never answered before the load ended", s.index));
        }
    }
    if a.swaps.len() < a.planned_swaps {
        problems.push(format!(
            "only {} of {} swaps were made before the load stopped (raise --duration or --max-requests)",
            a.swaps.len(),
            a.planned_swaps
        ));
    }
    if let Some(r) = a.rollout.as_ref().filter(|r| !r.started) {
        problems.push(format!("the rollout did not start: {}", r.detail));
    }
    if a.unexpected.total > 0 {
        problems.push(format!("{} answers came from an unexpected version", a.unexpected.total));
    }
    Verdict { clean: problems.is_empty(), problems }
}
