//! Guards: the evidence a candidate must give, window by window, before it
//! takes more traffic, and the rules that judge a window.

use serde::{Deserialize, Serialize};

use super::window::{OutputDrift, Window};
use crate::files::rollout_spec::{Guards, MetricGuard};

impl MetricGuard {
    /// The query for one side: `{{model}}` replaced by the model's name,
    /// escaped as the PromQL string it stands in requires
    /// ([`super::promql`]), `{{version}}` by the side's version,
    /// `{{window}}` by the window's length as a PromQL duration in
    /// milliseconds (`30000ms`). An error for a query in which a name
    /// could change the query's shape (refused when the rollout starts).
    pub fn query_for(&self, model: &str, version: u64, window_ms: u64) -> Result<String, String> {
        super::promql::fill(&self.query, model, version, window_ms)
    }
}

impl Guards {
    /// Refuses thresholds no window could be judged by: each must be a
    /// finite number on the side that makes sense (a ratio above 0, a
    /// distance or an increase at least 0, a cosine in [-1, 1], an
    /// agreement in [0, 1]), and a window needs at least one sample. A NaN
    /// threshold would pass every window: no comparison with NaN is true.
    pub fn check(&self) -> Result<(), String> {
        if self.min_samples == 0 {
            return Err("min_samples must be at least 1".into());
        }
        let within = |name: &str, value: Option<f64>, low: f64, high: f64, open_low: bool| match value {
            Some(v) if !v.is_finite() || v < low || v > high || (open_low && v == low) => {
                let low_side = if open_low { "above" } else { "at least" };
                let range = if high.is_finite() { format!(" and at most {high}") } else { String::new() };
                Err(format!("guard {name} must be a number {low_side} {low}{range}, not {v}"))
            }
            _ => Ok(()),
        };
        within("max_error_rate_increase", self.max_error_rate_increase, 0.0, 1.0, false)?;
        within("max_p99_ratio", self.max_p99_ratio, 0.0, f64::INFINITY, true)?;
        within("max_abs_diff", self.max_abs_diff, 0.0, f64::INFINITY, false)?;
        within("max_rel_l2", self.max_rel_l2, 0.0, f64::INFINITY, false)?;
        within("min_cosine", self.min_cosine, -1.0, 1.0, false)?;
        within("min_top1_agreement", self.min_top1_agreement, 0.0, 1.0, false)?;
        within("min_outcome_ratio", self.min_outcome_ratio, 0.0, f64::INFINITY, true)?;
        let mut names = std::collections::BTreeSet::new();
        for metric in &self.metrics {
            let name = &metric.name;
            let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
            if name.is_empty() || name.len() > 64 || !name.chars().all(word) {
                return Err(format!("a metric guard's name must be 1 to 64 letters, digits, '_' or '-', not '{name}'"));
            }
            if !names.insert(name) {
                return Err(format!("two metric guards are named '{name}'"));
            }
            if metric.query.trim().is_empty() {
                return Err(format!("metric guard {name} has an empty query"));
            }
            super::promql::check(&metric.query).map_err(|why| format!("metric guard {name}: {why}"))?;
            if metric.min_ratio.is_none() && metric.max_ratio.is_none() {
                return Err(format!("metric guard {name} needs min_ratio, max_ratio or both"));
            }
            within(&format!("{name}.min_ratio"), metric.min_ratio, 0.0, f64::INFINITY, true)?;
            within(&format!("{name}.max_ratio"), metric.max_ratio, 0.0, f64::INFINITY, true)?;
        }
        Ok(())
    }
}

/// What a window came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Every guard held, each over enough samples.
    Pass,
    /// A guard failed over enough samples.
    Fail,
    /// Too few samples, or a value that is not a number: neither passes nor
    /// fails.
    Inconclusive,
}

/// One guard's reading in one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// The guard, e.g. `p99_ratio` or `rel_l2:scores`.
    pub guard: String,
    /// The measured value, when there was one.
    pub value: Option<f64>,
    /// The threshold it was held to.
    pub threshold: f64,
    /// The samples it was measured over.
    pub samples: u64,
    /// What it came to.
    pub outcome: Outcome,
    /// Why it has no value, when the reason is not the samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The judgement of one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Fail if any guard failed, else inconclusive if any was, else pass.
    pub outcome: Outcome,
    /// Every guard's reading.
    pub checks: Vec<Check>,
    /// A sentence saying why, for events and status.
    pub reason: String,
}

/// Judges one window against the guards: one [`Check`] per guard, and for
/// the drift guards one per output compared (named `rel_l2:<output>`, or
/// plain `rel_l2` with no value when no output was compared).
///
/// A check is inconclusive when it has fewer than `min_samples` samples or
/// its value is not a number (a NaN in an output); only then can it neither
/// pass nor fail. With enough samples, a value beyond its threshold fails
/// (infinity included: a mismatched output is the worst drift). The window
/// fails if any check failed, is inconclusive if any was or if no guard is
/// set, and passes otherwise.
///
/// The outcome and metric guards compare the candidate with the stable
/// version in the same window, or during the watch after promotion with the
/// window's [`super::window::Baseline`]. When `shadowed` (the candidate's
/// answers reach nobody), no outcome of the candidate's can exist, and the
/// outcome guard is not checked.
pub fn evaluate(guards: &Guards, window: &Window, shadowed: bool) -> Verdict {
    let mut checks = Vec::new();
    let both = window.stable.requests.min(window.candidate.requests);
    if let Some(threshold) = guards.max_error_rate_increase {
        let value = match (window.candidate.error_rate(), window.stable.error_rate()) {
            (Some(candidate), Some(stable)) => Some(candidate - stable),
            _ => None,
        };
        checks.push(judge(guards, "error_rate_increase", value, threshold, both, Bound::Max));
    }
    if let Some(threshold) = guards.max_p99_ratio {
        // The tail both sides' runs support (p99 with enough of them).
        let tail = window.tail.as_ref().map(|t| (Some(t.candidate_ms), Some(t.stable_ms)));
        let value = match tail.unwrap_or((window.candidate.p99_ms, window.stable.p99_ms)) {
            // Both too fast to time apart: the same.
            (Some(candidate), Some(stable)) if candidate == 0.0 && stable == 0.0 => Some(1.0),
            // A ratio to zero says nothing: no value, inconclusive.
            (Some(candidate), Some(stable)) if stable > 0.0 => Some(candidate / stable),
            _ => None,
        };
        checks.push(judge(guards, "p99_ratio", value, threshold, both, Bound::Max));
    }
    let drift: [(&str, Option<f64>, Bound, ReadDrift); 4] = [
        ("max_abs_diff", guards.max_abs_diff, Bound::Max, |d| Some(d.max_abs_diff)),
        ("rel_l2", guards.max_rel_l2, Bound::Max, |d| Some(d.rel_l2)),
        ("cosine", guards.min_cosine, Bound::Min, |d| Some(d.cosine)),
        ("top1_agreement", guards.min_top1_agreement, Bound::Min, |d| d.top1_agreement),
    ];
    for (name, threshold, bound, read) in drift {
        let Some(threshold) = threshold else { continue };
        let before = checks.len();
        for (output, d) in &window.outputs {
            if let Some(value) = read(d) {
                checks.push(judge(guards, &format!("{name}:{output}"), Some(value), threshold, d.samples, bound));
            }
        }
        if checks.len() == before {
            // Nothing to measure it on: no output compared (or, for top-1,
            // none that looks like class scores).
            checks.push(judge(guards, name, None, threshold, 0, bound));
        }
    }
    if let Some(threshold) = guards.min_outcome_ratio.filter(|_| !shadowed) {
        checks.push(outcome_check(guards, window, threshold));
    }
    for metric in &guards.metrics {
        metric_checks(guards, window, metric, &mut checks);
    }
    let any = |outcome| checks.iter().any(|(c, _)| c.outcome == outcome);
    let outcome = if any(Outcome::Fail) {
        Outcome::Fail
    } else if checks.is_empty() || any(Outcome::Inconclusive) {
        Outcome::Inconclusive
    } else {
        Outcome::Pass
    };
    let reason = reason(outcome, &checks, guards.min_samples);
    Verdict { outcome, checks: checks.into_iter().map(|(c, _)| c).collect(), reason }
}

/// The outcome guard: the candidate's outcome value per answer over the
/// stable version's (or the baseline's, during the watch).
fn outcome_check(guards: &Guards, window: &Window, threshold: f64) -> (Check, Bound) {
    let (stable, stable_requests) = match &window.baseline {
        Some(b) => (b.outcome_rate, b.requests),
        None => (window.stable.outcome_rate(), window.stable.answered),
    };
    let samples = stable_requests.min(window.candidate.answered);
    let (value, note) = match (window.candidate.outcome_rate(), stable) {
        (Some(candidate), Some(stable)) if stable > 0.0 => (Some(candidate / stable), None),
        (_, Some(_)) => (None, Some("no outcome was posted for the stable version's answers".to_owned())),
        _ => (None, None),
    };
    let mut check = judge(guards, "outcome_ratio", value, threshold, samples, Bound::Min);
    check.0.note = note;
    check
}

/// A metric guard's checks, one per bound: the candidate's value over the
/// stable one's (or the baseline's, during the watch). No value (the query
/// failed, gave no number or several, gave NaN, or both sides read 0) is
/// inconclusive, never a pass.
fn metric_checks(guards: &Guards, window: &Window, metric: &MetricGuard, checks: &mut Vec<(Check, Bound)>) {
    let name = format!("metric:{}", metric.name);
    let reading = window.metrics.iter().find(|r| r.name == metric.name);
    let (requests, stable) = match &window.baseline {
        Some(b) => (
            b.requests,
            b.metrics
                .get(&metric.name)
                .copied()
                .ok_or("no value was read for the replaced version before the promotion"),
        ),
        None => (window.stable.requests, reading.and_then(|r| r.stable).ok_or("the stable version has no value")),
    };
    let candidate = reading.and_then(|r| r.candidate).ok_or("the candidate has no value");
    let (value, note) = match (candidate, stable) {
        (Ok(c), Ok(s)) if c == 0.0 && s == 0.0 => {
            (None, "both sides read 0, and a ratio of nothing says nothing".to_owned())
        }
        (Ok(c), Ok(0.0)) => (None, format!("the stable side reads 0 and the candidate {c}")),
        (Ok(c), Ok(s)) => (Some(c / s), String::new()),
        (Err(missing), _) | (_, Err(missing)) => {
            let problem = reading.map_or("it was not read", |r| r.problem.as_deref().unwrap_or(""));
            (None, if problem.is_empty() { missing.to_owned() } else { format!("{missing}: {problem}") })
        }
    };
    let samples = requests.min(window.candidate.requests);
    let bounds = [(metric.min_ratio, Bound::Min), (metric.max_ratio, Bound::Max)];
    for (threshold, bound) in bounds.into_iter().filter_map(|(t, b)| t.map(|t| (t, b))) {
        let mut check = judge(guards, &name, value, threshold, samples, bound);
        check.0.note = (!note.is_empty()).then(|| note.clone());
        checks.push(check);
    }
}

/// Reads one statistic of an output's drift, when it has it.
type ReadDrift = fn(&OutputDrift) -> Option<f64>;

/// Which side of its threshold a value must stay on.
#[derive(Clone, Copy)]
enum Bound {
    /// At most the threshold.
    Max,
    /// At least the threshold.
    Min,
}

/// One check, with the bound it was held to (for the reason).
fn judge(
    guards: &Guards,
    guard: &str,
    value: Option<f64>,
    threshold: f64,
    samples: u64,
    bound: Bound,
) -> (Check, Bound) {
    let outcome = match value {
        _ if samples < guards.min_samples => Outcome::Inconclusive,
        None => Outcome::Inconclusive,
        Some(v) if v.is_nan() => Outcome::Inconclusive,
        Some(v) => {
            let beyond = match bound {
                Bound::Max => v > threshold,
                Bound::Min => v < threshold,
            };
            if beyond { Outcome::Fail } else { Outcome::Pass }
        }
    };
    (Check { guard: guard.to_owned(), value, threshold, samples, outcome, note: None }, bound)
}

/// One sentence on the checks that decided `outcome`.
fn reason(outcome: Outcome, checks: &[(Check, Bound)], min_samples: u64) -> String {
    let deciding = || checks.iter().filter(|(c, _)| c.outcome == outcome);
    match outcome {
        Outcome::Pass => "every guard held".to_owned(),
        Outcome::Inconclusive if checks.is_empty() => "no guard is set, so nothing can be judged".to_owned(),
        Outcome::Fail => {
            let failed: Vec<String> = deciding()
                .map(|(c, bound)| {
                    let value = c.value.map_or_else(|| "none".to_owned(), number);
                    let side = match bound {
                        Bound::Max => "above",
                        Bound::Min => "below",
                    };
                    let threshold = number(c.threshold);
                    format!("{} at {value} is {side} its threshold {threshold} over {} samples", c.guard, c.samples)
                })
                .collect();
            format!("failed: {}", failed.join("; "))
        }
        Outcome::Inconclusive => {
            let why: Vec<String> = deciding()
                .map(|(c, _)| match c.value {
                    _ if c.samples < min_samples => {
                        format!("{} has {} of the {min_samples} samples it needs", c.guard, c.samples)
                    }
                    Some(v) if v.is_nan() => format!("{} is not a number over {} samples", c.guard, c.samples),
                    _ => match &c.note {
                        Some(note) => format!("{} has no value to judge: {note}", c.guard),
                        None => format!("{} has no value to judge", c.guard),
                    },
                })
                .collect();
            format!("inconclusive: {}", why.join("; "))
        }
    }
}

/// A value for a sentence: four decimals, or scientific notation for the
/// very small and the very large.
fn number(v: f64) -> String {
    if v == 0.0 || !v.is_finite() || (1e-3..1e6).contains(&v.abs()) {
        let text = format!("{v:.4}");
        let trimmed = if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.') } else { &text };
        trimmed.to_owned()
    } else {
        format!("{v:.3e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::window::{Baseline, MetricReading, Side};

    fn none() -> Guards {
        Guards {
            min_samples: 100,
            max_error_rate_increase: None,
            max_p99_ratio: None,
            max_abs_diff: None,
            max_rel_l2: None,
            min_cosine: None,
            min_top1_agreement: None,
            min_outcome_ratio: None,
            metrics: Vec::new(),
        }
    }

    fn side(requests: u64, errors: u64, p99_ms: f64) -> Side {
        Side { requests, errors, p99_ms: Some(p99_ms), ..Side::default() }
    }

    fn traffic(stable: Side, candidate: Side) -> Window {
        Window { stable, candidate, ..Window::default() }
    }

    fn drift(samples: u64, rel_l2: f64, top1: Option<f64>) -> OutputDrift {
        OutputDrift { samples, max_abs_diff: rel_l2, rel_l2, cosine: 1.0 - rel_l2, top1_agreement: top1, mismatched: 0 }
    }

    fn with_outputs(outputs: &[(&str, OutputDrift)]) -> Window {
        Window {
            outputs: outputs.iter().map(|(n, d)| ((*n).to_owned(), d.clone())).collect(),
            compared: outputs.iter().map(|(_, d)| d.samples).max().unwrap_or(0),
            ..Window::default()
        }
    }

    fn outcomes(v: &Verdict) -> Vec<(&str, Outcome)> {
        v.checks.iter().map(|c| (c.guard.as_str(), c.outcome)).collect()
    }

    #[test]
    fn the_default_guards_pass_a_healthy_window() {
        let v = evaluate(&Guards::default(), &traffic(side(1000, 10, 20.0), side(200, 3, 22.0)), false);
        assert_eq!(v.outcome, Outcome::Pass, "{v:?}");
        assert_eq!(outcomes(&v), [("error_rate_increase", Outcome::Pass), ("p99_ratio", Outcome::Pass)]);
        assert_eq!(v.checks[0].samples, 200, "samples are the smaller side's requests");
        assert!((v.checks[0].value.unwrap() - 0.005).abs() < 1e-12);
        assert!((v.checks[1].value.unwrap() - 1.1).abs() < 1e-12);
        assert_eq!(v.reason, "every guard held");
    }

    #[test]
    fn error_rate_and_p99_fail_beyond_their_thresholds() {
        let guards = Guards::default();
        let v = evaluate(&guards, &traffic(side(1000, 10, 20.0), side(200, 10, 20.0)), false);
        assert_eq!(outcomes(&v), [("error_rate_increase", Outcome::Fail), ("p99_ratio", Outcome::Pass)]);
        assert_eq!(v.outcome, Outcome::Fail);
        assert_eq!(v.reason, "failed: error_rate_increase at 0.04 is above its threshold 0.01 over 200 samples");
        let v = evaluate(&guards, &traffic(side(1000, 10, 20.0), side(200, 2, 31.0)), false);
        assert_eq!(outcomes(&v), [("error_rate_increase", Outcome::Pass), ("p99_ratio", Outcome::Fail)]);
        // At the threshold holds.
        let v = evaluate(&guards, &traffic(side(1000, 10, 20.0), side(200, 2, 30.0)), false);
        assert_eq!(v.outcome, Outcome::Pass);
    }

    #[test]
    fn too_few_samples_are_inconclusive_however_bad_the_value() {
        let v = evaluate(&Guards::default(), &traffic(side(1000, 0, 20.0), side(40, 40, 900.0)), false);
        assert_eq!(v.outcome, Outcome::Inconclusive);
        assert!(v.checks.iter().all(|c| c.outcome == Outcome::Inconclusive && c.samples == 40), "{v:?}");
        assert_eq!(
            v.reason,
            "inconclusive: error_rate_increase has 40 of the 100 samples it needs; p99_ratio has 40 of the 100 samples it needs"
        );
        // No requests at all, even with no minimum: nothing to measure.
        let v = evaluate(&Guards { min_samples: 0, ..Guards::default() }, &Window::default(), false);
        assert_eq!(
            outcomes(&v),
            [("error_rate_increase", Outcome::Inconclusive), ("p99_ratio", Outcome::Inconclusive)]
        );
        assert_eq!(v.checks[0].value, None);
    }

    #[test]
    fn a_zero_stable_p99_gives_no_ratio() {
        let guards = Guards { max_error_rate_increase: None, ..Guards::default() };
        let v = evaluate(&guards, &traffic(side(500, 0, 0.0), side(500, 0, 3.0)), false);
        assert_eq!((v.outcome, v.checks[0].value), (Outcome::Inconclusive, None));
        assert_eq!(v.reason, "inconclusive: p99_ratio has no value to judge");
        let v = evaluate(&guards, &traffic(side(500, 0, 0.0), side(500, 0, 0.0)), false);
        assert_eq!((v.outcome, v.checks[0].value), (Outcome::Pass, Some(1.0)));
        let missing = Window {
            stable: Side { requests: 500, errors: 0, p99_ms: None, ..Side::default() },
            ..traffic(side(0, 0, 1.0), side(500, 0, 1.0))
        };
        assert_eq!(evaluate(&guards, &missing, false).outcome, Outcome::Inconclusive);
    }

    #[test]
    fn nan_is_inconclusive_never_pass_or_fail() {
        let nan = OutputDrift {
            samples: 500,
            max_abs_diff: f64::NAN,
            rel_l2: f64::NAN,
            cosine: f64::NAN,
            top1_agreement: Some(f64::NAN),
            mismatched: 0,
        };
        // Thresholds every number would pass, and ones every number would fail.
        for threshold in [f64::INFINITY, f64::NEG_INFINITY] {
            let guards = Guards {
                max_abs_diff: Some(threshold),
                max_rel_l2: Some(threshold),
                min_cosine: Some(-threshold),
                min_top1_agreement: Some(-threshold),
                ..none()
            };
            let v = evaluate(&guards, &with_outputs(&[("scores", nan.clone())]), false);
            assert_eq!(v.outcome, Outcome::Inconclusive, "{v:?}");
            assert_eq!(v.checks.len(), 4);
            assert!(v.checks.iter().all(|c| c.outcome == Outcome::Inconclusive));
            assert!(v.reason.contains("rel_l2:scores is not a number over 500 samples"), "{}", v.reason);
        }
        let p99_nan = Window {
            candidate: Side { requests: 500, errors: 0, p99_ms: Some(f64::NAN), ..Side::default() },
            ..traffic(side(500, 0, 1.0), side(0, 0, 0.0))
        };
        let v = evaluate(&Guards { max_error_rate_increase: None, ..Guards::default() }, &p99_nan, false);
        assert_eq!(v.outcome, Outcome::Inconclusive);
    }

    #[test]
    fn a_failure_with_enough_samples_wins_over_an_inconclusive_guard() {
        let guards = Guards { max_rel_l2: Some(0.05), ..Guards::default() };
        let window = Window {
            stable: side(1000, 0, 10.0),
            candidate: side(30, 0, 10.0),
            ..with_outputs(&[("scores", drift(400, 0.2, None))])
        };
        let v = evaluate(&guards, &window, false);
        assert_eq!(
            outcomes(&v),
            [
                ("error_rate_increase", Outcome::Inconclusive),
                ("p99_ratio", Outcome::Inconclusive),
                ("rel_l2:scores", Outcome::Fail)
            ]
        );
        assert_eq!(v.outcome, Outcome::Fail);
        assert_eq!(v.reason, "failed: rel_l2:scores at 0.2 is above its threshold 0.05 over 400 samples");
    }

    #[test]
    fn drift_guards_check_each_output_and_top1_only_class_scores() {
        let guards = Guards {
            max_abs_diff: Some(0.5),
            max_rel_l2: Some(0.1),
            min_cosine: Some(0.95),
            min_top1_agreement: Some(0.9),
            ..none()
        };
        let window = with_outputs(&[("embedding", drift(300, 0.01, None)), ("scores", drift(300, 0.02, Some(0.85)))]);
        let v = evaluate(&guards, &window, false);
        assert_eq!(
            outcomes(&v),
            [
                ("max_abs_diff:embedding", Outcome::Pass),
                ("max_abs_diff:scores", Outcome::Pass),
                ("rel_l2:embedding", Outcome::Pass),
                ("rel_l2:scores", Outcome::Pass),
                ("cosine:embedding", Outcome::Pass),
                ("cosine:scores", Outcome::Pass),
                ("top1_agreement:scores", Outcome::Fail),
            ]
        );
        assert_eq!(v.reason, "failed: top1_agreement:scores at 0.85 is below its threshold 0.9 over 300 samples");
        // Cosine below its minimum fails too; at it, holds.
        let low = with_outputs(&[("embedding", drift(300, 0.06, None))]);
        let v = evaluate(&Guards { min_cosine: Some(0.95), ..none() }, &low, false);
        assert_eq!(outcomes(&v), [("cosine:embedding", Outcome::Fail)]);
        let at = with_outputs(&[("embedding", OutputDrift { cosine: 0.95, ..drift(300, 0.0, None) })]);
        assert_eq!(evaluate(&Guards { min_cosine: Some(0.95), ..none() }, &at, false).outcome, Outcome::Pass);
        // Too few comparisons of one output leave only that one inconclusive.
        let v = evaluate(
            &Guards { max_rel_l2: Some(0.1), ..none() },
            &with_outputs(&[("a", drift(300, 0.0, None)), ("b", drift(7, 0.0, None))]),
            false,
        );
        assert_eq!(outcomes(&v), [("rel_l2:a", Outcome::Pass), ("rel_l2:b", Outcome::Inconclusive)]);
        assert_eq!(v.reason, "inconclusive: rel_l2:b has 7 of the 100 samples it needs");
    }

    #[test]
    fn a_mismatched_output_fails_the_drift_guards() {
        let mismatch = OutputDrift {
            samples: 200,
            max_abs_diff: f64::INFINITY,
            rel_l2: f64::INFINITY,
            cosine: -1.0,
            top1_agreement: Some(0.0),
            mismatched: 200,
        };
        let guards = Guards { max_rel_l2: Some(0.1), ..none() };
        let v = evaluate(&guards, &with_outputs(&[("scores", mismatch)]), false);
        assert_eq!(v.outcome, Outcome::Fail);
        assert_eq!(v.reason, "failed: rel_l2:scores at inf is above its threshold 0.1 over 200 samples");
    }

    #[test]
    fn drift_guards_without_comparisons_are_inconclusive() {
        let guards = Guards { max_rel_l2: Some(0.1), min_top1_agreement: Some(0.9), ..none() };
        let v = evaluate(&guards, &Window::default(), false);
        assert_eq!(outcomes(&v), [("rel_l2", Outcome::Inconclusive), ("top1_agreement", Outcome::Inconclusive)]);
        assert!(v.checks.iter().all(|c| c.value.is_none() && c.samples == 0));
        // Outputs compared, but none of them class scores: top-1 cannot be judged.
        let v = evaluate(&guards, &with_outputs(&[("embedding", drift(300, 0.0, None))]), false);
        assert_eq!(outcomes(&v), [("rel_l2:embedding", Outcome::Pass), ("top1_agreement", Outcome::Inconclusive)]);
        assert_eq!(v.outcome, Outcome::Inconclusive);
    }

    #[test]
    fn no_guard_at_all_is_inconclusive() {
        let v = evaluate(&none(), &traffic(side(1000, 0, 1.0), side(1000, 0, 1.0)), false);
        assert_eq!((v.outcome, v.checks.len()), (Outcome::Inconclusive, 0));
        assert_eq!(v.reason, "no guard is set, so nothing can be judged");
    }

    #[test]
    fn numbers_in_reasons_are_short() {
        assert_eq!(number(0.04), "0.04");
        assert_eq!(number(1.5), "1.5");
        assert_eq!(number(2.0), "2");
        assert_eq!(number(0.0), "0");
        assert_eq!(number(0.00001234), "1.234e-5");
        assert_eq!(number(f64::INFINITY), "inf");
    }

    fn answered(requests: u64, outcome_value: f64) -> Side {
        Side { requests, answered: requests, outcome_value, outcomes: outcome_value as u64, ..Side::default() }
    }

    #[test]
    fn the_outcome_guard_holds_the_candidates_rate_to_the_stables() {
        let guards = Guards { min_outcome_ratio: Some(0.95), ..none() };
        let judged = |stable, candidate, shadowed| evaluate(&guards, &traffic(stable, candidate), shadowed);
        // 10 % against 5 % per answer: a ratio of 0.5.
        let v = judged(answered(1000, 100.0), answered(500, 25.0), false);
        assert_eq!(outcomes(&v), [("outcome_ratio", Outcome::Fail)]);
        assert!((v.checks[0].value.unwrap() - 0.5).abs() < 1e-12);
        assert!(v.reason.contains("outcome_ratio at 0.5 is below its threshold 0.95 over 500 samples"), "{}", v.reason);
        assert_eq!(judged(answered(1000, 100.0), answered(500, 49.0), false).outcome, Outcome::Pass);
        // Too few answers on one side, or no outcome on the stable side: no verdict.
        assert_eq!(judged(answered(1000, 100.0), answered(99, 0.0), false).outcome, Outcome::Inconclusive);
        let v = judged(answered(1000, 0.0), answered(500, 20.0), false);
        assert_eq!(v.outcome, Outcome::Inconclusive);
        assert!(v.reason.contains("no outcome was posted for the stable version's answers"), "{}", v.reason);
        // A shadow's answers reach nobody: nothing to hold against it.
        assert!(judged(answered(1000, 100.0), answered(500, 0.0), true).checks.is_empty());
    }

    #[test]
    fn during_the_watch_the_baseline_stands_in_for_the_stable_side() {
        let guards = Guards { min_outcome_ratio: Some(0.95), ..none() };
        let baseline = Baseline { version: 1, requests: 5000, outcome_rate: Some(0.1), ..Baseline::default() };
        let window = Window { candidate: answered(1000, 50.0), baseline: Some(baseline), ..Window::default() };
        let v = evaluate(&guards, &window, false);
        assert_eq!(outcomes(&v), [("outcome_ratio", Outcome::Fail)]);
        assert_eq!(v.checks[0].samples, 1000);
    }

    fn metric(min_ratio: Option<f64>, max_ratio: Option<f64>) -> Guards {
        let query = "sum(rate(clicks{version=\"{{version}}\"}[{{window}}]))".to_owned();
        Guards { metrics: vec![MetricGuard { name: "ctr".into(), query, min_ratio, max_ratio }], ..none() }
    }

    fn read(stable: Option<f64>, candidate: Option<f64>, problem: Option<&str>) -> Window {
        let reading = MetricReading { name: "ctr".into(), stable, candidate, problem: problem.map(str::to_owned) };
        Window { metrics: vec![reading], ..traffic(answered(1000, 0.0), answered(1000, 0.0)) }
    }

    #[test]
    fn a_metric_guard_judges_the_ratio_of_its_two_readings() {
        let guards = metric(Some(0.9), Some(1.2));
        assert_eq!(guards.metrics[0].query_for("m", 7, 3000).unwrap(), "sum(rate(clicks{version=\"7\"}[3000ms]))");
        let v = evaluate(&guards, &read(Some(0.1), Some(0.05), None), false);
        assert_eq!(outcomes(&v), [("metric:ctr", Outcome::Fail), ("metric:ctr", Outcome::Pass)]);
        let v = evaluate(&guards, &read(Some(0.1), Some(0.13), None), false);
        assert_eq!(outcomes(&v), [("metric:ctr", Outcome::Pass), ("metric:ctr", Outcome::Fail)]);
        assert_eq!(evaluate(&guards, &read(Some(0.1), Some(0.1), None), false).outcome, Outcome::Pass);
    }

    #[test]
    fn no_data_is_never_a_pass() {
        let guards = metric(Some(0.9), None);
        let cases = [
            (read(Some(0.1), None, Some("candidate version 2: the query gave no series: no data")), "no series"),
            (read(None, Some(0.1), Some("stable version 1: Prometheus at x did not answer")), "did not answer"),
            (read(Some(0.0), Some(0.0), None), "both sides read 0"),
            (read(Some(0.0), Some(0.3), None), "the stable side reads 0"),
            (Window { metrics: Vec::new(), ..read(None, None, None) }, "it was not read"),
        ];
        for (window, why) in cases {
            let v = evaluate(&guards, &window, false);
            assert_eq!(v.outcome, Outcome::Inconclusive, "{why}");
            assert!(v.reason.contains(why), "{why}: {}", v.reason);
        }
    }

    #[test]
    fn metric_guards_are_checked_for_name_query_and_bounds() {
        assert!(metric(Some(0.9), None).check().is_ok());
        assert!(metric(None, None).check().unwrap_err().contains("needs min_ratio"));
        assert!(metric(Some(f64::NAN), None).check().is_err());
        assert!(metric(None, Some(0.0)).check().is_err());
        let mut two = metric(Some(0.9), None);
        two.metrics.push(two.metrics[0].clone());
        assert!(two.check().unwrap_err().contains("two metric guards"));
        let mut blank = metric(Some(0.9), None);
        blank.metrics[0].query = " ".into();
        assert!(blank.check().is_err());
        blank.metrics[0].name = "a b".into();
        assert!(blank.check().is_err());
        assert!(Guards { min_outcome_ratio: Some(0.0), ..none() }.check().is_err());
    }
}
