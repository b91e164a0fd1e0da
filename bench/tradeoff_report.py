#!/usr/bin/env python3
"""The trade-off table, in-process against worker-process versions (and
Triton's python backend, whose stubs are worker processes too), from
the reports bench/tradeoff.sh and bench/load-isolation.sh (its `baton` and
`baton-worker` drills, repeats included: the median) leave in
.baton/bench/results. Prints a Markdown table; a part with no report reads
"not run".

    python3 bench/tradeoff_report.py [RESULTS_DIR]
"""

import glob
import json
import os
import statistics
import sys

RESULTS = sys.argv[1] if len(sys.argv) > 1 else ".baton/bench/results"
MIB = 1 << 20


def report(name):
    path = os.path.join(RESULTS, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def swaps_row(r):
    if r is None:
        return ["not run"] * 6
    times = [s["action_ms"] for s in r["swaps"] if s.get("action_ok")]
    steady, swaps, worst = r["steady"], r["in_swaps"], r["worst_at_equal_size"]
    rss = r["rss"]
    return [
        f"{statistics.median(times):.0f} ms (of {len(times)})",
        f"{swaps['p99_ms']:.2f} / {steady['p99_ms']:.2f} ms = {swaps['p99_ms'] / steady['p99_ms']:.2f}×",
        f"{worst['in_swaps_ms']:.1f} / {worst['steady_ms']:.1f} ms",
        f"{max(rss['peak_during_swaps']) / MIB:.0f} MiB",
        f"{rss['last_bytes'] / MIB:.0f} MiB ({rss['growth_per_swap_bytes'] / 1024:+.0f} KiB per swap)",
        f"{r['failed']} of {r['requests']:,}",
    ]


def cpu_per_request(name, r):
    """The server's (and its workers') CPU per request over a drill, in µs."""
    path = os.path.join(RESULTS, name + ".cpu")
    if r is None or not os.path.exists(path):
        return "not run"
    with open(path) as f:
        ticks, per_second = (int(x) for x in f.read().split())
    # The drill's warm-up is in the CPU time: count its requests too, at
    # the rate of the measured part.
    warmup = 3.0
    requests = r["requests"] * (1 + warmup / r["duration_s"])
    return f"{ticks / per_second / requests * 1e6:.0f} µs"


def steady_row(r, light, name=None):
    cells = ["not run"] * 4
    if name is not None:
        cells[2] = cpu_per_request(name, r)
        cells[3] = cpu_per_request(name + "-light", light)
    if r is not None:
        s = r["steady"]
        cells[0] = f"{r['requests'] / r['duration_s']:,.0f}/s (p50 {s['p50_ms'] * 1000:.0f} µs)"
    if light is not None:
        s = light["steady"]
        cells[1] = f"{s['p50_ms'] * 1000:.0f} / {s['p99_ms'] * 1000:.0f} µs"
    return cells


def isolation_row(label):
    runs = []
    for path in sorted(glob.glob(os.path.join(RESULTS, f"isolation-{label}.json"))) + sorted(
        glob.glob(os.path.join(RESULTS, f"isolation-{label}.[0-9]*.json"))
    ):
        with open(path) as f:
            r = json.load(f)
        times = [s["action_ms"] for s in r["swaps"] if s.get("action_ok")]
        runs.append((r["in_swaps"]["p99_ms"] / r["steady"]["p99_ms"], statistics.median(times)))
    if not runs:
        return ["not run"] * 2
    ratios = ", ".join(f"{ratio:.2f}×" for ratio, _ in runs)
    return [f"{ratios} (median {statistics.median(r for r, _ in runs):.2f}×)",
            f"{statistics.median(t for _, t in runs) / 1000:.2f} s"]


def main():
    routes = ("inproc", "worker", "triton")
    swaps = {route: swaps_row(report(f"tradeoff-swaps-{route}")) for route in routes}
    steady = {
        route: steady_row(report(f"tradeoff-steady-{route}"), report(f"tradeoff-steady-{route}-light"),
                          f"tradeoff-steady-{route}")
        for route in routes + ("worker-asleep",)
    }
    isolation = {
        "inproc": isolation_row("baton"),
        "worker": isolation_row("baton-worker"),
        "triton": isolation_row("triton"),
    }
    blast_cells = {}
    for route, what in (("worker", "workers"), ("triton", "stubs")):
        blast = report(f"tradeoff-blast-{route}")
        blast_cells[route] = "not run"
        if blast is not None:
            killed = sum(1 for s in blast["swaps"] if s.get("action_ok"))
            blast_cells[route] = f"{blast['failed']} of {blast['requests']:,} failed, {killed} {what} killed"
    rows = [
        ("throughput, MLP batch 1, gRPC closed loop ×4", steady, 0),
        ("p50 / p99, the same at LIGHT requests/s (open loop)", steady, 1),
        ("swap time (median)", swaps, 0),
        ("p99 in swap windows / steady", swaps, 1),
        ("worst request, swaps / steady (equal counts)", swaps, 2),
        ("peak RSS during a swap (server and workers)", swaps, 3),
        ("RSS after the swaps (growth per swap)", swaps, 4),
        ("failed requests during the swaps", swaps, 5),
        ("other model's p99 while 480 MiB load, / steady", isolation, 0),
        ("that load's time (median)", isolation, 1),
    ]
    print("| | baton, in the server's process | baton, in a worker process | Triton 2.51, python backend stub |")
    print("|---|---|---|---|")
    for name, table, i in rows:
        print(f"| {name} | {' | '.join(table[route][i] for route in routes)} |")
    print(
        "| other models when one version's process is killed | the server's process: every model | "
        f"{blast_cells['worker']} | {blast_cells['triton']} |"
    )
    print()
    print("The hop's look for the other side's message (worker_spin_us), steady only:")
    print()
    print("| | in the server's process | worker, looking 100 µs (default) | worker, sleeping at once |")
    print("|---|---|---|---|")
    for name, i in (("throughput, closed loop ×4", 0), ("p50 / p99 at LIGHT requests/s", 1),
                    ("CPU per request, closed loop (server and workers)", 2),
                    ("CPU per request at LIGHT requests/s", 3)):
        print(f"| {name} | {' | '.join(steady[r][i] for r in ('inproc', 'worker', 'worker-asleep'))} |")


if __name__ == "__main__":
    main()
