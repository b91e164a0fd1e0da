"""Attributes scheduling waits to the task that held the CPU.

Reads `perf sched timehist` output, the JSON report of the `baton drill`
that ran meanwhile and the offset between the wall clock and
CLOCK_MONOTONIC. For every switch-in of a serving thread (tokio-rt-worker)
or of a drill thread (drill-load) that had waited more than 1 ms since its
wake-up, the task switched out just before on the same CPU is the one that
held it. Waits are summed per holder, in swap windows and in steady time
apart, and the longest waits behind baton's loader threads are listed.

    python3 bench/sched_blame.py TIMEHIST DRILL_JSON CLOCK_OFFSET
"""
import collections
import json
import sys

WAITERS = ("tokio-rt-worker", "drill-load")
LOADER = ("baton-build", "baton-loader", "baton-release", "baton-drain")
THRESHOLD_MS = 1.0


def events(path):
    """(time s, cpu, task, wait-to-run ms, run ms) per switch-in."""
    for line in open(path):
        fields = line.split()
        try:
            yield float(fields[0]), fields[1], fields[2], float(fields[4]), float(fields[5])
        except (IndexError, ValueError):
            continue  # headers


def main(timehist, drill_json, offset_path):
    report = json.load(open(drill_json))
    shift = report["started_unix_s"] - float(open(offset_path).read())
    windows = [(shift + s["trigger_s"], shift + s["window_end_s"]) for s in report["swaps"]]
    in_window = lambda t: any(a <= t <= b for a, b in windows)

    held = {}  # cpu -> (task, run ms) of the last task switched in there
    waits = {"swap windows": collections.Counter(), "steady": collections.Counter()}
    total = {"swap windows": collections.Counter(), "steady": collections.Counter()}
    behind_loader = []
    first = last = None
    for t, cpu, task, delay, run in events(timehist):
        first = t if first is None else first
        last = t
        name = task.split("[")[0]
        if delay > THRESHOLD_MS and name.startswith(WAITERS) and cpu in held:
            holder = held[cpu][0].split("[")[0]
            phase = "swap windows" if in_window(t) else "steady"
            waits[phase][holder] += 1
            total[phase][holder] += delay
            if holder.startswith(LOADER):
                behind_loader.append((delay, name, held[cpu][1]))
        held[cpu] = (task, run)
    if first is None:
        sys.exit("sched_blame: no events in " + timehist)
    span = last - first
    win = sum(max(0.0, min(b, last) - max(a, first)) for a, b in windows)
    print(f"trace {span:.1f} s: swap windows {win:.1f} s, steady {span - win:.1f} s")
    print(f"waits over {THRESHOLD_MS:g} ms of serving and drill threads, by the task that held the CPU:")
    for phase, seconds in (("swap windows", win), ("steady", span - win)):
        print(f"  {phase} ({seconds:.1f} s)")
        for holder, ms in total[phase].most_common(10):
            print(f"    {holder:24s} {waits[phase][holder]:5d} waits  {ms:8.1f} ms")
    for waiter in WAITERS:
        mine = [d for d, w, _ in behind_loader if w == waiter]
        print(f"behind the loader, {waiter}: {len(mine)} waits, {sum(mine):.1f} ms")
    behind_loader.sort(reverse=True)
    print("longest waits behind the loader (wait ms, waiter, loader's run ms):",
          ", ".join(f"{d:.2f} {w} {r:.2f}" for d, w, r in behind_loader[:8]) or "none")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
