"""How baton's build thread gave up the core after a long run.

Reads `perf script -F comm,tid,cpu,time,event,trace,ip,sym` output of
`sched:sched_switch` events recorded with call stacks (bench/sched-trace.sh
with STACKS=1). For every run of a baton loader thread (`baton-build`,
`baton-loader`, `baton-release`) that ended while the thread was still
runnable — it was switched out, not asleep — after 1.5 ms or more, the
stack at the switch tells what ended it: a timer tick, the return from a
page fault or a system call, a scheduling point inside a file read or an
unmap, or a reschedule interrupt (the prompt hand-over a waking thread
should get). A long run ended by anything but that interrupt is time a
thread woken on that core may have waited.

    perf script ... | python3 bench/switch_stacks.py
"""
import collections
import re
import sys

LOADERS = ("baton-build", "baton-loader", "baton-release")
LONG_MS = 1.5
HEADER = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch:\s+(.*)")
SWITCH = re.compile(r"prev_comm=(\S+) prev_pid=(\d+) .*prev_state=(\S+) ==> next_comm=(\S+) next_pid=(\d+)")
# The first matching frame names the cause; order matters.
CAUSES = (
    ("reschedule interrupt", "sysvec_reschedule_ipi"),
    ("timer tick", "sysvec_apic_timer_interrupt"),
    ("page fault return", "exc_page_fault"),
    ("inside a file read", "filemap_read"),
    ("inside an unmap", "munmap"),
    ("system call return", "exit_to_user_mode_loop"),
)


def switches(lines):
    """(time s, switch fields, stack frames) per recorded switch."""
    head, stack = None, []
    for line in lines:
        if not line.strip():
            if head:
                yield head[0], head[1], stack
            head, stack = None, []
        elif not line[0].isspace():
            m = HEADER.search(line)
            fields = m and SWITCH.search(m.group(3))
            head = (float(m.group(2)), fields.groups()) if fields else None
            stack = []
        elif head:
            parts = line.split()
            stack.append(parts[1] if len(parts) > 1 else parts[0])
    if head:
        yield head[0], head[1], stack


def cause(stack):
    frames = " ".join(stack[:10])
    return next((name for name, frame in CAUSES if frame in frames), "other: " + " ".join(stack[1:5]))


def main():
    started = {}
    ends = collections.defaultdict(list)
    for t, (prev, prev_pid, state, nxt, next_pid), stack in switches(sys.stdin):
        if nxt.startswith(LOADERS):
            started[next_pid] = t
        if prev.startswith(LOADERS) and prev_pid in started:
            ran_ms = (t - started.pop(prev_pid)) * 1000
            if state.startswith("R") and ran_ms >= LONG_MS:
                ends[(prev, cause(stack))].append(ran_ms)
    total = sum(len(v) for v in ends.values())
    print(f"runs of {LONG_MS} ms or more that ended with the loader thread still runnable: {total}")
    for (thread, why), runs in sorted(ends.items(), key=lambda kv: -len(kv[1])):
        print(f"  {thread:14s} {why:24s} {len(runs):4d}   longest {max(runs):.2f} ms")


if __name__ == "__main__":
    main()
