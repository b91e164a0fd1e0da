#!/usr/bin/env bash
# perf_analyzer against the peers on the MLP (batch 1, concurrency 4, 500
# requests per window), each peer started here and stopped by its pid:
#
#   bash bench/perf-peers.sh [CONFIG ...]     (default: mlserver kserve)
#
# CONFIG: mlserver        MLServer, parallel_workers 1 (its default)
#         mlserver-w0     MLServer, parallel_workers 0 (inference in the HTTP process)
#         mlserver-w2     MLServer, parallel_workers 2
#         kserve          KServe, its default logging (2 log lines per request)
#         kserve-quiet    KServe, per-request logs off (--quiet)
#         baton           target/release/baton serve on the same repository
#                         (mlp only, binary and JSON tensors), for reference
# RUNS (default 3) runs of perf_analyzer per config; each line gives the
# 1-minute load average before it, since the machine is shared.
#
# Tensor formats: MLServer's REST has no binary tensor extension, so it gets
# --input-tensor-format json (outputs then come back as JSON, which
# perf_analyzer accepts). KServe gets perf_analyzer's default (binary in and
# out): with JSON tensors kserve answers outputs with "parameters": null, on
# which perf_analyzer's HTTP client fails ("attempt to access non-existing
# object member 'binary_data_size'").
#
# Results are appended to .baton/bench/results/perf-peers.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
runs="${RUNS:-3}"
out=.baton/bench/models
results=.baton/bench/results
mkdir -p "$results"
pa=.baton/bin/perf_analyzer
[ -x "$pa" ] || { echo "perf-peers: no $pa; run bash scripts/setup-clients.sh" >&2; exit 1; }
[ -f "$out/baton/mlp/1/MANIFEST" ] || { echo "perf-peers: run bench/models.py first" >&2; exit 1; }

pid=""
cleanup() { if [ -n "$pid" ]; then bash bench/stop.sh "$pid" >/dev/null || true; fi; }
trap cleanup EXIT

measure() { # $1 = label, $2 = port, $3.. = extra perf_analyzer args
  local label=$1 port=$2
  shift 2
  for i in $(seq "$runs"); do
    local load csv
    load="$(cut -d' ' -f1 /proc/loadavg)"
    csv="$(mktemp)"
    if timeout 300 "$pa" -m mlp -u "127.0.0.1:$port" -i http -b 1 --concurrency-range 4 \
      --measurement-mode count_windows --measurement-request-count 500 "$@" -f "$csv" >"$csv.log" 2>&1; then
      python3 - "$csv" "$label" "$load" "$*" <<'PY'
import csv, sys
path, label, load, args = sys.argv[1:]
row = next(csv.DictReader(open(path)))
print(f"{label:14s} {float(row['Inferences/Second']):8.1f} infer/s  p50 {int(row['p50 latency'])/1000:6.2f} ms  "
      f"p99 {int(row['p99 latency'])/1000:6.2f} ms   load {load}   {args}")
PY
    else
      echo "$label: perf_analyzer failed (load $load): $(grep -m1 -iE 'error|fail' "$csv.log" || tail -n1 "$csv.log")"
    fi
    rm -f "$csv" "$csv.log"
  done
}

run_config() {
  local cfg=$1 d=".baton/bench/perf/$1"
  rm -rf "$d"
  mkdir -p "$d/mlserver"
  case "$cfg" in
    mlserver | mlserver-w0 | mlserver-w2)
      local w=1
      [ "$cfg" = mlserver-w0 ] && w=0
      [ "$cfg" = mlserver-w2 ] && w=2
      cp -r "$out/mlserver/mlp" "$d/mlserver/"
      mkdir -p "$d/baton" && ln -s "$root/$out/baton/mlp" "$d/baton/mlp"
      pid="$(MLSERVER_WORKERS=$w bash bench/run-mlserver.sh "$d/mlserver" 8100)"
      measure "$cfg" 8100 --input-tensor-format json
      ;;
    kserve | kserve-quiet)
      local extra=()
      [ "$cfg" = kserve-quiet ] && extra=(--quiet)
      pid="$(bash bench/run-kserve.sh "$out/baton" 8200 --models mlp "${extra[@]}")"
      measure "$cfg" 8200
      ;;
    baton)
      [ -x target/release/baton ] || { echo "perf-peers: no target/release/baton" >&2; return 1; }
      mkdir -p "$d/baton" && cp -r "$out/baton/mlp" "$d/baton/"
      setsid bash -c 'echo $$ >"$0"; exec "$@"' "$d/pid" target/release/baton serve --repo "$d/baton" \
        --http 127.0.0.1:8300 --grpc 127.0.0.1:8301 --no-watch >"$d/server.log" 2>&1 </dev/null &
      sleep 0.5
      pid="$(cat "$d/pid")"
      for _ in $(seq 300); do curl -sf -o /dev/null http://127.0.0.1:8300/v2/health/ready && break; sleep 0.2; done
      measure baton-binary 8300
      measure baton-json 8300 --input-tensor-format json --output-tensor-format json
      ;;
    *) echo "perf-peers: unknown config $cfg" >&2; return 2 ;;
  esac
  bash bench/stop.sh "$pid" >/dev/null
  pid=""
}

configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(mlserver kserve)
{
  echo "# $(date -u +%FT%TZ)  $(nproc) cores  perf_analyzer -m mlp -i http -b 1 --concurrency-range 4 --measurement-mode count_windows --measurement-request-count 500"
  for c in "${configs[@]}"; do run_config "$c"; done
} 2>&1 | tee -a "$results/perf-peers.txt"
