//! The chart, as hand-written SVG: latency over time (p50, p99 and max per
//! bucket, log scale), failures as red marks under it, the answering
//! version as a coloured strip over it, each swap's window as a shaded band
//! with its trigger (dashed) and commit (solid) lines, and the server's RSS
//! in a second panel when it was sampled.

use std::fmt::Write;

use crate::analyze::Analysis;
use crate::analyze::series::Point;

const WIDTH: f64 = 1100.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 78.0;
const LATENCY_HEIGHT: f64 = 320.0;
const RSS_GAP: f64 = 76.0;
const RSS_HEIGHT: f64 = 160.0;
const PALETTE: [&str; 6] = ["#4e79a7", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f"];

/// Escapes text for SVG.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A step of about a tenth of `span`: 1, 2 or 5 × 10^k.
fn nice_step(span: f64) -> f64 {
    let raw = (span / 10.0).max(1e-9);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(10.0 * magnitude)
}

fn ms_label(v: f64) -> String {
    if v >= 1000.0 { format!("{} s", v / 1000.0) } else { format!("{v} ms") }
}

struct Chart {
    out: String,
    seconds: f64,
}

impl Chart {
    fn x(&self, t: f64) -> f64 {
        LEFT + (t / self.seconds).clamp(0.0, 1.0) * (WIDTH - LEFT - RIGHT)
    }

    fn text(&mut self, x: f64, y: f64, anchor: &str, class: &str, text: &str) {
        let _ = writeln!(
            self.out,
            r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" class="{class}">{}</text>"#,
            escape(text)
        );
    }

    fn line(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), class: &str) {
        let _ = writeln!(self.out, r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" class="{class}"/>"#);
    }

    fn x_axis(&mut self, top: f64, height: f64, labels: bool) {
        let bottom = top + height;
        let step = nice_step(self.seconds);
        let mut t = 0.0;
        while t <= self.seconds + 1e-9 {
            let x = self.x(t);
            self.line((x, top), (x, bottom), "grid");
            if labels {
                self.text(x, bottom + 30.0, "middle", "tick", &format!("{}", (t * 1000.0).round() / 1000.0));
            }
            t += step;
        }
        self.line((LEFT, bottom), (WIDTH - RIGHT, bottom), "axis");
        self.line((LEFT, top), (LEFT, bottom), "axis");
    }

    fn swap_bands(&mut self, a: &Analysis, top: f64, height: f64, labels: bool) {
        for s in &a.swaps {
            let (x1, x2) = (self.x(s.trigger_s), self.x(s.window_end_s));
            // Only the latency panel's bands are `swap-window`s.
            let class = if labels { "swap-window" } else { "swap-window-rss" };
            let _ = writeln!(
                self.out,
                r#"<rect class="{class}" data-swap="{}" x="{x1:.1}" y="{top:.1}" width="{:.1}" height="{height:.1}"/>"#,
                s.index,
                (x2 - x1).max(1.0)
            );
            self.line((x1, top), (x1, top + height), "swap-trigger");
            if let Some(c) = s.commit_s {
                let xc = self.x(c);
                self.line((xc, top), (xc, top + height), "swap-commit");
            }
            if labels {
                let to = s.version.as_deref().map(|v| format!(" → {v}")).unwrap_or_default();
                self.text(x1 + 3.0, top + 12.0, "start", "swap-label", &format!("swap {}{to}", s.index));
            }
        }
    }

    /// Polylines of one statistic, broken where a bucket has no value.
    fn series(
        &mut self,
        points: &[Point],
        bucket_s: f64,
        value: impl Fn(&Point) -> Option<f64>,
        y: impl Fn(f64) -> f64,
        class: &str,
    ) {
        let mut run: Vec<String> = Vec::new();
        let flush = |run: &mut Vec<String>, out: &mut String| {
            if !run.is_empty() {
                let _ = writeln!(out, r#"<polyline class="{class}" points="{}"/>"#, run.join(" "));
                run.clear();
            }
        };
        for p in points {
            match value(p) {
                Some(v) => run.push(format!("{:.1},{:.1}", self.x(p.t_s + bucket_s / 2.0), y(v))),
                None => flush(&mut run, &mut self.out),
            }
        }
        flush(&mut run, &mut self.out);
    }
}

const STYLE: &str = "<style>
text{font-family:sans-serif;font-size:12px;fill:#333}
.title{font-size:15px;font-weight:bold}.tick{font-size:11px;fill:#555}.axis-title{font-size:12px}
.axis{stroke:#333;stroke-width:1}.grid{stroke:#e3e3e3;stroke-width:1}
.swap-window,.swap-window-rss{fill:#f28e2b;fill-opacity:0.16}.swap-trigger{stroke:#e15759;stroke-width:1.2;stroke-dasharray:4 3}
.swap-commit{stroke:#e15759;stroke-width:1.2}.swap-label{font-size:11px;fill:#c0392b}
polyline{fill:none;stroke-width:1.5}.p50{stroke:#999}.p99{stroke:#1f77b4}.max{stroke:#ff9f40;stroke-width:1}
.rss{stroke:#2ca02c}.failure{fill:#d62728}
</style>";

/// The chart for an analysis; `title` goes on top.
pub fn render(title: &str, a: &Analysis) -> String {
    let seconds = a.duration_s.max(0.001);
    let rss_top = TOP + LATENCY_HEIGHT + RSS_GAP;
    let height = if a.rss.is_some() { rss_top + RSS_HEIGHT + 50.0 } else { TOP + LATENCY_HEIGHT + 56.0 };
    let mut c = Chart { out: String::new(), seconds };
    let _ = writeln!(
        c.out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}">"#
    );
    c.out.push_str(STYLE);
    let _ = writeln!(c.out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    c.text(LEFT, 22.0, "start", "title", title);
    c.text(
        LEFT,
        42.0,
        "start",
        "legend",
        "grey p50, blue p99, orange max per bucket; red marks under the axis: failures; shaded: swap windows \
         (dashed: trigger, solid: commit); top strip: the version answering",
    );

    // Latency panel, log scale.
    let values: Vec<f64> =
        a.series.points.iter().flat_map(|p| [p.p50_ms, p.max_ms]).flatten().filter(|v| *v > 0.0).collect();
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(0.0, f64::max);
    let (mut lo, mut hi) = if values.is_empty() { (0.1, 10.0) } else { (lo.max(1e-3), hi.max(1e-3)) };
    lo = 10f64.powf(lo.log10().floor());
    hi = 10f64.powf(hi.log10().ceil());
    if hi <= lo {
        hi = lo * 10.0;
    }
    let (llo, lhi) = (lo.log10(), hi.log10());
    let y = move |v: f64| TOP + LATENCY_HEIGHT - (v.max(lo).log10() - llo) / (lhi - llo) * LATENCY_HEIGHT;
    c.x_axis(TOP, LATENCY_HEIGHT, true);
    let mut decade = lo;
    while decade <= hi * 1.0001 {
        let yy = y(decade);
        c.line((LEFT, yy), (WIDTH - RIGHT, yy), "grid");
        c.text(LEFT - 6.0, yy + 4.0, "end", "tick", &ms_label((decade * 1e6).round() / 1e6));
        decade *= 10.0;
    }
    let _ = writeln!(
        c.out,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle" class="axis-title">latency (ms, log scale)</text>"#,
        TOP + LATENCY_HEIGHT / 2.0
    );
    c.text(
        (LEFT + WIDTH - RIGHT) / 2.0,
        TOP + LATENCY_HEIGHT + 48.0,
        "middle",
        "axis-title",
        "time since the load started (s)",
    );
    c.swap_bands(a, TOP, LATENCY_HEIGHT, true);
    let bucket_s = a.series.bucket_ms as f64 / 1000.0;
    let points = &a.series.points;
    c.series(points, bucket_s, |p| p.p50_ms, y, "p50");
    c.series(points, bucket_s, |p| p.max_ms, y, "max");
    c.series(points, bucket_s, |p| p.p99_ms, y, "p99");

    // The version strip and the failure marks.
    let versions: Vec<&str> = a.versions.iter().map(|v| v.version.as_str()).collect();
    for p in points {
        let (x1, x2) = (c.x(p.t_s), c.x(p.t_s + bucket_s));
        if let Some(v) = &p.version {
            let colour = PALETTE[versions.iter().position(|x| x == v).unwrap_or(0) % PALETTE.len()];
            let _ = writeln!(
                c.out,
                r#"<rect class="version" x="{x1:.1}" y="{:.1}" width="{:.1}" height="7" fill="{colour}"><title>version {}</title></rect>"#,
                TOP - 10.0,
                (x2 - x1).max(0.5),
                escape(v)
            );
        }
        if p.failed > 0 {
            let _ = writeln!(
                c.out,
                r#"<rect class="failure" x="{x1:.1}" y="{:.1}" width="{:.1}" height="8"><title>{} failed</title></rect>"#,
                TOP + LATENCY_HEIGHT + 3.0,
                (x2 - x1).max(1.0),
                p.failed
            );
        }
    }
    for (i, v) in versions.iter().filter(|v| !v.is_empty()).enumerate() {
        let colour = PALETTE[versions.iter().position(|x| x == v).unwrap_or(0) % PALETTE.len()];
        let x = WIDTH - RIGHT - 90.0 * (versions.len() - i) as f64;
        let _ = writeln!(c.out, r#"<rect x="{x:.1}" y="{:.1}" width="10" height="10" fill="{colour}"/>"#, 52.0);
        c.text(x + 14.0, 61.0, "start", "tick", &format!("version {v}"));
    }

    // RSS panel.
    if let Some(r) = &a.rss {
        let (lo, hi) = (r.min_bytes as f64, r.max_bytes as f64);
        let pad = ((hi - lo) * 0.1).max(1024.0 * 1024.0);
        let (lo, hi) = (lo - pad, hi + pad);
        let mib = 1024.0 * 1024.0;
        let ry = move |b: f64| rss_top + RSS_HEIGHT - (b - lo) / (hi - lo) * RSS_HEIGHT;
        c.x_axis(rss_top, RSS_HEIGHT, true);
        let step = nice_step((hi - lo) / mib) * mib;
        let mut tick = (lo / step).ceil() * step;
        while tick <= hi {
            let yy = ry(tick);
            c.line((LEFT, yy), (WIDTH - RIGHT, yy), "grid");
            c.text(LEFT - 6.0, yy + 4.0, "end", "tick", &format!("{} MiB", (tick / mib * 100.0).round() / 100.0));
            tick += step;
        }
        let _ = writeln!(
            c.out,
            r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle" class="axis-title">server RSS (MiB)</text>"#,
            rss_top + RSS_HEIGHT / 2.0
        );
        c.text(LEFT, rss_top - 8.0, "start", "axis-title", &format!("RSS of pid {} (VmRSS)", r.pid));
        c.swap_bands(a, rss_top, RSS_HEIGHT, false);
        let line: Vec<String> = r.samples.iter().map(|&(t, b)| format!("{:.1},{:.1}", c.x(t), ry(b as f64))).collect();
        let _ = writeln!(c.out, r#"<polyline class="rss" points="{}"/>"#, line.join(" "));
    }
    c.out.push_str("</svg>\n");
    c.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_escapes() {
        assert_eq!(nice_step(10.0), 1.0);
        assert_eq!(nice_step(3.0), 0.5);
        assert_eq!(nice_step(130.0), 20.0);
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
