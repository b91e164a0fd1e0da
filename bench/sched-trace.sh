#!/usr/bin/env bash
# Who holds the CPU while a request waits: a short swap drill on baton
# (MLP, closed loop ×4, SWAPS swaps one a second, default 25) under
# `perf sched record`, then bench/sched_blame.py attributes every wait of a
# serving thread (tokio-rt-worker) or of the drill's own threads
# (drill-load) longer than 1 ms to the task that ran on that CPU just
# before — in swap windows and in steady time apart; bench/wake_order.py
# then tells, for each wait behind the loader, whether the serving thread
# was woken before the loader was picked, while it ran, or elsewhere.
#
#   bash bench/sched-trace.sh                       # loader under SCHED_IDLE (the default)
#   BATON_SERVE_ARGS=--loader-idle=false bash bench/sched-trace.sh   # nice 19 alone
#
# What it shows depends on autogroup (/proc/sys/kernel/sched_autogroup_enabled):
# docs/benchmarks-notebook.md §2, "Autogroup", has traces with it on and off.
#
# STACKS=1 records instead every switch of baton's loader threads with its
# call stack, and bench/switch_stacks.py tells how the build thread's long
# runs ended (a timer tick, a page fault's return, a read...):
#
#   STACKS=1 bash bench/sched-trace.sh
#
# Needs `perf` (Debian: linux-perf) and root or perf_event_paranoid <= 0.
# The trace (about 200 MB) and the drill report go to
# .baton/bench/results/sched-*; the server is stopped by its pid.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
swaps="${SWAPS:-25}"
command -v perf >/dev/null || { echo "sched-trace: needs perf (apt-get install linux-perf)" >&2; exit 1; }

d=.baton/bench/sched
rm -rf "$d"
mkdir -p "$d"
cp -r "$out/baton/mlp" "$d/"
start_baton "$d"

"$baton" drill mlp --url http://127.0.0.1:8300 --protocol http-json --input input:FP32:1,256 \
  --concurrency 4 --warmup 3s --swaps "$swaps" --swap-interval 1s --window 250ms --versions 1,2 \
  --duration "$((swaps + 15))s" --records --quiet \
  --json "$results/sched-drill.json" --svg "$results/sched-drill.svg" >"$results/sched-drill.txt" &
drill_pid=$!
sleep 1
# perf stamps events with CLOCK_MONOTONIC; the drill's records count from a
# wall-clock start. The difference between the two clocks maps one to the other.
python3 -c 'import time; print(time.time() - time.clock_gettime(time.CLOCK_MONOTONIC))' >"$results/sched-clock-offset"
if [ "${STACKS:-0}" = 1 ]; then
  perf record -a -g -e sched:sched_switch --filter 'prev_comm ~ "baton-*" || next_comm ~ "baton-*"' \
    -o "$results/sched-stacks.data" -- sleep "$((swaps + 5))" 2>&1 | tail -n1
  wait "$drill_pid" || true
  stop_server
  sed -n 1,6p "$results/sched-drill.txt"
  perf script -i "$results/sched-stacks.data" -F comm,tid,cpu,time,event,trace,ip,sym 2>/dev/null \
    | python3 bench/switch_stacks.py | tee "$results/sched-stacks.txt"
  exit 0
fi
perf sched record -k CLOCK_MONOTONIC -o "$results/sched.data" -- sleep "$((swaps + 5))" 2>&1 | tail -n1
wait "$drill_pid" || true
stop_server

sed -n 1,6p "$results/sched-drill.txt"
perf sched timehist -i "$results/sched.data" 2>/dev/null >"$results/sched-timehist.txt"
python3 bench/sched_blame.py "$results/sched-timehist.txt" "$results/sched-drill.json" "$results/sched-clock-offset" \
  | tee "$results/sched-blame.txt"
python3 bench/wake_order.py "$results/sched-timehist.txt" "$results/sched.data" | tee -a "$results/sched-blame.txt"
