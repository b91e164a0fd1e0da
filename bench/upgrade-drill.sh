#!/usr/bin/env bash
# Replacing baton's binary under load: `baton drill --swap upgrade` drives
# one model (KServe V2 REST with JSON tensors) while UPGRADES times
# (default 10) the server is replaced by a new process
# of the same binary (`POST /baton/v1/upgrade`), 3 s apart and with 2 s of
# steady load between one upgrade's window and the next.
#
#   bash bench/upgrade-drill.sh [mlp|big ...]     (default: both)
#
#   mlp   the bench MLP (9 MiB), closed loop with 4 workers
#   big   the 480 MiB model of the load-isolation drills: every new process
#         loads and warms it before it takes a connection. Open loop at
#         RATE requests a second (default 30, about half of what this
#         machine answers with 4 workers): a closed loop keeps both cores
#         busy with this model's inference, and the new process's loader,
#         which runs under SCHED_IDLE like every loader of baton's, then
#         gets no CPU at all (measured: no progress in 60 s).
#
# Each upgrade's action lasts from the request to the old process's exit,
# so its window holds the new process's start, load and warmup and the old
# one's drain. The drill samples the memory of the old and the new process
# together while both live, then the new one alone (every 20 ms), so the
# report's "peak during a swap" is the two processes' peak.
#
# The server is started here on a scratch repository, in a process group
# of its own, which every new process joins; the group is stopped at the
# end. Reports
# (JSON, SVG, terminal table) go to .baton/bench/results/upgrade-<model>.*.
# Needs bench/models.py and a release build of baton.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
upgrades="${UPGRADES:-10}"

run_model() {
  local model=$1 d=".baton/bench/upgrade/$1" input load
  rm -rf "$d"
  mkdir -p "$d"
  case "$model" in
    mlp)
      cp -r "$out/baton/mlp" "$d/"
      input=input:FP32:1,256
      load=(--concurrency 4)
      ;;
    big)
      mkdir -p "$d/big"
      cp "$out/baton/big/model.toml" "$d/big/"
      ln -s "$root/$out/baton/big/1" "$d/big/1"
      input=input:FP32:1,1024
      load=(--rate "${RATE:-30}" --connections 4)
      ;;
    *)
      echo "$(basename "$0"): unknown model $model (mlp or big)" >&2
      return 1
      ;;
  esac
  start_baton "$d"
  echo "=== $model  $(date -u +%FT%TZ)  load average $(cut -d' ' -f1-3 /proc/loadavg)"
  "$baton" drill "$model" --url http://127.0.0.1:8300 --protocol http-json --input "$input" \
    "${load[@]}" --warmup 3s --swaps "$upgrades" --swap upgrade --swap-interval 3s --swap-gap 2s \
    --window 1s --swap-timeout 120s --duration "$((upgrades * 30 + 30))s" --rss-interval 20ms \
    --json "$results/upgrade-$model.json" --svg "$results/upgrade-$model.svg" | tee "$results/upgrade-$model.txt" || true
  # The process serving now is the last upgrade's, in the process group
  # of the first (each new process is started by the one it replaces).
  stop_server
}

models=("$@")
[ ${#models[@]} -gt 0 ] || models=(mlp big)
for model in "${models[@]}"; do run_model "$model"; done
