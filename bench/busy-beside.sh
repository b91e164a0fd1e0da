#!/usr/bin/env bash
# What a busy CPU beside serving costs: baton serves the MLP alone (open
# loop, 300 requests/s, JSON, as in bench/load-isolation.sh) while a
# separate SCHED_IDLE process (bench/busy_beside.py) keeps a CPU busy for
# 3 s per drill "swap" — arithmetic only, part of each millisecond, or
# writing fresh or warm memory — and does nothing in between. The drill
# compares the MLP's latency in those windows with its steady latency, as
# for a load. Runs each MODE in turn, ROUNDS times (default 2), with
# autogroup off (needs root; restored after).
#
#   bash bench/busy-beside.sh [MODE ...]    (default: none spin duty:50 duty:25 fresh warm)
#
# Reports go to .baton/bench/results/busy-<mode>.<round>.*; docs/benchmarks-notebook.md
# §3, "What a busy CPU beside serving costs".
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds="${ROUNDS:-2}"
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(none spin duty:50 duty:25 fresh warm)
busy=""
stop_busy() {
  if [ -n "$busy" ]; then kill "$busy" 2>/dev/null || true; wait "$busy" 2>/dev/null || true; fi
  busy=""
}
trap 'stop_busy; cleanup' EXIT

one() { # $1 = mode, $2 = round
  local mode=$1 label="busy-${1/:/}.$2" d=".baton/bench/busy"
  rm -rf "$d"
  mkdir -p "$d"
  cp -r "$out/baton/mlp" "$d/"
  autogroup_off "$label" || return 0
  start_baton "$d"
  chrt --idle 0 python3 bench/busy_beside.py "$mode" 1300 3 "$d/busy-ready" &
  busy=$!
  for _ in $(seq 300); do [ -e "$d/busy-ready" ] && break; sleep 0.1; done
  [ -e "$d/busy-ready" ] || { echo "busy-beside: $mode never became ready" >&2; stop_busy; stop_server; restore_autogroup; return 1; }
  echo "=== $label  $(date -u +%FT%TZ)  load average $(cut -d' ' -f1-3 /proc/loadavg)"
  "$baton" drill mlp --url http://127.0.0.1:8300 --protocol http-json --input input:FP32:1,256 \
    --rate 300 --connections 32 --warmup 5s --swaps 6 --swap-interval 8s --window 1s \
    --duration 120s --swap-timeout 60s --pid "$pid" --stall-probe 2ms \
    --swap command --command "kill -USR1 $busy; sleep 3" \
    --json "$results/$label.json" --svg "$results/$label.svg" | tee "$results/$label.txt" | grep -E '^  (steady|swap windows) |machine stalls' || true
  stop_busy
  stop_server
  restore_autogroup
}

for round in $(seq "$rounds"); do
  for mode in "${modes[@]}"; do one "$mode" "$round"; done
done
