#!/usr/bin/env bash
# Swap under fire, side by side: `baton drill` drives the MLP (closed loop,
# 4 workers, KServe V2 REST with JSON tensors — the one format all three
# servers speak) while the model is swapped SWAPS times (default 100), one
# swap a second or, when a swap takes longer, GAP (default 1 s) after its
# window, against each server in turn:
#
#   baton     its repository load API, alternating versions 1 and 2 — a full
#             load transaction (verify, load, validate, warm, commit, drain)
#             to different weights every time
#   mlserver  its repository load API (MLServer reloads the model)
#   kserve    its repository load API (bench/kserve_onnx builds the new model
#             and swaps it in)
#
#   bash bench/swap-drill.sh [baton|mlserver|kserve|baton-noautogroup ...]
#                                                   (default: the first three)
#
#   A name may end in .N (baton-noautogroup.2): the same drill again, its
#   reports under that name; bench/summarize.py gives the median of the
#   repeats.
#
#   baton-noautogroup  baton again with the kernel's autogroup switched off
#             for the drill (/proc/sys/kernel/sched_autogroup_enabled, needs
#             root; restored right after, and on exit). Autogroup shares the
#             CPU between sessions before priorities count, and it applies
#             only to processes in the root CPU cgroup: a server in a
#             container of its own is not under it. Without it a swap costs
#             serving more and takes less time (docs/benchmarks-notebook.md §2,
#             "Autogroup"), so this is the drill closer to production.
#
# The drill stops once the last swap's window and its tail are over; the
# duration (10 s a swap) is only a bound, there so that a server whose swaps
# hang cannot keep it running. Under this load baton's loader runs on idle
# moments only (SCHED_IDLE, and it steps off the CPU while other threads
# wait for one), so its swaps are slow: up to 13 s with autogroup on, on
# the 1 December machine (an MLP load takes 40 ms when the server is idle).
#
# The drill's stall probe (--stall-probe 2ms, docs/drill.md) records when
# the machine stopped, and the report gives the slowest requests of steady
# time and of the swap windows with how long the probe was stalled during
# each: on these machines the worst requests (20-45 ms) are often the
# machine's. It costs the drill a wake a millisecond on a busy CPU.
#
# Each server is started here on a scratch copy of the benchmark repository
# and stopped by its pid. Reports (JSON, SVG, terminal table) go to
# .baton/bench/results/swap-<server>.*. Needs bench/setup-peers.sh,
# bench/models.py and a release build of baton.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
swaps="${SWAPS:-100}"
# Steady load between one swap's window and the next trigger. A swap of
# baton's under this load takes longer than the 1 s interval, so without a
# gap the drill's steady time would be only its first and last seconds.
gap="${GAP:-1s}"

drill() { # $1 = server label, $2 = port, $3.. = extra drill options
  local label=$1 port=$2
  shift 2
  echo "=== $label  $(date -u +%FT%TZ)  load average $(cut -d' ' -f1-3 /proc/loadavg)"
  "$baton" drill mlp --url "http://127.0.0.1:$port" --protocol http-json --input input:FP32:1,256 \
    --concurrency 4 --warmup 3s --swaps "$swaps" --swap-interval 1s --swap-gap "$gap" --window 250ms \
    --duration "$((swaps * 10 + 15))s" --pid "$pid" --stall-probe 2ms \
    --json "$results/swap-$label.json" --svg "$results/swap-$label.svg" "$@" | tee "$results/swap-$label.txt" || true
}

run_server() {
  local label=$1 server d=".baton/bench/swap/$1"
  server="$(server_of "$label")"
  rm -rf "$d"
  mkdir -p "$d"
  case "$server" in
    baton | baton-noautogroup)
      if [ "$server" = baton-noautogroup ]; then autogroup_off "$label" || return 0; fi
      cp -r "$out/baton/mlp" "$d/"
      start_baton "$d"
      drill "$label" 8300 --swap load-api --versions 1,2
      ;;
    mlserver)
      start_mlserver "$d" mlp
      drill "$label" 8100 --swap load-api
      ;;
    kserve)
      pid="$(bash bench/run-kserve.sh "$out/baton" 8200 --models mlp)"
      drill "$label" 8200 --swap load-api
      ;;
    *) echo "swap-drill: unknown server $server" >&2; return 2 ;;
  esac
  stop_server
  restore_autogroup
}

each_server run_server "$@"
