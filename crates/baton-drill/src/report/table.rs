//! The report on the terminal.

use std::fmt::Write;

use crate::analyze::Analysis;
use crate::analyze::stats::Stats;

/// Milliseconds with a precision that suits their size; `-` for none.
pub fn ms(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v < 1.0 => format!("{v:.3}"),
        Some(v) if v < 100.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.0}"),
    }
}

/// Thousands separated by commas.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

fn stats_row(out: &mut String, label: &str, s: &Stats) {
    let _ = writeln!(
        out,
        "  {label:<22} {:>10} {:>7} {:>9} {:>9} {:>9} {:>9}",
        count(s.requests),
        count(s.failed),
        ms(s.p50_ms),
        ms(s.p99_ms),
        ms(s.p999_ms),
        ms(s.max_ms)
    );
}

/// The whole report as text; `title` is the first line.
pub fn render(title: &str, a: &Analysis) -> String {
    let mut out = format!("{title}\n");
    let versions = a
        .versions
        .iter()
        .map(|v| format!("{} ×{}", if v.version.is_empty() { "(none)" } else { &v.version }, count(v.requests)))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        out,
        "{} requests in {:.2} s ({:.0}/s), {} failed; answered by {}\n",
        count(a.requests),
        a.duration_s,
        a.rate_per_s,
        count(a.failed),
        if versions.is_empty() { "no version".into() } else { versions }
    );
    let _ = writeln!(
        out,
        "  {:<22} {:>10} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "latency (ms)", "requests", "failed", "p50", "p99", "p99.9", "max"
    );
    stats_row(&mut out, "steady", &a.steady);
    if a.rollout.is_none() || a.in_swaps.requests > 0 {
        stats_row(&mut out, "swap windows", &a.in_swaps);
    }
    if a.in_swaps.requests > 0 {
        stats_row(&mut out, "  trigger to commit", &a.in_swaps_loading);
        stats_row(&mut out, "  after commit", &a.in_swaps_after_commit);
    }
    let w = &a.worst_at_equal_size;
    if w.requests > 0 && a.steady.requests != a.in_swaps.requests {
        let _ = writeln!(
            out,
            "  worst at equal size ({} requests each): steady {} ms, swap windows {} ms",
            count(w.requests),
            ms(w.steady_ms),
            ms(w.in_swaps_ms)
        );
    }
    if !a.swaps.is_empty() {
        let _ = writeln!(
            out,
            "\n  {:<4} {:<11} {:>8} {:>10} {:>10} {:>15} {:>8} {:>6} {:>8} {:>8} {:>8}",
            "swap",
            "version",
            "at (s)",
            "action ms",
            "serve ms",
            "window (s)",
            "requests",
            "failed",
            "p50",
            "p99",
            "max"
        );
        for s in &a.swaps {
            let before = s.previous.as_deref().unwrap_or("?");
            // An upgrade keeps the version that serves.
            let after = if s.handover.is_some() { before } else { s.version.as_deref().unwrap_or("?") };
            let change = format!("{before}→{after}");
            let serve = match (s.action_ok, s.time_to_serve_ms, s.served) {
                (false, _, _) => "FAILED".to_owned(),
                (_, Some(t), _) => format!("{t:.1}"),
                (_, None, Some(false)) => "never".to_owned(),
                _ => "-".to_owned(),
            };
            let _ = writeln!(
                out,
                "  {:<4} {:<11} {:>8.2} {:>10.1} {:>10} {:>15} {:>8} {:>6} {:>8} {:>8} {:>8}",
                s.index,
                change,
                s.trigger_s,
                s.action_ms,
                serve,
                format!("{:.2}–{:.2}", s.trigger_s, s.window_end_s),
                count(s.stats.requests),
                count(s.stats.failed),
                ms(s.stats.p50_ms),
                ms(s.stats.p99_ms),
                ms(s.stats.max_ms)
            );
        }
        for s in &a.swaps {
            if !s.action_ok {
                let _ = writeln!(out, "  swap {} failed: {}", s.index, s.action_detail);
            } else if s.handover.is_some() {
                let _ = writeln!(out, "  swap {}: {}", s.index, s.action_detail);
            } else if let Some(note) = &s.note {
                let _ = writeln!(out, "  swap {}: {note}", s.index);
            }
        }
    }
    if let Some(r) = &a.rollout {
        super::rollout_table::render(&mut out, r);
    }
    if a.swaps.len() < a.planned_swaps {
        let _ =
            writeln!(out, "  {} of {} planned swaps were not made", a.planned_swaps - a.swaps.len(), a.planned_swaps);
    }
    let u = &a.unexpected;
    let allowed = match &u.allowed {
        Some(set) => format!("allowed {{{}}}", set.join(", ")),
        None => "allowed set unknown, not checked".into(),
    };
    let _ = writeln!(
        out,
        "\nunexpected versions: {} ({allowed}; outside it {}, stale on a worker {}, stale after the new version served {})",
        u.total, u.outside_allowed, u.stale_on_worker, u.stale_after_served
    );
    if a.errors.is_empty() {
        let _ = writeln!(out, "errors: none");
    } else {
        let _ = writeln!(out, "errors:");
        for e in a.errors.iter().take(10) {
            let _ = writeln!(
                out,
                "  {:>8} × {:<10} {}  ({:.2}–{:.2} s)",
                count(e.count),
                e.kind,
                e.message,
                e.first_s,
                e.last_s
            );
        }
        if a.errors.len() > 10 {
            let _ = writeln!(out, "  … and {} other kinds (see the JSON report)", a.errors.len() - 10);
        }
    }
    if let Some(r) = &a.rss {
        let growth = r.growth_per_swap_bytes.map(|g| format!("{:+.2} MiB per swap", g / (1024.0 * 1024.0)));
        let _ = writeln!(
            out,
            "RSS of pid {}: {} → {} (min {}, max {}){}",
            r.pids.iter().map(u32::to_string).collect::<Vec<_>>().join(" then "),
            mib(r.first_bytes as f64),
            mib(r.last_bytes as f64),
            mib(r.min_bytes as f64),
            mib(r.max_bytes as f64),
            growth.map(|g| format!("; {g} (slope over RSS before each swap and at the end)")).unwrap_or_default()
        );
        let peaks = r.before_swaps.iter().zip(&r.peak_during_swaps).filter(|&(_, &peak)| peak > 0);
        if let Some((before, peak)) = peaks.max_by_key(|&(before, peak)| peak.saturating_sub(*before)) {
            let _ = writeln!(
                out,
                "  peak during a swap: {} ({} over the RSS just before it; the highest of {} swaps)",
                mib(*peak as f64),
                mib(peak.saturating_sub(*before) as f64),
                r.peak_during_swaps.len()
            );
        }
        if let Some(why) = &r.stopped {
            let _ = writeln!(out, "  sampling stopped early: {why}");
        }
    }
    if let Some(st) = &a.stalls {
        let _ = writeln!(
            out,
            "machine stalls ({} {} {}, {} ms sleeps woken over {} ms late): steady {} in {:.0} s ({:.1}/min, max {} ms), swap windows {} in {:.0} s ({:.1}/min, max {} ms)",
            st.cpus,
            if st.realtime { "real-time" } else { "normal-priority" },
            if st.cpus == 1 { "probe" } else { "probes, one per CPU" },
            ms(Some(st.period_ms)),
            ms(Some(st.late_ms)),
            count(st.steady.count),
            st.steady.seconds,
            st.steady.per_minute,
            ms(Some(st.steady.max_ms)),
            count(st.in_swaps.count),
            st.in_swaps.seconds,
            st.in_swaps.per_minute,
            ms(Some(st.in_swaps.max_ms)),
        );
        if let Some(note) = &st.note {
            let _ = writeln!(out, "  the probe was {note}");
        }
        for (kind, slowest) in [("steady", &st.slowest_steady), ("swap windows", &st.slowest_in_swaps)] {
            if slowest.is_empty() {
                continue;
            }
            let list: Vec<String> =
                slowest.iter().map(|r| format!("{} ({})", ms(Some(r.latency_ms)), ms(Some(r.stalled_ms)))).collect();
            let _ = writeln!(out, "  slowest in {kind}, ms (of it the probe stalled too): {}", list.join(", "));
        }
    }
    if a.verdict.clean {
        let made = if a.rollout.is_some() { "the rollout started" } else { "every swap served" };
        let _ = writeln!(out, "\nverdict: clean — no failed request, {made}, no unexpected version");
    } else {
        let _ = writeln!(out, "\nverdict: NOT clean");
        for p in &a.verdict.problems {
            let _ = writeln!(out, "  - {p}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
    }
}
