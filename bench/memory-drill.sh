#!/usr/bin/env bash
# No memory left behind: SWAPS (default 100) swaps of the transformer-sized
# encoder (96 MiB of weights) under light load (`baton drill`, open loop at
# 20 requests/s, JSON), with the server's RSS sampled throughout. Against
# baton (repository load API, alternating versions 1 and 2: every swap loads
# a new copy and frees an old one), MLServer and KServe (their load API
# reloads the model).
#
#   bash bench/memory-drill.sh [baton|mlserver|kserve ...]     (default: all three)
#
# The drill reports RSS growth per swap; for baton, compare it with the
# server's own residual metric (GET /baton/v1/unloads), saved beside the
# report. Reports go to .baton/bench/results/memory-<server>.*.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
swaps="${SWAPS:-100}"

drill() { # $1 = server label, $2 = port, $3.. = extra drill options
  local label=$1 port=$2
  shift 2
  echo "=== $label  $(date -u +%FT%TZ)  load average $(cut -d' ' -f1-3 /proc/loadavg)"
  "$baton" drill encoder --url "http://127.0.0.1:$port" --protocol http-json --input input:FP32:1,32,512 \
    --rate 20 --connections 8 --warmup 5s --swaps "$swaps" --swap-interval 1s --window 500ms \
    --duration "$((swaps * 8 + 60))s" --timeout 30s --swap-timeout 60s --pid "$pid" --rss-interval 100ms \
    --json "$results/memory-$label.json" --svg "$results/memory-$label.svg" "$@" | tee "$results/memory-$label.txt" || true
}

run_server() {
  local server=$1 d=".baton/bench/memory/$1"
  rm -rf "$d"
  mkdir -p "$d"
  case "$server" in
    baton)
      cp -r "$out/baton/encoder" "$d/"
      start_baton "$d"
      drill baton 8300 --swap load-api --versions 1,2
      curl -sf http://127.0.0.1:8300/baton/v1/unloads >"$results/memory-baton-unloads.json" || true
      ;;
    mlserver)
      start_mlserver "$d" encoder
      drill mlserver 8100 --swap load-api
      ;;
    kserve)
      pid="$(bash bench/run-kserve.sh "$out/baton" 8200 --models encoder)"
      drill kserve 8200 --swap load-api
      ;;
    *) echo "memory-drill: unknown server $server" >&2; return 2 ;;
  esac
  stop_server
}

each_server run_server "$@"
