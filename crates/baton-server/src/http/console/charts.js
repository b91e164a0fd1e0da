// Hand-drawn SVG charts for the console: the candidate's share over time
// and one chart per guard, with the decisions marked where they happened.
// No library: a step line, points, a threshold and vertical marks are all
// these charts need.
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 640, H = 150, LEFT = 44, RIGHT = 10, TOP = 14, BOTTOM = 22;

  function node(name, attrs, text) {
    const n = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
    if (text !== undefined) n.textContent = text;
    return n;
  }

  function clock(ms) {
    return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  }

  function number(v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a !== 0 && (a < 0.001 || a >= 100000)) return v.toExponential(2);
    return String(Number(v.toPrecision(3)));
  }

  // A frame: axes, the time scale from t0 to t1, and a y scale.
  function frame(t0, t1, y0, y1, yLabel, klass) {
    const svg = node("svg", { viewBox: `0 0 ${W} ${H}`, class: klass || "", role: "img" });
    const span = Math.max(t1 - t0, 1);
    const x = (t) => LEFT + ((t - t0) / span) * (W - LEFT - RIGHT);
    const y = (v) => H - BOTTOM - ((v - y0) / (y1 - y0 || 1)) * (H - TOP - BOTTOM);
    svg.append(node("line", { class: "axis", x1: LEFT, y1: H - BOTTOM, x2: W - RIGHT, y2: H - BOTTOM }));
    svg.append(node("line", { class: "axis", x1: LEFT, y1: TOP, x2: LEFT, y2: H - BOTTOM }));
    for (const v of [y0, (y0 + y1) / 2, y1]) {
      svg.append(node("text", { x: LEFT - 4, y: y(v) + 3, "text-anchor": "end" }, number(v) + yLabel));
    }
    svg.append(node("text", { x: LEFT, y: H - 6 }, clock(t0)));
    svg.append(node("text", { x: W - RIGHT, y: H - 6, "text-anchor": "end" }, clock(t1)));
    return { svg, x, y };
  }

  // Vertical marks for decisions, labelled with the action above the plot.
  function marks(f, decisions, labelled) {
    let lastLabelX = -Infinity;
    for (const d of decisions) {
      const px = f.x(d.at_ms);
      const bad = d.action === "rolled_back" || d.action === "aborted";
      const klass = "mark" + (d.by === "operator" ? " by-operator" : "") + (bad ? " bad" : "");
      const line = node("line", { class: klass, x1: px, y1: TOP, x2: px, y2: H - BOTTOM, "data-action": d.action });
      line.append(node("title", {}, `${d.action} by ${d.by} at ${clock(d.at_ms)}: ${d.message || ""}`));
      f.svg.append(line);
      if (labelled && d.action !== "held" && px - lastLabelX > 40) {
        const end = px > W - RIGHT - 60;
        f.svg.append(node("text", { class: "mark-label", x: end ? px - 2 : px + 2, y: TOP - 3, "text-anchor": end ? "end" : "start" }, d.action));
        lastLabelX = px;
      }
    }
  }

  // The share over time: `points` are [at_ms, percent], a step line.
  function share(points, decisions, watch, now) {
    const times = points.map((p) => p[0]).concat(decisions.map((d) => d.at_ms));
    const t0 = times.length ? Math.min(...times) : now - 1000;
    const t1 = Math.max(now, t0 + 1000);
    const f = frame(t0, t1, 0, 100, "%", "share-chart");
    let path = "";
    points.forEach(([t, v], i) => {
      path += i === 0 ? `M${f.x(t)},${f.y(v)}` : `H${f.x(t)}V${f.y(v)}`;
    });
    if (points.length) path += `H${f.x(t1)}`;
    if (watch) {
      f.svg.append(node("rect", {
        class: "watch", x: f.x(watch.from), y: TOP, width: Math.max(f.x(t1) - f.x(watch.from), 1), height: H - TOP - BOTTOM,
      }));
    }
    f.svg.append(node("path", { class: "share", d: path }));
    marks(f, decisions, true);
    return f.svg;
  }

  // One guard: its value in each judged window (points coloured by what the
  // guard came to) against its threshold (a dashed line).
  function guard(name, readings, decisions, now) {
    const values = readings.filter((r) => Number.isFinite(r.value)).map((r) => r.value);
    const thresholds = readings.map((r) => r.threshold).filter(Number.isFinite);
    const threshold = thresholds[thresholds.length - 1];
    // The scale follows the values; the threshold joins it unless it is so
    // far off that the values would flatten into a line, in which case it
    // is drawn at the edge and labelled as off the scale.
    let lo = Math.min(0, ...values), hi = Math.max(0, ...values);
    if (hi === lo) hi = lo + 1;
    const span = hi - lo;
    const near = Number.isFinite(threshold) && threshold <= hi + 3 * span && threshold >= lo - 3 * span;
    if (near) {
      lo = Math.min(lo, threshold);
      hi = Math.max(hi, threshold);
    }
    hi += (hi - lo) * 0.15;
    const t0 = Math.min(...readings.map((r) => r.at_ms), ...decisions.map((d) => d.at_ms));
    const t1 = Math.max(now, t0 + 1000);
    const f = frame(t0, t1, lo, hi, "", "guard-chart");
    f.svg.setAttribute("data-guard", name);
    if (Number.isFinite(threshold)) {
      const ty = near ? f.y(threshold) : threshold > hi ? TOP : H - BOTTOM;
      const label = "threshold " + number(threshold) + (near ? "" : threshold > hi ? " (above the scale)" : " (below the scale)");
      f.svg.append(node("line", { class: "threshold", x1: LEFT, y1: ty, x2: W - RIGHT, y2: ty }));
      f.svg.append(node("text", { x: W - RIGHT, y: ty === TOP ? ty + 10 : ty - 3, "text-anchor": "end" }, label));
    }
    marks(f, decisions, false);
    const pts = readings.filter((r) => Number.isFinite(r.value));
    if (pts.length > 1) {
      f.svg.append(node("path", { class: "value", d: pts.map((r, i) => `${i ? "L" : "M"}${f.x(r.at_ms)},${f.y(r.value)}`).join("") }));
    }
    for (const r of readings) {
      const v = Number.isFinite(r.value) ? r.value : lo;
      const dot = node("circle", { class: r.outcome, cx: f.x(r.at_ms), cy: f.y(v), r: Number.isFinite(r.value) ? 3.5 : 2.5 });
      const note = r.note ? ` (${r.note})` : "";
      dot.append(node("title", {}, `${name} ${number(r.value)} against ${number(r.threshold)} over ${r.samples} samples: ${r.outcome}${note}`));
      f.svg.append(dot);
    }
    return f.svg;
  }

  return { share, guard, number, clock };
})();
