"""A process that keeps one CPU busy on cue, for bench/busy-beside.sh.

Started under SCHED_IDLE beside a server, it waits for SIGUSR1, then for
SECONDS does MODE, then waits again:

    spin      arithmetic only: no memory traffic, no system calls
    duty:P    spin P percent of each millisecond, sleep the rest
    fresh     map MiB of memory, write every byte, unmap it; repeat
    warm      write every byte of MiB of memory mapped and written at start
    none      nothing (the drill's control)

    python3 bench/busy_beside.py MODE MIB SECONDS READY_FILE

It creates READY_FILE once it is ready for the cue: a SIGUSR1 sent
earlier would end it.
"""
import mmap
import signal
import sys
import time

CHUNK = 1 << 20


def spin(until):
    n = 0
    while time.monotonic() < until:
        n += 1


def duty(until, percent):
    """Spins `percent` of each millisecond and sleeps the rest."""
    on, off = percent / 100_000, (100 - percent) / 100_000
    while time.monotonic() < until:
        spin(min(until, time.monotonic() + on))
        time.sleep(off)


def write(buf, until, byte):
    chunk = bytes([byte]) * CHUNK
    for at in range(0, len(buf), CHUNK):
        if time.monotonic() >= until:
            return
        buf[at:at + CHUNK] = chunk


def main():
    mode, mib, seconds, ready = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    cue = []
    signal.signal(signal.SIGUSR1, lambda *_: cue.append(1))
    size = mib * CHUNK
    warm = None
    if mode == "warm":
        warm = mmap.mmap(-1, size)
        write(warm, float("inf"), 1)
    open(ready, "w").close()
    rounds = 0
    while True:
        while not cue:
            signal.pause()
        cue.clear()
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            rounds += 1
            if mode == "spin":
                spin(until)
            elif mode.startswith("duty:"):
                duty(until, int(mode[5:]))
            elif mode == "fresh":
                fresh = mmap.mmap(-1, size)
                write(fresh, until, rounds % 256)
                fresh.close()
            elif mode == "warm":
                write(warm, until, rounds % 256)
            else:
                time.sleep(0.1)


if __name__ == "__main__":
    main()
