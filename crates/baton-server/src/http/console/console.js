// The console's behaviour. It reads the server's own API (status, unloads,
// the event stream) and draws it; actions call the management endpoints
// with the token the operator entered, after a confirmation. The token is
// kept in this tab's sessionStorage and sent only as an Authorization
// header, never in a URL. Everything the server says is put on the page as
// text (textContent), never parsed as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "baton-console-token";
  const POLL_MS = 2000;
  const TIMELINE_MAX = 300;
  const $ = (id) => document.getElementById(id);

  let token = sessionStorage.getItem(TOKEN_KEY) || "";
  let status = null;
  // The fleet's records (GET /baton/v1/fleet), or why they are not shown.
  let fleet = null;
  let selected = "";
  let polling = null;
  let pending = false;
  // Set when a refresh was asked for while one ran: it runs again after.
  let again = false;
  // Per model, what the page has seen of its current rollout: decisions by
  // when and what, and the share sampled while the page was open.
  const seen = new Map();

  function el(tag, attrs, ...children) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") n.className = v;
      else n.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === undefined || c === null) continue;
      n.append(c instanceof Node ? c : String(c));
    }
    return n;
  }

  const mib = (bytes) => (Number.isFinite(bytes) ? (bytes / 1048576).toFixed(1) + " MiB" : "–");
  const ms = (v) => (Number.isFinite(v) ? (v < 10 ? v.toFixed(2) : v < 1000 ? v.toFixed(0) : (v / 1000).toFixed(1) + " s") + (v < 1000 ? " ms" : "") : "–");
  const when = (epochMs) => new Date(epochMs).toLocaleString([], { hour12: false });
  let seeded = false;
  const pct = (p) => (Number.isFinite(p) ? Number(p.toPrecision(4)) + " %" : "–");

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const init = { method, headers, cache: "no-store", credentials: "omit" };
    if (body !== undefined) init.body = JSON.stringify(body);
    const answer = await fetch(path, init);
    let json = null;
    try {
      json = await answer.json();
    } catch (_) {
      json = null;
    }
    return { ok: answer.ok, status: answer.status, json };
  }

  // ---- the token -------------------------------------------------------

  function showToken() {
    $("token-state").textContent = token ? "token set for this tab" : "no token";
    $("token").value = "";
  }

  function useToken() {
    const value = $("token").value.trim();
    if (!value) return;
    token = value;
    sessionStorage.setItem(TOKEN_KEY, token);
    showToken();
    refresh();
  }

  function forgetToken() {
    token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    showToken();
    refresh();
  }

  // ---- reading ---------------------------------------------------------

  async function refresh() {
    if (pending) {
      again = true;
      return;
    }
    pending = true;
    again = false;
    try {
      const answer = await api("GET", "baton/v1/status");
      if (!answer.ok || !answer.json) throw new Error("status answered " + answer.status);
      status = answer.json;
      // The fleet is read from etcd, which may stall: the status shows at
      // once, and the fleet's table when its answer comes.
      if (status.cluster) refreshFleet();
      else fleet = null;
      if (!seeded) {
        seeded = true;
        // What each model went through last, before the page opened.
        for (const m of status.models || []) {
          if (m.last) addEvent({ event: "finished", model: m.name, version: m.last.version, report: m.last }, null);
        }
      }
      render();
    } catch (e) {
      $("server").textContent = "cannot reach the server: " + e.message;
    } finally {
      pending = false;
      if (again) refreshSoon();
    }
  }

  let fleetPending = false;
  async function refreshFleet() {
    if (fleetPending) return;
    fleetPending = true;
    try {
      fleet = await api("GET", "baton/v1/fleet").catch((e) => ({ ok: false, status: 0, json: { error: e.message } }));
    } finally {
      fleetPending = false;
    }
    renderReplicas(fleet);
  }

  let soon = null;
  function refreshSoon() {
    if (soon) return;
    soon = setTimeout(() => {
      soon = null;
      refresh();
    }, 100);
  }

  function render() {
    const s = status;
    $("server").textContent =
      `${s.version} · pid ${s.pid} · ` + (s.draining ? "draining" : s.ready ? "ready" : "not ready");
    renderModels(s.models || []);
    renderSelector(s.models || []);
    renderRollout((s.models || []).find((m) => m.name === selected));
    renderFleet(s.cluster);
    renderReplicas(fleet);
  }

  function decisionText(d) {
    if (!d) return "–";
    const what = d.kind === "rollout" ? "rollout" : `${d.kind}` + (d.version ? ` at ${d.version}` : "");
    return what + (d.holds ? `, ${d.holds}` : "");
  }

  function renderModels(models) {
    const rows = models.map((m) => {
      const r = m.rollout;
      const rollout = r ? `${r.phase} · ${r.stable} → ${r.candidate} at ${pct(r.weight_percent)}` : "–";
      const error = m.last_error ? `${m.last_error.kind}: ${m.last_error.message}` : "–";
      return el("tr", { "data-model": m.name },
        el("td", {}, m.name), el("td", {}, m.state), el("td", { class: "serving" }, m.serving ?? "–"),
        el("td", {}, (m.previous || []).join(", ") || "–"), el("td", { class: "decision" }, decisionText(m.decision)),
        el("td", { class: "rollout-phase" }, rollout), el("td", { class: "fail-text" }, error));
    });
    $("models").tBodies[0].replaceChildren(...rows);
    const versions = [];
    for (const m of models) {
      const r = m.rollout && ["running", "paused", "watching"].includes(m.rollout.phase) ? m.rollout : null;
      for (const v of m.live || []) {
        let role = "draining";
        if (v.twin) role = "twin of stable (comparison copies)";
        else if (r && v.version === r.candidate && m.serving !== v.version) role = "candidate";
        else if (v.version === m.serving) role = "stable";
        else if ((m.previous || []).includes(v.version)) role = "previous";
        const memory = v.memory ? `${mib(v.memory.total ?? v.bytes_held)} (weights ${mib(v.memory.weights)})` : mib(v.bytes_held);
        const worker = v.worker ? `pid ${v.worker.pid}, ${mib(v.worker.rss)}` + (v.alive === false ? " (ended)" : "") : "in process";
        versions.push(el("tr", { "data-model": m.name, "data-version": v.version },
          el("td", {}, m.name), el("td", {}, v.version), el("td", { class: "role" }, role),
          el("td", {}, `${v.update} (${v.update_reason})`), el("td", {}, memory), el("td", {}, worker)));
      }
    }
    $("versions").tBodies[0].replaceChildren(...versions);
  }

  function renderSelector(models) {
    const names = models.map((m) => m.name);
    if (!names.includes(selected)) {
      const live = models.find((m) => m.rollout && ["running", "paused", "watching"].includes(m.rollout.phase));
      const any = models.find((m) => m.rollout);
      selected = (live || any || models[0] || { name: "" }).name;
    }
    const select = $("rollout-model");
    const current = Array.from(select.options).map((o) => o.value).join("\n");
    if (current !== names.join("\n")) select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    select.value = selected;
  }

  // What the page keeps of a model's rollout: reset when another starts.
  function remember(model, r) {
    const started = (r.decisions || []).find((d) => d.action === "started");
    const identity = `${r.stable}>${r.candidate}>${started ? started.at_ms : "?"}`;
    let kept = seen.get(model);
    if (!kept || (kept.identity !== identity && started)) {
      kept = { identity, decisions: new Map(), samples: [] };
      seen.set(model, kept);
    }
    for (const d of r.decisions || []) kept.decisions.set(`${d.at_ms}:${d.action}:${d.step}`, d);
    const last = kept.samples[kept.samples.length - 1];
    if (!last || last[1] !== r.weight_percent) kept.samples.push([Date.now(), r.weight_percent]);
    const decisions = Array.from(kept.decisions.values()).sort((a, b) => a.at_ms - b.at_ms);
    return { decisions, samples: kept.samples };
  }

  function renderRollout(model) {
    const r = model && model.rollout;
    $("rollout-none").hidden = !!r;
    $("rollout").hidden = !r;
    renderButtons(model);
    if (!r) return;
    const box = $("rollout");
    box.dataset.phase = r.phase;
    box.dataset.stable = r.stable;
    box.dataset.candidate = r.candidate;
    box.dataset.share = r.weight_percent;
    const { decisions, samples } = remember(model.name, r);
    const plan = r.plan || {};
    const steps = (plan.steps || []).map((b) => pct(b));
    const rows = [
      ["model", model.name],
      ["stable → candidate", `${r.stable} → ${r.candidate}`],
      ["mode", r.mode],
      ["phase", r.phase + (r.paused ? ` (${r.paused})` : "")],
      ["step", steps.length ? `${r.step + 1} of ${steps.length}: ${steps.join(", ")}` : r.step],
      ["candidate's share", pct(r.weight_percent)],
      ["failed windows", `${r.failures}` + (plan.failure_limit ? ` of ${plan.failure_limit} allowed` : "")],
      ["inconclusive windows", `${r.inconclusive}` + (plan.max_inconclusive ? ` of ${plan.max_inconclusive} allowed` : "")],
    ];
    if (r.next_window_ms !== null && r.next_window_ms !== undefined) rows.push(["next window in", ms(r.next_window_ms)]);
    if (r.watch) rows.push(["watch after promotion", `judged against version ${r.watch.against}, ${ms(r.watch.left_ms)} left`]);
    if (r.twin) rows.push(["twin of stable", r.twin.loaded ? `loaded, ${mib(r.twin.bytes_held)}` : (r.twin.reason || "none")]);
    const summary = [];
    for (const [k, v] of rows) {
      const key = k.replace(/[^a-z]+/g, "-");
      summary.push(el("dt", {}, k), el("dd", { "data-field": key }, v));
    }
    $("rollout-summary").replaceChildren(...summary);

    const now = Date.now();
    const points = decisions.map((d) => [d.at_ms, d.weight_percent]).concat(samples).sort((a, b) => a[0] - b[0]);
    const promoted = decisions.filter((d) => d.action === "promoted").pop();
    const watch = promoted && (r.phase === "watching" || decisions.some((d) => d.action === "watched")) ? { from: promoted.at_ms } : null;
    $("share-chart").replaceChildren(Charts.share(points, decisions, watch, now));

    const readings = new Map();
    for (const d of decisions) {
      if (!d.verdict) continue;
      for (const c of d.verdict.checks || []) {
        if (!readings.has(c.guard)) readings.set(c.guard, []);
        readings.get(c.guard).push({ ...c, at_ms: d.window_end_ms || d.at_ms });
      }
    }
    const charts = [];
    for (const [name, list] of readings) {
      const latest = list[list.length - 1];
      charts.push(el("div", { class: "chart", "data-guard": name },
        el("div", { class: "guard-title" }, `${name}: ${Charts.number(latest.value)} against ${Charts.number(latest.threshold)} (${latest.outcome}, ${latest.samples} samples)`),
        Charts.guard(name, list, decisions, now)));
    }
    if (!charts.length) charts.push(el("p", { class: "note" }, "No window judged yet."));
    $("guard-charts").replaceChildren(...charts);

    const items = decisions.slice().reverse().map((d) => el("li", { "data-action": d.action, "data-by": d.by },
      el("span", { class: "when" }, when(d.at_ms)), el("span", { class: "kind" }, d.action),
      `by ${d.by} at ${pct(d.weight_percent)}` + (d.message ? `: ${d.message}` : "")));
    $("decisions").replaceChildren(...items);
  }

  function renderButtons(model) {
    const r = model && model.rollout;
    const phase = r ? r.phase : "";
    const enable = {
      promote: phase === "running" || phase === "paused",
      pause: phase === "running",
      resume: phase === "paused",
      abort: ["running", "paused", "watching"].includes(phase),
      rollback: !!model && (model.previous || []).length > 0 && !["running", "paused", "watching"].includes(phase),
      pin: !!model,
      unpin: !!model,
    };
    for (const b of document.querySelectorAll("#actions button")) b.disabled = !enable[b.dataset.action];
  }

  function renderFleet(cluster) {
    $("fleet-section").hidden = !cluster;
    if (!cluster) return;
    const rows = [["connected", cluster.connected ? "yes" : "no"]];
    if (cluster.endpoint !== undefined) {
      // Its `replicas` is counted only where it may coordinate: the fleet's
      // list below is the count to trust.
      rows.push(["etcd member", cluster.endpoint || "–"], ["sessions", cluster.sessions], ["leases lost", cluster.leases_lost]);
      if (cluster.last_error) rows.push(["last error", cluster.last_error]);
      for (const [model, s] of Object.entries(cluster.fleet_switch || {})) {
        rows.push([`last switch of ${model} (coordinated here)`,
          `${s.replicas} replicas, skew ${ms(s.skew_ms)}, delivery skew ${ms(s.delivery_skew_ms)}`]);
      }
      for (const [model, secs] of Object.entries(cluster.prepare_seconds || {})) rows.push([`prepare of ${model}`, ms(secs * 1000)]);
      for (const [model, secs] of Object.entries(cluster.commit_delay_seconds || {})) rows.push([`commit to switch of ${model}`, ms(secs * 1000)]);
      for (const [model, p] of Object.entries(cluster.problems || {})) rows.push([`problem with ${model}`, p]);
      for (const [model, w] of Object.entries(cluster.waiting || {})) rows.push([`${model}'s prepare waits for`, w]);
      for (const [reason, n] of Object.entries(cluster.aborted || {})) rows.push([`rollouts aborted: ${reason}`, n]);
    } else {
      rows.push(["details", "enter the admin token to see the fleet's details"]);
    }
    $("fleet").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  }

  function serves(models) {
    return Object.entries(models || {}).map(([m, s]) =>
      `${m}: ${s.stable ?? "–"}` + (s.candidate ? ` + ${s.candidate} at ${pct(s.candidate_percent)}` : "")).join("; ") || "–";
  }

  function prepared(ack) {
    if (!ack) return "waiting";
    if (ack.ok) return `prepared in ${ms(ack.prepare_ms)}`;
    return `failed at ${ack.stage || "?"}: ${ack.reason || ""}`;
  }

  function renderReplicas(answer) {
    if (!answer) return;
    const note = $("fleet-note");
    if (!answer.ok) {
      const j = answer.json || {};
      note.textContent = answer.status === 401 ? "Enter the admin token to see every replica." : `The fleet cannot be read: ${j.error || answer.status}`;
      note.className = answer.status === 401 ? "note" : "note fail-text";
      return;
    }
    const f = answer.json;
    note.textContent = `${f.replicas.length} live replicas`;
    note.className = "note";
    $("replicas").tBodies[0].replaceChildren(...f.replicas.map((r) => el("tr", { "data-replica": r.id },
      el("td", {}, r.id + (r.agent ? " (agent)" : "")), el("td", {}, r.ready ? "yes" : "no" + (r.note ? `: ${r.note}` : "")),
      el("td", {}, r.address), el("td", { class: "serves" }, serves(r.models)),
      el("td", {}, Object.entries(r.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ")))));
    const blocks = (f.rollouts || []).map((x) => {
      const r = x.rollout;
      const committed = f.desired && f.desired[x.model] ? f.desired[x.model].version : "–";
      const step = r.step === null || r.step === undefined ? "not committed" : `${r.step + 1} of ${(r.plan && r.plan.steps || []).length || "?"}`;
      const facts = [
        ["rollout", `${r.from ?? "–"} → ${r.version}, ${r.phase}` + (r.paused ? ` (paused: ${r.paused})` : "") + (r.reason ? ` (${r.reason})` : "")],
        ["committed version", committed],
        ["coordinator", x.coordinator || "none now"],
        ["step", step],
        ["serving the candidate", (r.members || []).join(", ") || "–"],
        ["last switch's skew", x.skew_ms === null || x.skew_ms === undefined ? "–" : ms(x.skew_ms)],
      ];
      if ((r.missing || []).length) facts.push(["left out", r.missing.join(", ")]);
      const rows = (r.participants || []).map((id) => {
        const sw = (x.switched || {})[id];
        return el("tr", { "data-replica": id }, el("td", {}, id), el("td", { class: "ack" }, prepared((x.acks || {})[id])),
          el("td", { class: "switch" }, sw ? `${sw.phase}, ${ms(sw.delay_us / 1000)} after the commit` : "–"));
      });
      return el("div", { class: "fleet-rollout", "data-model": x.model },
        el("h4", {}, x.model),
        el("dl", {}, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k.replace(/[^a-z]+/g, "-") }, v)])),
        el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "participant"), el("th", {}, "prepared / acknowledged"), el("th", {}, "switched"))),
          el("tbody", {}, ...rows)));
    });
    if (!blocks.length) blocks.push(el("p", { class: "note" }, "No fleet rollout yet."));
    $("fleet-rollouts").replaceChildren(...blocks);
  }

  // ---- the timeline ----------------------------------------------------

  function stages(list) {
    return (list || []).map((s) => `${s.stage} ${ms(s.duration)}`).join(", ");
  }

  function describe(e) {
    switch (e.event) {
      case "transition": return `${e.from} → ${e.to}` + (e.stages && e.stages.length ? ` (${stages(e.stages)})` : "");
      case "failed": return `${e.stage} failed, ${e.kind}: ${e.message}`;
      case "finished": {
        const r = e.report || {};
        return `${r.operation} of version ${r.version ?? "–"}` + (r.replaced ? ` replacing ${r.replaced}` : "") +
          ` in ${ms(r.total_ms ?? r.total)}` + (r.bytes_held ? `, holds ${mib(r.bytes_held)}` : "") +
          (r.update ? `, ${r.update} update` : "") + (r.stages && r.stages.length ? ` (${stages(r.stages)})` : "");
      }
      case "unloaded": return `freed${e.twin ? " the twin" : ""}: held ${mib(e.held)}, returned ${mib(e.returned)}` +
        (e.worker ? `, worker pid ${e.worker.pid}` : "");
      case "drain_timed_out": return `drain timed out with ${e.stragglers} requests in flight`;
      case "paused": return `paused, replacing version ${e.replacing}`;
      case "resumed": return `resumed after ${ms(e.paused_ms)}, serving ${e.serving ?? "nothing"}` + (e.restored ? " (the old version, loaded back)" : "");
      case "decision": return `${e.decision} ${e.change}: ${e.message}`;
      case "store": return e.ok ? "the store answers again" : `the store failed, ${e.kind}: ${e.message}`;
      case "exited": return `worker ended (${e.reason}); ${e.action}`;
      case "unpackaged": return e.message || `version directory ${e.dir} has no MANIFEST, so it is not loaded`;
      case "rollout": {
        const d = e.decision || {};
        return `rollout ${d.action} by ${d.by} at ${pct(d.weight_percent)}` + (d.message ? `: ${d.message}` : "");
      }
      case "lagged": return `the page fell behind and missed ${e.missed ?? "some"} events`;
      default: return JSON.stringify(e);
    }
  }

  function addEvent(e, atMs) {
    const item = el("li", { "data-event": e.event },
      el("span", { class: "when" }, atMs ? when(atMs) : "before this page"), el("span", { class: "kind" }, e.event),
      e.model ? `${e.model}${e.version ? " v" + e.version : ""}: ` : "", describe(e));
    const list = $("timeline");
    list.prepend(item);
    while (list.children.length > TIMELINE_MAX) list.lastElementChild.remove();
  }

  async function loadUnloads() {
    const answer = await api("GET", "baton/v1/unloads").catch(() => null);
    if (!answer || !answer.ok || !Array.isArray(answer.json)) return;
    for (const u of answer.json) {
      addEvent({ event: "unloaded", model: u.model, version: u.version, held: u.held, returned: u.returned, twin: u.twin, worker: u.worker }, null);
    }
  }

  const KINDS = ["transition", "failed", "finished", "unloaded", "drain_timed_out", "paused", "resumed", "decision", "store", "exited", "unpackaged", "rollout", "lagged"];

  function stream() {
    const source = new EventSource("baton/v1/events");
    const badge = $("stream");
    source.onopen = () => {
      badge.textContent = "events: live";
      badge.className = "badge on";
    };
    source.onerror = () => {
      badge.textContent = "events: reconnecting";
      badge.className = "badge off";
    };
    for (const kind of KINDS) {
      source.addEventListener(kind, (message) => {
        let e;
        try {
          e = JSON.parse(message.data);
        } catch (_) {
          e = { event: kind };
        }
        if (!e.event) e.event = kind;
        addEvent(e, Number.isFinite(e.at) ? e.at * 1000 : Date.now());
        refreshSoon();
      });
    }
  }

  // ---- actions ---------------------------------------------------------

  function confirmThen(text, run) {
    const dialog = $("confirm");
    $("confirm-text").textContent = text;
    const ok = $("confirm-ok"), cancel = $("confirm-cancel");
    const done = (go) => {
      ok.onclick = cancel.onclick = null;
      dialog.close();
      if (go) run();
    };
    ok.onclick = () => done(true);
    cancel.onclick = () => done(false);
    dialog.showModal();
  }

  function plan(action, model) {
    const m = encodeURIComponent(model.name);
    const r = model.rollout || {};
    switch (action) {
      case "promote": return ["POST", `baton/v1/models/${m}/rollout/promote`, {}, `Promote version ${r.candidate} of ${model.name} now? It becomes stable for all traffic.`];
      case "pause": return ["POST", `baton/v1/models/${m}/rollout/pause`, { reason: "paused from the console" }, `Pause the rollout of ${model.name}? The candidate keeps its share and windows are not judged.`];
      case "resume": return ["POST", `baton/v1/models/${m}/rollout/resume`, {}, `Resume the rollout of ${model.name}? Windows are judged again.`];
      case "abort": return ["POST", `baton/v1/models/${m}/rollout/abort`, {}, `Abort the rollout of ${model.name}? The candidate leaves traffic now.`];
      case "rollback": return ["POST", `baton/v1/models/${m}/rollback`, {}, `Roll back ${model.name} to version ${(model.previous || [])[0]}? It is held there until a newer version is published.`];
      case "pin": {
        const v = Number($("pin-version").value);
        if (!Number.isInteger(v) || v < 1) return null;
        return ["PUT", `baton/v1/models/${m}/pin`, { version: v }, `Pin ${model.name} to version ${v}? It serves version ${v}, whatever is published, until unpinned.`];
      }
      case "unpin": return ["DELETE", `baton/v1/models/${m}/pin`, {}, `Unpin ${model.name}? The newest version serves again.`];
      default: return null;
    }
  }

  function act(action) {
    const model = (status && status.models || []).find((m) => m.name === selected);
    const result = $("action-result");
    if (!model) return;
    const p = plan(action, model);
    if (!p) {
      result.className = "refused";
      result.textContent = "Enter a version to pin.";
      return;
    }
    const [method, path, body, question] = p;
    confirmThen(question, async () => {
      result.className = "";
      result.textContent = `${action}: sent…`;
      try {
        const answer = await api(method, path, body);
        if (answer.ok) {
          result.className = "done";
          result.textContent = `${action}: done` + (answer.json && answer.json.rollout ? ` (phase ${answer.json.rollout.phase})` : "");
        } else {
          const j = answer.json || {};
          result.className = "refused";
          result.textContent = `${action} refused (${answer.status} ${j.kind || ""}): ${j.error || "no reason given"}`;
        }
      } catch (e) {
        result.className = "refused";
        result.textContent = `${action} failed: ${e.message}`;
      }
      refresh();
    });
  }

  // ---- start -----------------------------------------------------------

  function start() {
    $("token-use").addEventListener("click", useToken);
    $("token").addEventListener("keydown", (e) => {
      if (e.key === "Enter") useToken();
    });
    $("token-forget").addEventListener("click", forgetToken);
    $("rollout-model").addEventListener("change", (e) => {
      selected = e.target.value;
      if (status) render();
    });
    for (const b of document.querySelectorAll("#actions button")) b.addEventListener("click", () => act(b.dataset.action));
    showToken();
    refresh();
    loadUnloads();
    stream();
    polling = setInterval(refresh, POLL_MS);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
  window.addEventListener("pagehide", () => clearInterval(polling));
})();
