//! Guards: the evidence a candidate must give, window by window, before it
//! takes more traffic, and the rules that judge a window.

use serde::{Deserialize, Serialize};

use super::window::{OutputDrift, Window};

/// Thresholds a candidate's window is held to, against the stable version
/// in the same window. A guard set to `None` is not checked.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Guards {
    /// Requests each side must have in a window (comparisons, for the drift
    /// guards) before the window can pass or fail.
    pub min_samples: u64,
    /// The candidate's error rate may exceed the stable version's by at
    /// most this much (0.01 = one percentage point).
    pub max_error_rate_increase: Option<f64>,
    /// The candidate's p99 latency over the stable version's.
    pub max_p99_ratio: Option<f64>,
    /// The largest absolute difference of any output element.
    pub max_abs_diff: Option<f64>,
    /// The mean relative L2 distance of an output.
    pub max_rel_l2: Option<f64>,
    /// The mean cosine similarity of an output.
    pub min_cosine: Option<f64>,
    /// The share of rows of a class-score output with the same top class.
    pub min_top1_agreement: Option<f64>,
}

impl Default for Guards {
    fn default() -> Self {
        Guards {
            min_samples: 100,
            max_error_rate_increase: Some(0.01),
            max_p99_ratio: Some(1.5),
            max_abs_diff: None,
            max_rel_l2: None,
            min_cosine: None,
            min_top1_agreement: None,
        }
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
pub fn evaluate(guards: &Guards, window: &Window) -> Verdict {
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
    (Check { guard: guard.to_owned(), value, threshold, samples, outcome }, bound)
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
                    _ => format!("{} has no value to judge", c.guard),
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
    use crate::rollout::window::Side;

    fn none() -> Guards {
        Guards {
            min_samples: 100,
            max_error_rate_increase: None,
            max_p99_ratio: None,
            max_abs_diff: None,
            max_rel_l2: None,
            min_cosine: None,
            min_top1_agreement: None,
        }
    }

    fn side(requests: u64, errors: u64, p99_ms: f64) -> Side {
        Side { requests, errors, p99_ms: Some(p99_ms) }
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
        let v = evaluate(&Guards::default(), &traffic(side(1000, 10, 20.0), side(200, 3, 22.0)));
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
        let v = evaluate(&guards, &traffic(side(1000, 10, 20.0), side(200, 10, 20.0)));
        assert_eq!(outcomes(&v), [("error_rate_increase", Outcome::Fail), ("p99_ratio", Outcome::Pass)]);
        assert_eq!(v.outcome, Outcome::Fail);
        assert_eq!(v.reason, "failed: error_rate_increase at 0.04 is above its threshold 0.01 over 200 samples");
        let v = evaluate(&guards, &traffic(side(1000, 10, 20.0), side(200, 2, 31.0)));
        assert_eq!(outcomes(&v), [("error_rate_increase", Outcome::Pass), ("p99_ratio", Outcome::Fail)]);
        // At the threshold holds.
        let v = evaluate(&guards, &traffic(side(1000, 10, 20.0), side(200, 2, 30.0)));
        assert_eq!(v.outcome, Outcome::Pass);
    }

    #[test]
    fn too_few_samples_are_inconclusive_however_bad_the_value() {
        let v = evaluate(&Guards::default(), &traffic(side(1000, 0, 20.0), side(40, 40, 900.0)));
        assert_eq!(v.outcome, Outcome::Inconclusive);
        assert!(v.checks.iter().all(|c| c.outcome == Outcome::Inconclusive && c.samples == 40), "{v:?}");
        assert_eq!(
            v.reason,
            "inconclusive: error_rate_increase has 40 of the 100 samples it needs; p99_ratio has 40 of the 100 samples it needs"
        );
        // No requests at all, even with no minimum: nothing to measure.
        let v = evaluate(&Guards { min_samples: 0, ..Guards::default() }, &Window::default());
        assert_eq!(
            outcomes(&v),
            [("error_rate_increase", Outcome::Inconclusive), ("p99_ratio", Outcome::Inconclusive)]
        );
        assert_eq!(v.checks[0].value, None);
    }

    #[test]
    fn a_zero_stable_p99_gives_no_ratio() {
        let guards = Guards { max_error_rate_increase: None, ..Guards::default() };
        let v = evaluate(&guards, &traffic(side(500, 0, 0.0), side(500, 0, 3.0)));
        assert_eq!((v.outcome, v.checks[0].value), (Outcome::Inconclusive, None));
        assert_eq!(v.reason, "inconclusive: p99_ratio has no value to judge");
        let v = evaluate(&guards, &traffic(side(500, 0, 0.0), side(500, 0, 0.0)));
        assert_eq!((v.outcome, v.checks[0].value), (Outcome::Pass, Some(1.0)));
        let missing = Window {
            stable: Side { requests: 500, errors: 0, p99_ms: None },
            ..traffic(side(0, 0, 1.0), side(500, 0, 1.0))
        };
        assert_eq!(evaluate(&guards, &missing).outcome, Outcome::Inconclusive);
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
            let v = evaluate(&guards, &with_outputs(&[("scores", nan.clone())]));
            assert_eq!(v.outcome, Outcome::Inconclusive, "{v:?}");
            assert_eq!(v.checks.len(), 4);
            assert!(v.checks.iter().all(|c| c.outcome == Outcome::Inconclusive));
            assert!(v.reason.contains("rel_l2:scores is not a number over 500 samples"), "{}", v.reason);
        }
        let p99_nan = Window {
            candidate: Side { requests: 500, errors: 0, p99_ms: Some(f64::NAN) },
            ..traffic(side(500, 0, 1.0), side(0, 0, 0.0))
        };
        let v = evaluate(&Guards { max_error_rate_increase: None, ..Guards::default() }, &p99_nan);
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
        let v = evaluate(&guards, &window);
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
        let v = evaluate(&guards, &window);
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
        let v = evaluate(&Guards { min_cosine: Some(0.95), ..none() }, &low);
        assert_eq!(outcomes(&v), [("cosine:embedding", Outcome::Fail)]);
        let at = with_outputs(&[("embedding", OutputDrift { cosine: 0.95, ..drift(300, 0.0, None) })]);
        assert_eq!(evaluate(&Guards { min_cosine: Some(0.95), ..none() }, &at).outcome, Outcome::Pass);
        // Too few comparisons of one output leave only that one inconclusive.
        let v = evaluate(
            &Guards { max_rel_l2: Some(0.1), ..none() },
            &with_outputs(&[("a", drift(300, 0.0, None)), ("b", drift(7, 0.0, None))]),
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
        let v = evaluate(&guards, &with_outputs(&[("scores", mismatch)]));
        assert_eq!(v.outcome, Outcome::Fail);
        assert_eq!(v.reason, "failed: rel_l2:scores at inf is above its threshold 0.1 over 200 samples");
    }

    #[test]
    fn drift_guards_without_comparisons_are_inconclusive() {
        let guards = Guards { max_rel_l2: Some(0.1), min_top1_agreement: Some(0.9), ..none() };
        let v = evaluate(&guards, &Window::default());
        assert_eq!(outcomes(&v), [("rel_l2", Outcome::Inconclusive), ("top1_agreement", Outcome::Inconclusive)]);
        assert!(v.checks.iter().all(|c| c.value.is_none() && c.samples == 0));
        // Outputs compared, but none of them class scores: top-1 cannot be judged.
        let v = evaluate(&guards, &with_outputs(&[("embedding", drift(300, 0.0, None))]));
        assert_eq!(outcomes(&v), [("rel_l2:embedding", Outcome::Pass), ("top1_agreement", Outcome::Inconclusive)]);
        assert_eq!(v.outcome, Outcome::Inconclusive);
    }

    #[test]
    fn no_guard_at_all_is_inconclusive() {
        let v = evaluate(&none(), &traffic(side(1000, 0, 1.0), side(1000, 0, 1.0)));
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
}
