#!/usr/bin/env python3
"""Does freeing a large block of memory stall the machine a moment later?

In one load-isolation drill (docs/benchmarks-notebook.md §3) two stalls began 2.0 s
after baton freed a 962 MiB version, and 2 s is the delay of the kernel's
free page reporting, which hands freed memory back to the VM's host. This
tests that without baton: one process fills and frees SIZE MiB, COUNT
times, 7 s apart, while two probe processes sleep 1 ms in a loop and record
every sleep that overran by more than 3 ms. A stall of the whole VM shows
in both probes at once; the report lists the overruns in the 5 s after
each free next to the worst one elsewhere.

    python3 bench/free_probe.py [SIZE_MIB [COUNT]]     (default 1024 6)

It runs COUNT * 7 + 3 seconds and stops by itself. Run it on an otherwise
idle machine.
"""

import multiprocessing as mp
import sys
import time

OVERRUN_MS = 3.0
AFTER_FREE_S = 5.0
SPACING_S = 7.0


def probe(until: float, queue) -> None:
    """Sleeps 1 ms in a loop; sends (time, ms) for each overrun."""
    found = []
    while time.time() < until:
        start = time.perf_counter()
        time.sleep(0.001)
        took = (time.perf_counter() - start) * 1000
        if took > 1 + OVERRUN_MS:
            found.append((time.time(), took))
    queue.put(found)


def churn(size_mib: int, count: int, queue) -> None:
    """Fills and frees size_mib, count times; sends the times of the frees."""
    frees = []
    for _ in range(count):
        block = bytearray(b"\x01") * (size_mib << 20)  # every page touched
        frees.append(time.time())
        del block  # one munmap: the whole block goes back at once
        time.sleep(SPACING_S)
    queue.put(frees)


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    until = time.time() + count * SPACING_S + 3
    queues = [mp.Queue() for _ in range(3)]
    probes = [mp.Process(target=probe, args=(until, q)) for q in queues[:2]]
    for p in probes:
        p.start()
    time.sleep(1)
    churner = mp.Process(target=churn, args=(size, count, queues[2]))
    churner.start()
    frees = queues[2].get()
    overruns = [q.get() for q in queues[:2]]
    churner.join()
    for p in probes:
        p.join()

    print(f"{count} frees of {size} MiB, {SPACING_S:.0f} s apart; 1 ms sleeps that overran by more than {OVERRUN_MS} ms:")
    for n, freed in enumerate(frees, 1):
        seen = [f"probe {i}: {ms:.1f} ms at +{t - freed:.2f} s" for i, found in enumerate(overruns) for t, ms in found
                if 0 <= t - freed < AFTER_FREE_S]
        print(f"  free {n}, the {AFTER_FREE_S:.0f} s after it: {'; '.join(seen) or 'none'}")
    for i, found in enumerate(overruns):
        elsewhere = [ms for t, ms in found if not any(0 <= t - f < AFTER_FREE_S for f in frees)]
        print(f"  probe {i}, outside those: {len(elsewhere)} overruns, the worst {max(elsewhere, default=0):.1f} ms")

if __name__ == "__main__":
    main()
