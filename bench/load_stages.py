"""The MLP's latency in each stage of the loads beside it.

Reads a load-isolation drill run with STAGES=1 (bench/load-isolation.sh):
PREFIX.json, the drill's report with every request (--records), and
PREFIX.loads.jsonl, baton's report of each load, one per line, whose
stages give their durations. Each load's stages are laid end to end from
its swap's trigger (the load call starts a few milliseconds later, which
this leaves out), and each request is put in the stage its start falls in;
the drill's steady windows are the baseline.

    python3 bench/load_stages.py .baton/bench/results/isolation-baton-noautogroup

docs/benchmarks-notebook.md §3, "Long reads", quotes it.
"""
import json
import sys

ORDER = ["steady", "fetch", "verify", "load", "validate", "warmup", "commit", "drain", "after commit"]


def quantile(values, p):
    return values[min(len(values) - 1, int(p * len(values)))]


def spans_of(report, loads):
    """(from_ms, to_ms, stage) of every stage of every load, and of the
    rest of each swap's window after the last stage."""
    spans = []
    for swap, load in zip(report["swaps"], loads):
        at = swap["trigger_s"] * 1000
        for stage in load["stages"]:
            spans.append((at, at + stage["duration"], stage["stage"]))
            at += stage["duration"]
        if swap.get("window_end_s"):
            spans.append((at, swap["window_end_s"] * 1000, "after commit"))
    return spans


def main():
    prefix = sys.argv[1]
    report = json.load(open(prefix + ".json"))
    loads = [json.loads(line) for line in open(prefix + ".loads.jsonl") if line.strip()]
    records = report.get("records")
    if not records:
        sys.exit(f"{prefix}.json has no records: run the drill with STAGES=1")
    if len(loads) != len(report["swaps"]):
        print(f"note: {len(report['swaps'])} swaps but {len(loads)} load reports; the first ones are paired")
    spans = spans_of(report, loads)
    steady = [(w["from_s"] * 1000, w["to_s"] * 1000) for w in report["windows"] if w["kind"] == "steady"]
    by_stage = {}
    for start, latency, error in zip(records["start_ms"], records["latency_ms"], records["error"]):
        if error:
            continue
        stage = next((s for a, b, s in spans if a <= start < b), None)
        if stage is None and any(a <= start < b for a, b in steady):
            stage = "steady"
        if stage is not None:
            by_stage.setdefault(stage, []).append(latency)
    for values in by_stage.values():
        values.sort()
    if "steady" not in by_stage:
        sys.exit("no steady requests")
    base = quantile(by_stage["steady"], 0.99)
    print(f"{'stage':13} {'requests':>8} {'p50 ms':>7} {'p90':>7} {'p99':>7} {'max':>7} {'p99 ratio':>9} {'over steady p99 per 1,000':>26}")
    for stage in ORDER + sorted(set(by_stage) - set(ORDER)):
        values = by_stage.get(stage)
        if not values:
            continue
        over = 1000 * sum(v > base for v in values) / len(values)
        print(
            f"{stage:13} {len(values):8} {quantile(values, .5):7.3f} {quantile(values, .9):7.3f} "
            f"{quantile(values, .99):7.3f} {values[-1]:7.2f} {quantile(values, .99) / base:9.2f} {over:26.1f}"
        )
    durations = {}
    for load in loads:
        for stage in load["stages"]:
            durations.setdefault(stage["stage"], []).append(stage["duration"])
    print("stage durations, median ms: " + ", ".join(
        f"{s} {sorted(d)[len(d) // 2]:.0f}" for s, d in durations.items() if max(d) >= 1))
    stalls = report.get("stalls") or {}
    if stalls.get("steady"):
        print(f"probe late > {stalls.get('late_ms')} ms per minute: steady {stalls['steady']['per_minute']:.0f}, "
              f"windows {stalls['in_swaps']['per_minute']:.0f}")


if __name__ == "__main__":
    main()
