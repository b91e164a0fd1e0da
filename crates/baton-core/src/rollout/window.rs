//! What requests observe during a rollout, one window at a time: per role,
//! requests, errors and latency; per output, how the candidate's answers
//! compare with the stable version's; shadow copies dropped.
//!
//! Requests record into [`Observations`] (a short lock, no allocation on
//! the request path); the controller takes the window at the end of each
//! interval, which starts the next one and adds the finished one to the
//! rollout's totals.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Role;
use super::compare::{Comparison, Top1, compare_outputs};
use crate::tensors::tensor::Tensor;
use crate::threads::sync::Lock;

/// Shared by the requests of one rollout and its controller.
#[derive(Debug, Default)]
pub struct Observations {
    state: Lock<State>,
    /// Whether only comparison copies time the stable side, which a twin
    /// of the stable version runs ([`super::Rollout::twin`]): the answers
    /// the stable version gives still count as requests and errors, but
    /// their run time, warm from answering most of the traffic, is not the
    /// candidate's like.
    stable_timed_by_copies: bool,
}

/// The open window and the totals of the windows taken before it.
#[derive(Debug, Default)]
struct State {
    open: Sums,
    taken: Sums,
}

impl Observations {
    /// Observations whose stable side is timed by comparison copies only
    /// (see the field); for a rollout with a twin.
    pub fn timing_stable_by_copies() -> Observations {
        Observations { stable_timed_by_copies: true, ..Observations::default() }
    }

    /// Counts one request `role` answered (or failed), with the time its
    /// engine run took when it ran ([`crate::run::executor::timing`]) (see [`super::compare`]'s callers: every
    /// sample of either side is that same measure). Requests to
    /// [`Role::Previous`] are not counted.
    pub fn record(&self, role: Role, latency: Option<Duration>, failed: bool) {
        self.record_run(role, latency, failed, true);
    }

    /// Counts a comparison copy `role` ran (or failed) as a sample of that
    /// side, like [`Observations::record`], but not as an answer: nobody
    /// saw it, so no outcome can follow it.
    pub fn record_copy_run(&self, role: Role, latency: Option<Duration>, failed: bool) {
        self.record_run(role, latency, failed, false);
    }

    fn record_run(&self, role: Role, latency: Option<Duration>, failed: bool, answered: bool) {
        let mut state = self.state.lock();
        let side = match role {
            Role::Stable => &mut state.open.stable,
            Role::Candidate => &mut state.open.candidate,
            Role::Previous => return,
        };
        side.requests += 1;
        side.answered += u64::from(answered);
        side.errors += u64::from(failed);
        let timed = !(answered && role == Role::Stable && self.stable_timed_by_copies);
        if let Some(latency) = latency.filter(|_| timed) {
            side.latency.record(latency);
        }
    }

    /// Compares the outputs the stable version gave for one request with
    /// the candidate's, output by output (matched by name). The comparison
    /// runs before the lock is taken; under it, only sums are added (an
    /// output name is allocated the first time it is seen).
    pub fn record_comparison(&self, stable: &[Tensor], candidate: &[Tensor]) {
        let mut compared = Vec::with_capacity(stable.len());
        compare_outputs(stable, candidate, |name, comparison| compared.push((name, comparison)));
        let mut state = self.state.lock();
        state.open.compared += 1;
        for (name, comparison) in compared {
            match state.open.outputs.get_mut(name) {
                Some(drift) => drift.add(&comparison),
                None => {
                    let mut drift = Drift::default();
                    drift.add(&comparison);
                    state.open.outputs.insert(name.to_owned(), drift);
                }
            }
        }
    }

    /// Counts a comparison that could not run: the candidate (or, paired,
    /// the stable version) failed on the copy.
    pub fn record_comparison_error(&self) {
        self.state.lock().open.comparison_errors += 1;
    }

    /// Adds outcomes posted for answers of `side` (see [`super::outcome`]):
    /// `count` of them, worth `value` in all. They count in the window
    /// open when they arrive, whichever window the answers were in.
    pub fn record_outcomes(&self, side: Role, count: u64, value: f64) {
        let mut state = self.state.lock();
        let tally = match side {
            Role::Stable => &mut state.open.stable,
            Role::Candidate => &mut state.open.candidate,
            Role::Previous => return,
        };
        tally.outcomes = tally.outcomes.saturating_add(count);
        tally.outcome_value = super::outcome::add_saturating(tally.outcome_value, value);
    }

    /// Counts a copy dropped because the comparison queue was full.
    pub fn record_dropped(&self) {
        self.state.lock().open.dropped += 1;
    }

    /// The window since the last take; starts the next one and adds this
    /// one into the totals.
    pub fn take(&self) -> Window {
        self.take_sums().window()
    }

    /// [`Observations::take`], as sums that add up across windows and
    /// across servers: what a fleet's coordinator merges before it judges.
    pub fn take_sums(&self) -> Sums {
        let mut state = self.state.lock();
        let State { open, taken } = &mut *state;
        let sums = open.clone();
        taken.merge(open);
        open.clear();
        sums
    }

    /// Everything observed since the rollout began, the open window
    /// included.
    pub fn totals(&self) -> Window {
        let all = {
            let state = self.state.lock();
            let mut all = state.taken.clone();
            all.merge(&state.open);
            all
        };
        all.window()
    }
}

/// The sums behind a [`Window`], which add up window after window and
/// server after server. Serialised, they are what each server of a fleet
/// publishes for its coordinator to merge.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Sums {
    stable: SideTally,
    candidate: SideTally,
    /// Kept across windows with zeroed sums, so that a known output costs
    /// no allocation; outputs without samples are left out of a window.
    outputs: BTreeMap<String, Drift>,
    compared: u64,
    comparison_errors: u64,
    dropped: u64,
}

impl Sums {
    /// Adds `other`'s sums to these.
    pub fn merge(&mut self, other: &Sums) {
        self.stable.merge(&other.stable);
        self.candidate.merge(&other.candidate);
        for (name, drift) in other.outputs.iter().filter(|(_, d)| d.samples > 0) {
            match self.outputs.get_mut(name) {
                Some(mine) => mine.merge(drift),
                None => {
                    self.outputs.insert(name.clone(), drift.clone());
                }
            }
        }
        self.compared += other.compared;
        self.comparison_errors += other.comparison_errors;
        self.dropped += other.dropped;
    }

    /// Zeroes every sum, keeping the output names.
    fn clear(&mut self) {
        let mut outputs = std::mem::take(&mut self.outputs);
        outputs.values_mut().for_each(|drift| *drift = Drift::default());
        *self = Sums { outputs, ..Sums::default() };
    }

    /// The window these sums make: counts, p99s and drift means.
    pub fn window(&self) -> Window {
        let timed = self.stable.latency.total.min(self.candidate.latency.total);
        let tail = (timed > 0).then(|| {
            let quantile = tail_quantile(timed);
            Tail {
                quantile,
                samples: timed,
                stable_ms: self.stable.latency.quantile_ms(quantile).unwrap_or_default(),
                candidate_ms: self.candidate.latency.quantile_ms(quantile).unwrap_or_default(),
            }
        });
        Window {
            tail,
            stable: self.stable.side(),
            candidate: self.candidate.side(),
            outputs: self
                .outputs
                .iter()
                .filter(|(_, d)| d.samples > 0)
                .map(|(name, drift)| (name.clone(), drift.output()))
                .collect(),
            compared: self.compared,
            comparison_errors: self.comparison_errors,
            dropped: self.dropped,
            metrics: Vec::new(),
            baseline: None,
        }
    }
}

/// One role's counts and latencies.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct SideTally {
    requests: u64,
    answered: u64,
    errors: u64,
    latency: Histogram,
    outcomes: u64,
    /// Never infinite ([`super::outcome::add_saturating`]); a null, which
    /// is how an infinity was written before sums saturated, reads as the
    /// largest finite number.
    #[serde(deserialize_with = "finite_or_max")]
    outcome_value: f64,
}

/// A sum of outcome values as a fleet's records hold it: a number, or
/// null for one that overflowed on a server that did not saturate.
fn finite_or_max<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    let value: Option<f64> = Option::deserialize(deserializer)?;
    Ok(value.map_or(f64::MAX, |v| if v.is_finite() { v } else { f64::MAX }))
}

impl SideTally {
    fn merge(&mut self, other: &SideTally) {
        self.requests += other.requests;
        self.answered += other.answered;
        self.errors += other.errors;
        self.latency.merge(&other.latency);
        self.outcomes = self.outcomes.saturating_add(other.outcomes);
        self.outcome_value = super::outcome::add_saturating(self.outcome_value, other.outcome_value);
    }

    fn side(&self) -> Side {
        Side {
            requests: self.requests,
            answered: self.answered,
            errors: self.errors,
            p99_ms: self.latency.quantile_ms(0.99),
            outcomes: self.outcomes,
            outcome_value: self.outcome_value,
        }
    }
}

/// The sums of one output's comparisons.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct Drift {
    samples: u64,
    mismatched: u64,
    /// NaN once any comparison's was (see [`nan_max`]).
    max_abs_diff: f64,
    rel_l2_sum: f64,
    cosine_sum: f64,
    top1: Top1,
}

impl Drift {
    fn add(&mut self, c: &Comparison) {
        self.samples += 1;
        self.mismatched += u64::from(c.mismatched);
        self.max_abs_diff = nan_max(self.max_abs_diff, c.max_abs_diff);
        self.rel_l2_sum += c.rel_l2;
        self.cosine_sum += c.cosine;
        if let Some(top1) = c.top1 {
            self.add_top1(&top1);
        }
    }

    fn add_top1(&mut self, top1: &Top1) {
        self.top1.rows += top1.rows;
        self.top1.agreeing += top1.agreeing;
        self.top1.unknown += top1.unknown;
    }

    fn merge(&mut self, other: &Drift) {
        self.samples += other.samples;
        self.mismatched += other.mismatched;
        self.max_abs_diff = nan_max(self.max_abs_diff, other.max_abs_diff);
        self.rel_l2_sum += other.rel_l2_sum;
        self.cosine_sum += other.cosine_sum;
        self.add_top1(&other.top1);
    }

    /// Means over the samples; a NaN anywhere stays NaN (a comparison
    /// gives none now, but sums from an earlier server may). Only called
    /// with samples.
    fn output(&self) -> OutputDrift {
        let n = self.samples as f64;
        let top1_agreement = (self.top1.rows > 0)
            .then(|| if self.top1.unknown > 0 { f64::NAN } else { self.top1.agreeing as f64 / self.top1.rows as f64 });
        OutputDrift {
            samples: self.samples,
            max_abs_diff: self.max_abs_diff,
            rel_l2: self.rel_l2_sum / n,
            cosine: self.cosine_sum / n,
            top1_agreement,
            mismatched: self.mismatched,
        }
    }
}

/// The larger of two values, NaN when either is (`f64::max` would drop
/// the NaN, and with it the sign that the window cannot be judged).
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
}

/// Latencies in log-spaced buckets: whole microseconds below 8 µs, then
/// eight buckets per power of two up to 2^27 µs (about 134 s), and one
/// bucket above. A bucket spans at most an eighth of its lower bound, so a
/// quantile read from it is off by at most 12.5%, and usually far less:
/// within its bucket the quantile is interpolated linearly by rank, and it
/// is never above the largest latency recorded.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(into = "Sparse", try_from = "Sparse")]
struct Histogram {
    counts: [u64; BUCKETS],
    total: u64,
    max_nanos: u64,
}

/// A histogram as it travels: only the buckets that counted something.
#[derive(Serialize, Deserialize)]
struct Sparse {
    /// (bucket, count) pairs.
    buckets: Vec<(usize, u64)>,
    max_nanos: u64,
}

impl From<Histogram> for Sparse {
    fn from(h: Histogram) -> Sparse {
        let buckets = h.counts.iter().enumerate().filter(|(_, c)| **c > 0).map(|(i, c)| (i, *c)).collect();
        Sparse { buckets, max_nanos: h.max_nanos }
    }
}

impl TryFrom<Sparse> for Histogram {
    type Error = String;

    fn try_from(s: Sparse) -> Result<Histogram, String> {
        let mut h = Histogram { max_nanos: s.max_nanos, ..Histogram::default() };
        for (index, count) in s.buckets {
            let slot = h.counts.get_mut(index).ok_or_else(|| format!("latency bucket {index} does not exist"))?;
            *slot = slot.saturating_add(count);
            h.total = h.total.saturating_add(count);
        }
        Ok(h)
    }
}

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 3;
/// Below this many microseconds, one bucket per microsecond.
const EXACT: u64 = 1 << SUB_BITS;
/// The first power of two (in microseconds) that goes into the last bucket.
const TOP_BIT: u32 = 27;
const BUCKETS: usize = EXACT as usize + ((TOP_BIT - SUB_BITS) as usize) * EXACT as usize + 1;

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: [0; BUCKETS], total: 0, max_nanos: 0 }
    }
}

impl Histogram {
    fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket_of(nanos / 1000)] += 1;
        self.total += 1;
        self.max_nanos = self.max_nanos.max(nanos);
    }

    fn merge(&mut self, other: &Histogram) {
        self.counts.iter_mut().zip(&other.counts).for_each(|(mine, theirs)| *mine += theirs);
        self.total += other.total;
        self.max_nanos = self.max_nanos.max(other.max_nanos);
    }

    /// The `q` quantile in milliseconds, `None` when nothing was recorded.
    fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let max_micros = self.max_nanos as f64 / 1000.0;
        // The rank (from 1) of the quantile's request.
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut below = 0;
        for (index, &count) in self.counts.iter().enumerate() {
            if below + count >= rank {
                let (low, high) = bucket_bounds(index);
                let high = high.unwrap_or(max_micros);
                let micros = low + (high - low) * (rank - below) as f64 / count as f64;
                return Some(micros.min(max_micros) / 1000.0);
            }
            below += count;
        }
        Some(max_micros / 1000.0)
    }
}

/// The bucket of a latency in whole microseconds.
fn bucket_of(micros: u64) -> usize {
    if micros < EXACT {
        return micros as usize;
    }
    let bit = 63 - micros.leading_zeros();
    if bit >= TOP_BIT {
        return BUCKETS - 1;
    }
    let sub = (micros >> (bit - SUB_BITS)) - EXACT;
    (EXACT + u64::from(bit - SUB_BITS) * EXACT + sub) as usize
}

/// A bucket's bounds in microseconds, lower included; the last bucket has
/// no upper bound.
fn bucket_bounds(index: usize) -> (f64, Option<f64>) {
    let index = index as u64;
    if index < EXACT {
        return (index as f64, Some((index + 1) as f64));
    }
    if index as usize == BUCKETS - 1 {
        return ((1u64 << TOP_BIT) as f64, None);
    }
    let shift = (index - EXACT) / EXACT;
    let sub = (index - EXACT) % EXACT;
    (((EXACT + sub) << shift) as f64, Some(((EXACT + sub + 1) << shift) as f64))
}

/// Timed runs a tail quantile leaves above it, at least: the p99 of fewer
/// than 2,000 runs is read lower, at the quantile these many runs lie
/// above, so that one or two slow runs (a page fault, an interrupt) do not
/// decide a window on their own.
pub const TAIL_RUNS: u64 = 20;

/// The quantile the latency guard reads for `runs` timed runs per side:
/// 0.99, or lower when fewer than `100 × TAIL_RUNS` runs cannot support it.
pub fn tail_quantile(runs: u64) -> f64 {
    if runs == 0 {
        return 0.99;
    }
    (1.0 - TAIL_RUNS as f64 / runs as f64).clamp(0.5, 0.99)
}

/// Both sides' latency at one tail quantile, the one both sides' timed runs
/// support (see [`tail_quantile`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Tail {
    /// The quantile read: 0.99 with enough runs, else lower.
    pub quantile: f64,
    /// Timed runs of the side with fewer.
    pub samples: u64,
    /// The stable side's engine time at that quantile, in milliseconds.
    pub stable_ms: f64,
    /// The candidate's.
    pub candidate_ms: f64,
}

/// What one window (or the whole rollout) observed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Window {
    /// Both sides' latency at the tail quantile the guard reads; `None`
    /// until both sides have a timed run.
    pub tail: Option<Tail>,
    /// Requests the stable version answered.
    pub stable: Side,
    /// Requests the candidate answered, on the response path (canary, A/B)
    /// or as shadow copies.
    pub candidate: Side,
    /// Per output name, how the candidate's answers compare.
    pub outputs: BTreeMap<String, OutputDrift>,
    /// Requests compared (both sides answered).
    pub compared: u64,
    /// Comparisons that could not run because a side failed.
    pub comparison_errors: u64,
    /// Copies dropped because the comparison queue was full.
    pub dropped: u64,
    /// The metric guards' readings, taken when the window ended.
    pub metrics: Vec<MetricReading>,
    /// During the watch after promotion: what the replaced version showed
    /// before it, which stands in for the stable side of the outcome and
    /// metric guards (it answers nobody during the watch).
    pub baseline: Option<Baseline>,
}

/// One metric guard's query, read for both sides when a window ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricReading {
    /// The guard's name.
    pub name: String,
    /// The stable side's value, when the query gave one number.
    pub stable: Option<f64>,
    /// The candidate's.
    pub candidate: Option<f64>,
    /// Why a side has no value, as a sentence.
    pub problem: Option<String>,
}

/// What the version a promotion replaced showed over the rollout, kept for
/// the watch after it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// The version.
    pub version: u64,
    /// Answers it gave clients during the rollout.
    pub requests: u64,
    /// Its outcome value per answer over the rollout, when it answered any.
    pub outcome_rate: Option<f64>,
    /// Each metric guard's last value for it before the promotion.
    pub metrics: BTreeMap<String, f64>,
}

/// One role's requests in a window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Side {
    /// Requests answered or failed, comparison copies included.
    pub requests: u64,
    /// Of those, the ones a client asked for (not comparison copies): the
    /// answers outcomes can follow.
    pub answered: u64,
    /// Of those, failed.
    pub errors: u64,
    /// The 99th percentile latency, in milliseconds, when any request ran.
    pub p99_ms: Option<f64>,
    /// Outcomes posted for its answers, counted in the window they arrived
    /// in.
    pub outcomes: u64,
    /// Their value in all (1 each when posted without a value).
    pub outcome_value: f64,
}

impl Side {
    /// Outcome value per answer a client asked for; `None` when there was
    /// none.
    pub fn outcome_rate(&self) -> Option<f64> {
        (self.answered > 0).then(|| self.outcome_value / self.answered as f64)
    }

    /// Failed requests over all requests; `None` when there were none.
    pub fn error_rate(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.errors as f64 / self.requests as f64)
    }
}

/// How one output of the candidate compares with the stable version's.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OutputDrift {
    /// Comparisons of this output.
    pub samples: u64,
    /// The largest absolute difference of any element.
    pub max_abs_diff: f64,
    /// The mean over comparisons of ‖candidate − stable‖ / ‖stable‖.
    pub rel_l2: f64,
    /// The mean over comparisons of the cosine similarity.
    pub cosine: f64,
    /// For outputs that look like class scores (a batch of rows of two or
    /// more scores): the share of rows whose highest score is the same
    /// class on both sides.
    pub top1_agreement: Option<f64>,
    /// Of the samples, comparisons where the output could not be compared
    /// element by element (left out, another shape, another kind of data):
    /// each counts as the worst drift (see [`super::compare`]).
    pub mismatched: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn scores(values: &[f32]) -> Vec<Tensor> {
        vec![Tensor::from_f32("scores", vec![1, values.len() as i64], values)]
    }

    #[test]
    fn requests_count_per_role_and_previous_is_ignored() {
        let o = Observations::default();
        o.record(Role::Stable, Some(ms(1)), false);
        o.record(Role::Stable, Some(ms(1)), true);
        o.record(Role::Candidate, Some(ms(2)), false);
        o.record(Role::Previous, Some(ms(3)), true);
        let w = o.take();
        assert_eq!((w.stable.requests, w.stable.errors), (2, 1));
        assert_eq!((w.candidate.requests, w.candidate.errors), (1, 0));
        assert_eq!(w.stable.error_rate(), Some(0.5));
    }

    #[test]
    fn sums_travel_as_json_and_merge_across_servers_as_one_server_would_count() {
        let (a, b, both) = (Observations::default(), Observations::default(), Observations::default());
        for (i, o) in [&a, &b].into_iter().enumerate() {
            for n in 0..50u64 {
                let latency = ms(1 + n % 7 + i as u64 * 3);
                o.record(Role::Stable, Some(latency), n % 10 == 0);
                both.record(Role::Stable, Some(latency), n % 10 == 0);
            }
            let drifted = if i == 0 { [0.3, 0.7] } else { [0.9, 0.1] };
            o.record_comparison(&scores(&[0.2, 0.8]), &scores(&drifted));
            both.record_comparison(&scores(&[0.2, 0.8]), &scores(&drifted));
        }
        let mut merged = Sums::default();
        for o in [&a, &b] {
            let json = serde_json::to_string(&o.take_sums()).unwrap();
            merged.merge(&serde_json::from_str::<Sums>(&json).unwrap());
        }
        let (got, want) = (merged.window(), both.take());
        assert_eq!((got.stable.requests, got.stable.errors), (100, 10));
        assert_eq!(got.stable.p99_ms, want.stable.p99_ms, "the latency histogram merges exactly");
        assert_eq!(got.compared, 2);
        let (g, w) = (&got.outputs["scores"], &want.outputs["scores"]);
        assert_eq!((g.samples, g.top1_agreement), (w.samples, w.top1_agreement));
        assert!((g.rel_l2 - w.rel_l2).abs() < 1e-12);
        let bad = r#"{"stable":{"latency":{"buckets":[[100000,1]],"max_nanos":1}}}"#;
        assert!(serde_json::from_str::<Sums>(bad).is_err(), "a bucket that does not exist is refused");
    }

    #[test]
    fn take_starts_a_new_window_and_totals_include_the_open_one() {
        let o = Observations::default();
        o.record(Role::Stable, Some(ms(1)), false);
        o.record_comparison(&scores(&[0.2, 0.8]), &scores(&[0.3, 0.7]));
        o.record_comparison_error();
        o.record_dropped();
        let first = o.take();
        assert_eq!((first.stable.requests, first.compared, first.comparison_errors, first.dropped), (1, 1, 1, 1));
        assert_eq!(first.outputs["scores"].samples, 1);
        o.record(Role::Stable, Some(ms(1)), true);
        let open = o.totals();
        assert_eq!((open.stable.requests, open.stable.errors, open.compared, open.dropped), (2, 1, 1, 1));
        assert_eq!(open.outputs["scores"].samples, 1);
        let second = o.take();
        assert_eq!((second.stable.requests, second.compared, second.dropped), (1, 0, 0));
        assert!(second.outputs.is_empty(), "an output without samples is left out: {:?}", second.outputs);
        assert!(o.take().stable.p99_ms.is_none());
        assert_eq!(o.totals().stable.requests, 2);
    }

    #[test]
    fn drift_is_averaged_and_its_maximum_kept() {
        let o = Observations::default();
        // rel_l2 0 and 1, cosine 1 and 0 (stable (1, 0) against (1, 0) then (0, 1)).
        o.record_comparison(&scores(&[1.0, 0.0]), &scores(&[1.0, 0.0]));
        o.record_comparison(&scores(&[1.0, 0.0]), &scores(&[0.0, 1.0]));
        let d = &o.take().outputs["scores"];
        assert_eq!(d.samples, 2);
        assert_eq!(d.max_abs_diff, 1.0);
        assert!((d.rel_l2 - 2f64.sqrt() / 2.0).abs() < 1e-12, "{}", d.rel_l2);
        assert!((d.cosine - 0.5).abs() < 1e-12, "{}", d.cosine);
        assert_eq!(d.top1_agreement, Some(0.5));
        assert_eq!(d.mismatched, 0);
    }

    #[test]
    fn a_nan_on_one_side_is_a_counted_mismatch_and_on_both_sides_agreement() {
        let o = Observations::default();
        o.record_comparison(&scores(&[1.0, 0.0]), &scores(&[f32::NAN, 0.0]));
        o.record_comparison(&scores(&[f32::NAN, 0.0]), &scores(&[f32::NAN, 0.0]));
        let d = o.take().outputs["scores"].clone();
        assert_eq!((d.samples, d.mismatched), (2, 1), "{d:?}");
        assert_eq!((d.max_abs_diff, d.rel_l2), (f64::INFINITY, f64::INFINITY));
        assert_eq!(d.top1_agreement, Some(0.5), "the mismatch's row disagrees, the NaN pair's agrees");
    }

    #[test]
    fn a_missing_output_is_a_counted_mismatch() {
        let o = Observations::default();
        o.record_comparison(&scores(&[1.0, 0.0]), &[]);
        let w = o.take();
        let d = &w.outputs["scores"];
        assert_eq!((d.samples, d.mismatched, d.rel_l2, d.top1_agreement), (1, 1, f64::INFINITY, Some(0.0)));
        assert_eq!(w.compared, 1);
    }

    #[test]
    fn outputs_not_class_scores_have_no_top1() {
        let o = Observations::default();
        let y = [Tensor::from_f32("y", vec![4, 1], &[1.0, 2.0, 3.0, 4.0])];
        o.record_comparison(&y, &y);
        assert_eq!(o.take().outputs["y"].top1_agreement, None);
    }

    #[test]
    fn buckets_cover_their_range_without_gaps() {
        let mut last = None;
        for micros in (0..1 << 12).chain([(1 << 27) - 1, 1 << 27, u64::MAX]) {
            let b = bucket_of(micros);
            let (low, high) = bucket_bounds(b);
            assert!(low <= micros as f64 && high.is_none_or(|h| (micros as f64) < h), "{micros} µs in bucket {b}");
            if let Some(previous) = last {
                assert!(b >= previous);
            }
            last = Some(b);
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_bounds(BUCKETS - 2).1, Some((1u64 << 27) as f64));
    }

    #[test]
    fn p99_is_within_a_tenth_of_the_true_value() {
        // 1 000 latencies spread from 100 µs to 100 ms, log-uniformly.
        let latencies: Vec<Duration> =
            (0..1000).map(|i| Duration::from_secs_f64(1e-4 * 1000f64.powf(f64::from(i) / 999.0))).collect();
        let mut h = Histogram::default();
        latencies.iter().for_each(|&l| h.record(l));
        let truth = latencies[989].as_secs_f64() * 1000.0;
        let got = h.quantile_ms(0.99).unwrap();
        assert!((got / truth - 1.0).abs() < 0.1, "p99 {got} ms, truly {truth} ms");
        // One request: its own latency, not the top of its bucket.
        let mut one = Histogram::default();
        one.record(Duration::from_micros(1234));
        assert!((one.quantile_ms(0.99).unwrap() - 1.234).abs() < 0.16);
        assert!(one.quantile_ms(0.99).unwrap() <= 1.234);
        // Beyond the last bucket: the largest latency.
        let mut slow = Histogram::default();
        slow.record(Duration::from_secs(500));
        assert_eq!(slow.quantile_ms(0.99), Some(500_000.0));
    }

    #[test]
    fn totals_merge_latencies_of_every_window() {
        let o = Observations::default();
        (0..99).for_each(|_| o.record(Role::Candidate, Some(ms(1)), false));
        let _ = o.take();
        o.record(Role::Candidate, Some(ms(1000)), false);
        o.record(Role::Candidate, Some(ms(1000)), false);
        let all = o.totals().candidate;
        assert_eq!(all.requests, 101);
        let p99 = all.p99_ms.unwrap();
        assert!(p99 > 875.0 && p99 <= 1000.0, "{p99}");
    }
}
