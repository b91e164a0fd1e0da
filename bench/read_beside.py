"""What one long read by a low-priority thread costs a thread beside it.

A reader process under SCHED_IDLE reads FILE from the page cache in a loop,
CHUNK bytes per pread, on one CPU. On the same CPU a probe at normal
priority sleeps 1 ms in a loop and records how late each wake is: a
serving thread woken on a loader's CPU waits as long. Rounds alternate the
chunk sizes given (0: no reader, the control), SECONDS each.

    python3 bench/read_beside.py FILE [--chunks 0,262144,268435456]
                                      [--seconds 10] [--rounds 2] [--cpu 1]

Needs Linux; no root. docs/benchmarks-notebook.md §3, "Long reads", quotes it and
says why baton's loading threads read files in pieces
(crates/baton-core/src/files/short_reads.rs).
"""
import argparse
import os
import time


def reader(path, chunk, cpu, seconds):
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    buf = memoryview(bytearray(chunk))
    end = time.monotonic() + seconds
    offset = 0
    while time.monotonic() < end:
        os.preadv(fd, [buf], offset)
        offset = offset + chunk if offset + 2 * chunk < size else 0


def probe(cpu, seconds):
    os.sched_setaffinity(0, {cpu})
    late = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic()
        time.sleep(0.001)
        late.append((time.monotonic() - t) * 1000 - 1)
    late.sort()
    return late


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--chunks", default="0,262144,268435456")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cpu", type=int, default=1)
    args = ap.parse_args()
    with open(args.file, "rb") as f:  # into the page cache first
        while f.read(1 << 24):
            pass
    print(f"{'chunk bytes':>12} {'wakes':>6} {'p50 ms':>7} {'p90':>7} {'p99':>7} {'p99.9':>7} {'max':>7}")
    for _ in range(args.rounds):
        for chunk in (int(c) for c in args.chunks.split(",")):
            child = None
            if chunk:
                child = os.fork()
                if child == 0:
                    try:
                        reader(args.file, chunk, args.cpu, args.seconds + 1)
                    finally:
                        os._exit(0)
                time.sleep(0.5)
            late = probe(args.cpu, args.seconds)
            if child:
                os.kill(child, 9)
                os.waitpid(child, 0)
            n = len(late)
            q = lambda p: late[min(n - 1, int(p * n))]
            print(f"{chunk:>12} {n:>6} {q(.5):7.3f} {q(.9):7.3f} {q(.99):7.3f} {q(.999):7.3f} {late[-1]:7.2f}")


if __name__ == "__main__":
    main()
