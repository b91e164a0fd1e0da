#!/usr/bin/env python3
"""Why did a serving thread wait behind baton's loader?

For every wait of a serving thread (tokio-rt-worker) longer than 1 ms
behind one of baton's loader threads (the waits bench/sched_blame.py counts
as "behind the loader"), this reads the scheduler
events before it from the `perf sched record` trace and tells which of
three things happened:

  woken before the loader was picked  the serving thread's wake-up to this
      CPU came first, and the scheduler still chose the loader to run next
  woken while the loader ran          the wake-up came while the loader was
      already running and did not take the CPU from it at once
  migrated here after waking          the thread was woken elsewhere and
      moved to this CPU

    python3 bench/wake_order.py TIMEHIST PERF_DATA

TIMEHIST is `perf sched timehist` output of PERF_DATA; bench/sched-trace.sh
runs this after bench/sched_blame.py.
"""

import re
import subprocess
import sys

from sched_blame import LOADER, THRESHOLD_MS, events

EVENT = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:(\w+):(.*)")


def waits_behind_loader(timehist):
    """(switch-in time, cpu, tid, wait ms, loader's start) for each wait of
    a serving thread behind a loader thread, found as bench/sched_blame.py
    finds them."""
    held = {}  # cpu -> (task, run start) of the last task switched in there
    found = []
    for end, cpu, task, delay, run in events(timehist):
        start = end - run / 1000
        holder = held.get(cpu)
        if task.startswith("tokio-rt-worker") and delay > THRESHOLD_MS and holder and holder[0].startswith(LOADER):
            tid = re.search(r"\[(\d+)/", task)[1]
            found.append((start, int(cpu.strip("[]")), tid, delay, holder[1]))
        held[cpu] = (task, start)
    return found


def classify(data, start, cpu, tid, loader_start):
    trace = subprocess.run(
        ["perf", "script", "-i", data, "--time", f"{loader_start - 0.01:.6f},{start + 0.0001:.6f}",
         "-F", "cpu,time,event,trace"],
        capture_output=True, text=True, check=False,
    ).stdout
    waking, migrated = None, False
    for line in trace.splitlines():
        m = EVENT.search(line)
        if not m or f"pid={tid} " not in m[4]:
            continue
        at, event = float(m[2]), m[3]
        if event == "sched_waking":
            waking = (at, int(re.search(r"target_cpu=(\d+)", m[4])[1]))
            migrated = False
        elif event == "sched_migrate_task" and waking:
            migrated = True
    if waking is None:
        return "no wake-up within 10 ms before the loader ran"
    if migrated or waking[1] != cpu:
        return "migrated here after waking"
    return "woken before the loader was picked" if waking[0] < loader_start else "woken while the loader ran"


def main():
    timehist, data = sys.argv[1], sys.argv[2]
    kinds = {}
    for start, cpu, tid, wait_ms, loader_start in waits_behind_loader(timehist):
        kinds.setdefault(classify(data, start, cpu, tid, loader_start), []).append(wait_ms)
    print("serving threads' waits over 1 ms behind the loader, by what came first:")
    for kind, waits in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        listed = ", ".join(f"{w:.2f}" for w in sorted(waits, reverse=True))
        print(f"  {kind}: {len(waits)} ({listed} ms)")


if __name__ == "__main__":
    main()
