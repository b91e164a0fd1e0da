#!/usr/bin/env python3
"""Summarises a bench/run-all.sh run (.baton/bench/results) as the Markdown
tables of docs/BENCHMARKS.md: medians of repeated runs, and ratios between
numbers of the same run.

    python3 bench/summarize.py [RESULTS_DIR]
"""

import json
import re
import statistics
import sys
from pathlib import Path

results = Path(sys.argv[1] if len(sys.argv) > 1 else ".baton/bench/results")


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def sections():
    """run-all.txt split at its "## " headings: a list of (heading, lines)."""
    out = [("", [])]
    for line in (results / "run-all.txt").read_text().splitlines():
        if line.startswith("## "):
            out.append((line[3:], []))
        else:
            out[-1][1].append(line)
    return out


PERF_LINE = re.compile(r"(\S+)\s+([\d.]+) infer/s\s+p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms")


def perf_runs(lines):
    """perf_analyzer lines by label: [(infer/s, p99 ms), ...]."""
    perf = {}
    for line in lines:
        m = PERF_LINE.match(line)
        if m:
            perf.setdefault(m[1], []).append((float(m[2]), float(m[4])))
    return perf


def raw_rates(lines):
    """The Rust raw engine's calls/s by thread count, from its JSON lines."""
    raw = {1: [], 2: []}
    for line in lines:
        if line.startswith('{"batch":1'):
            r = json.loads(line)
            raw[r["threads"]].append(r["calls_per_s"])
    return raw


def throughput(parts):
    raw_lines = [l for h, ls in parts if h.startswith("raw engine") and "MLP" in h for l in ls]
    raw = raw_rates(raw_lines)
    py = [json.loads(l)["calls_per_s"] for l in raw_lines if l.startswith('{"model"')]
    perf = {k: v for k, v in perf_runs(l for _, ls in parts for l in ls).items() if "/" not in k}
    print("| server | infer/s (median of 3) | p99 ms (median) |")
    print("|---|---|---|")
    for name, runs in perf.items():
        print(f"| {name} | {median([r[0] for r in runs]):,.0f} | {median([r[1] for r in runs]):.2f} |")
    print(f"| raw engine, Rust, 1 session | {median(raw[1]):,.0f} | |")
    print(f"| raw engine, Rust, 2 sessions on 2 threads | {median(raw[2]):,.0f} | |")
    if py:
        print(f"| raw engine, Python onnxruntime, 1 session | {median(py):,.0f} | |")
    b = median([r[0] for r in perf.get("baton-binary", [])])
    for peer in ("mlserver", "kserve"):
        if peer in perf:
            print(f"\nbaton-binary / {peer}: {b / median([r[0] for r in perf[peer]]):.1f}x infer/s")
    print(f"baton-binary / raw engine (1 session): {b / median(raw[1]):.2f}; / raw (2 sessions): {b / median(raw[2]):.2f}")


ROUND = re.compile(r"round (\d+): raw ([\d.]+) calls/s \| perf_analyzer ([\d.]+) infer/s p99 ([\d.]+) ms \| "
                   r"drill ([\d.]+) requests/s p99 ([\d.]+) ms")


def engine_share():
    """bench/engine-share.sh: the raw engine and baton alternated, each
    round's ratios and their medians (the target's verdict)."""
    path = results / "engine-share.txt"
    rounds = [ROUND.match(line) for line in path.read_text().splitlines()] if path.exists() else []
    rounds = [(float(m[2]), float(m[3]), float(m[4]), float(m[5]), float(m[6])) for m in rounds if m]
    if not rounds:
        return
    print("\nShare of the engine's rate, alternated round by round (MLP, batch 1, HTTP binary, c=4)\n")
    print("| round | raw engine calls/s | perf_analyzer infer/s (p99 ms) | share | baton drill requests/s (p99 ms) | share |")
    print("|---|---|---|---|---|---|")
    for i, (raw, pa, pa99, drill, drill99) in enumerate(rounds, 1):
        print(f"| {i} | {raw:,.0f} | {pa:,.0f} ({pa99:.2f}) | {pa / raw:.3f} | {drill:,.0f} ({drill99:.2f}) | {drill / raw:.3f} |")
    pa_share = median([r[1] / r[0] for r in rounds])
    drill_share = median([r[3] / r[0] for r in rounds])
    print(f"\nmedian share over {len(rounds)} rounds: under perf_analyzer {pa_share:.3f}, under baton drill {drill_share:.3f}")


def encoder_throughput(parts):
    raw = raw_rates(l for h, ls in parts if h.startswith("raw engine") and "encoder" in h for l in ls)
    perf = {k: v for k, v in perf_runs(l for _, ls in parts for l in ls).items() if k.startswith("encoder-c")}
    if not perf:
        return
    levels = sorted({k.split("/")[0] for k in perf}, key=lambda c: int(c.split("-c")[1]))
    configs = list(dict.fromkeys(k.split("/")[1] for k in perf))
    print("\nThroughput, encoder, batch 1 (perf_analyzer; infer/s and p99 ms, medians of 3)\n")
    print("| server | " + " | ".join(f"c={c.split('-c')[1]}" for c in levels) + " |")
    print("|---|" + "---|" * len(levels))
    for cfg in configs:
        cells = []
        for level in levels:
            runs = perf.get(f"{level}/{cfg}", [])
            cells.append(f"{median([r[0] for r in runs]):,.1f} ({median([r[1] for r in runs]):.1f} ms)" if runs else "")
        print(f"| {cfg} | " + " | ".join(cells) + " |")
    print(f"\nraw engine (Rust, no server): 1 session {median(raw[1]):,.1f} calls/s, "
          f"2 sessions on 2 threads {median(raw[2]):,.1f} calls/s")
    for level in levels:
        b = median([r[0] for r in perf.get(f"{level}/baton-binary", [])])
        peers = [f"{cfg} {b / median([r[0] for r in perf[f'{level}/{cfg}']]):.2f}x"
                 for cfg in configs if cfg.startswith(("mlserver", "kserve")) and f"{level}/{cfg}" in perf]
        print(f"\nc={level.split('-c')[1]}: baton-binary / " + ", / ".join(peers)
              + f"; / raw engine (1 session) {b / median(raw[1]):.2f}, (2 sessions) {b / median(raw[2]):.2f}")


SERVERS = ("baton", "mlserver", "kserve", "baton-noautogroup", "baton-worker")
REPEAT = re.compile(r"^(.*)\.(\d+)$")


def drills(prefix):
    """The drills of one benchmark, in SERVERS order and each server's
    repeats (a name ending in .N, bench/common.sh) in order: (name, server, report)."""
    found = []
    for path in results.glob(f"{prefix}-*.json"):
        name = path.stem[len(prefix) + 1:]
        m = REPEAT.match(name)
        server, n = (m.group(1), int(m.group(2))) if m else (name, 1)
        if server in SERVERS:
            found.append((SERVERS.index(server), n, name, server, json.loads(path.read_text())))
    return [(name, server, r) for _, _, name, server, r in sorted(found)]


def listed(xs):
    return ", ".join(f"{x:.2f}" for x in xs)


# A drill ran on a quiet machine when its stall probe (`baton drill
# --stall-probe 2ms`, as bench/load-isolation.sh runs it) was late over 2 ms
# at most this often per minute of steady time. Steady time has no load running, so its late wakes are the
# machine's own; the windows' are not counted, since there a late wake may
# be a kernel section of the load's, and excluding a drill for that would
# hide what the load costs. 30 a minute is a line drawn, not a measured
# cut: in the six isolation drills of docs/benchmarks-notebook.md §3 at 20:10, the
# two with 4 a minute had a steady p99 of 0.70 ms (the quiet machine's),
# the one with 20 had 1.00 ms, and the three with 47-58 had 0.98-1.46 ms.
# Those counts came from one probe; since 2 December the drill runs one per
# CPU and counts the stops of any CPU, so the same line is a little stricter.
QUIET_PER_MINUTE = 30
QUIET_LATE_MS = 2


def quiet(report):
    """True or False for a drill run with the stall probe at 2 ms; None
    without it (or at another threshold, whose counts do not compare)."""
    st = report.get("stalls")
    if not st or st["late_ms"] != QUIET_LATE_MS:
        return None
    return st["steady"]["per_minute"] <= QUIET_PER_MINUTE


def drill_table(prefix, title):
    print(f"\n{title}\n")
    print("| server | requests | failed | steady p99 ms | swap-window p99 ms | ratio | steady max ms | swap-window max ms | load call ms (median) | time to serve ms (median / max) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    # The maximum of more requests is larger even when nothing is worse;
    # swap windows usually hold more. The worst at equal size goes below.
    tails = []
    # Per server: each drill's p99 ratio, worst as written and at equal size.
    repeats = {}
    # baton-noautogroup: the drill again with autogroup off (bench/common.sh).
    for name, server, r in drills(prefix):
        s, w = r["steady"], r["in_swaps"]
        actions = [x["action_ms"] for x in r["swaps"] if x.get("action_ms") is not None]
        served = sorted(x["time_to_serve_ms"] for x in r["swaps"] if x.get("time_to_serve_ms"))
        tts = f"{median(served):.0f} / {served[-1]:.0f}" if served else "not observable"
        ratio = w["p99_ms"] / s["p99_ms"] if s["p99_ms"] else float("nan")
        print(f"| {name} | {r['requests']:,} | {r['failed']} | {s['p99_ms']:.3g} | {w['p99_ms']:.3g} | {ratio:.2f} | "
              f"{s['max_ms']:.3g} | {w['max_ms']:.3g} | {median(actions):.0f} | {tts} |")
        rep = repeats.setdefault(server, {"ratio": [], "worst": [], "equal": [], "failed": 0, "quiet": []})
        rep["ratio"].append(ratio)
        calm = quiet(r)
        if calm is not None:
            rep["quiet"].append((name, ratio, calm))
        rep["worst"].append(w["max_ms"] / s["max_ms"] if s["max_ms"] else float("nan"))
        rep["failed"] += r["failed"]
        eq = r.get("worst_at_equal_size")
        if eq and eq.get("steady_ms") is not None and eq.get("in_swaps_ms") is not None:
            rep["equal"].append(eq["in_swaps_ms"] / eq["steady_ms"])
            tails.append(f"{name}: p99.9 steady {s['p999_ms']:.3g} ms, swap windows {w['p999_ms']:.3g} ms; "
                         f"worst at equal size ({eq['requests']:,} requests each): steady {eq['steady_ms']:.3g} ms, "
                         f"swap windows {eq['in_swaps_ms']:.3g} ms")
        st = r.get("stalls")
        if st:
            a, b = st["steady"], st["in_swaps"]
            tails.append(f"{name}: machine stalls ({'real-time' if st['realtime'] else 'normal-priority'} probe, "
                         f"wakes over {st['late_ms']:g} ms late): steady {a['count']} ({a['per_minute']:.1f}/min, "
                         f"max {a['max_ms']:.3g} ms), swap windows {b['count']} ({b['per_minute']:.1f}/min, "
                         f"max {b['max_ms']:.3g} ms)")
            for kind, key in (("steady", "slowest_steady"), ("swap windows", "slowest_in_swaps")):
                if st.get(key):
                    tails.append(f"{name}: slowest in {kind}, ms (of it the probe stalled too): " + ", ".join(
                        f"{x['latency_ms']:.3g} ({x['stalled_ms']:.3g})" for x in st[key]))
        load, after = r.get("in_swaps_loading"), r.get("in_swaps_after_commit")
        if load and after and load["requests"] and after["requests"]:
            tails.append(f"{name}: swap windows split at the commit: trigger to commit {load['requests']:,} requests, "
                         f"p99 {load['p99_ms']:.3g} ms, p99.9 {load['p999_ms']:.3g} ms; after commit "
                         f"{after['requests']:,} requests, p99 {after['p99_ms']:.3g} ms, p99.9 {after['p999_ms']:.3g} ms")
    for line in tails:
        print(f"\n{line}")
    # One drill is not a measurement here; the repeats' medians are the verdicts.
    for server, rep in repeats.items():
        if len(rep["ratio"]) < 2:
            continue
        print(f"\n{server}, {len(rep['ratio'])} drills: failed {rep['failed']}; p99 ratio {listed(rep['ratio'])}, "
              f"median {median(rep['ratio']):.2f}; worst window / worst steady {listed(rep['worst'])}, median "
              f"{median(rep['worst']):.2f}; at equal size {listed(rep['equal'])}, median {median(rep['equal']):.2f}")
    # On a stalling machine a drill compares one noisy stretch with another:
    # with the probe, only the quiet drills give the verdict.
    for server, rep in repeats.items():
        if len(rep["ratio"]) < 2 or not rep["quiet"]:
            continue
        calm = [(n, x) for n, x, is_calm in rep["quiet"] if is_calm]
        noisy = len(rep["quiet"]) - len(calm)
        unprobed = len(rep["ratio"]) - len(rep["quiet"])
        left = f"; {unprobed} without a 2 ms probe left out too" if unprobed else ""
        if calm:
            print(f"\n{server}, quiet drills (probe late over 2 ms at most {QUIET_PER_MINUTE} times a minute in "
                  f"steady time): p99 ratio {', '.join(f'{n} {x:.2f}' for n, x in calm)}, median "
                  f"{median([x for _, x in calm]):.2f}; {noisy} of {len(rep['quiet'])} probed drills measured a "
                  f"stalling machine and are left out{left}")
        else:
            which = "the one probed drill" if noisy == 1 else f"all {noisy} probed drills"
            print(f"\n{server}: no verdict, {which} measured a stalling machine (probe late "
                  f"over 2 ms more than {QUIET_PER_MINUTE} times a minute in steady time){left}")


def memory():
    print("\nMemory over many swaps\n")
    print("| server | swaps | RSS before swap 1 MiB | before swap 2 | at the end | growth from swap 2 on (slope) | end − swap 2 |")
    print("|---|---|---|---|---|---|---|")
    for server in ("baton", "mlserver", "kserve"):
        path = results / f"memory-{server}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        b = r["rss"]["before_swaps"] + [r["rss"]["last_bytes"]]
        mib = [x / 2**20 for x in b]
        ys = mib[1:]
        xs = list(range(len(ys)))
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        print(f"| {server} | {len(b) - 1} | {mib[0]:.1f} | {ys[0]:.1f} | {ys[-1]:.1f} | {slope:+.3f} MiB/swap ({slope * (len(ys) - 1):+.1f} MiB) | {ys[-1] - ys[0]:+.1f} MiB |")
    unloads = results / "memory-baton-unloads.json"
    path = results / "memory-baton.json"
    if unloads.exists() and path.exists():
        u = json.loads(unloads.read_text())
        r = json.loads(path.read_text())
        b = r["rss"]["before_swaps"] + [r["rss"]["last_bytes"]]
        held = median([x["held"] for x in u]) / 2**20
        residual = sum(x["residual"] for x in u) / 2**20
        print(f"\nbaton's own unload records: {len(u)} frees, median held {held:.1f} MiB; "
              f"residual summed over the frees {residual:+.1f} MiB, unaccounted memory "
              f"{u[0]['unaccounted'] / 2**20:.1f} → {u[-1]['unaccounted'] / 2**20:.1f} MiB; "
              f"RSS from before swap 2 to the end {(b[-1] - b[1]) / 2**20:+.1f} MiB")
        # The allocator settles over the first swaps; compare the two
        # periods apart. Free k (from 1) ends swap k + 1.
        settle = 30
        if len(u) > settle and len(b) > settle + 2:
            early = sum(x["residual"] for x in u[:settle]) / 2**20
            late = sum(x["residual"] for x in u[settle:]) / 2**20
            print(f"  frees 1-{settle}: residual {early:+.1f} MiB, RSS swap 2 to {settle + 2} "
                  f"{(b[settle + 1] - b[1]) / 2**20:+.1f} MiB; frees {settle + 1}-{len(u)}: residual "
                  f"{late:+.1f} MiB, RSS swap {settle + 2} to the end {(b[-1] - b[settle + 1]) / 2**20:+.1f} MiB")


parts = sections()
throughput(parts)
engine_share()
encoder_throughput(parts)
drill_table("swap", "Swap under fire (MLP, closed loop x4, JSON)")
drill_table("isolation", "Loading the 480 MiB model beside the MLP (MLP at a fixed rate, JSON)")
memory()
