#!/usr/bin/env bash
# perf_analyzer against the peers (batch 1, closed loop), each server started
# here and stopped by its pid:
#
#   bash bench/perf-peers.sh [CONFIG ...]     (default: mlserver kserve)
#
# CONFIG: mlserver        MLServer, parallel_workers 1 (its default)
#         mlserver-w0     MLServer, parallel_workers 0 (inference in the HTTP process)
#         mlserver-w2     MLServer, parallel_workers 2
#         mlserver-t2     MLServer, 2 intra-op threads per ONNX Runtime session
#         kserve          KServe, its default logging (2 log lines per request)
#         kserve-quiet    KServe, per-request logs off (--quiet)
#         kserve-t2       KServe, 2 intra-op threads per ONNX Runtime session
#         baton           target/release/baton serve on the same repository
#                         (the one model, binary and JSON tensors)
#         baton-t2        baton with one session of 2 intra-op threads
#                         ([engine] in model.toml; binary tensors)
# Peers run ONNX Runtime with one intra-op thread per session by default,
# like baton; the -t2 configs give each inference both cores, which is how
# a user would tune a single-worker server for a compute-heavy model.
#
# Environment:
#   MODEL        the model (default mlp; bench/models.py also makes encoder)
#   CONCURRENCY  perf_analyzer's concurrency (default 4)
#   COUNT        requests per measurement window (default 500)
#   RUNS         runs of perf_analyzer per config (default 3)
#   INPUT_DATA   perf_analyzer's --input-data (default random). Random bytes
#                read as FP32 include NaN and infinities, which JSON cannot
#                carry: with the encoder's 16,384 inputs perf_analyzer's
#                JSON requests then fail to parse, so run-all.sh sends zeros
#                to every server for it (the same arithmetic for a dense model)
#   TRIALS       perf_analyzer's --max-trials (default 30): windows it may
#                measure before three in a row agree within 10 %, its
#                condition for a result. With its default of 10, a run on
#                2 December 07:51 lost 6 of 54 runs to "Failed to obtain
#                stable measurement" while the machine stalled; more windows
#                change nothing in a run that settles, and it still stops
# Each line gives the 1-minute load average before it, since the machine is
# shared. Lines are labelled with the config alone for the MLP at
# concurrency 4, and MODEL-cCONCURRENCY/config otherwise.
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
model="${MODEL:-mlp}"
concurrency="${CONCURRENCY:-4}"
count="${COUNT:-500}"
input_data="${INPUT_DATA:-random}"
trials="${TRIALS:-30}"
prefix=""
[ "$model" = mlp ] && [ "$concurrency" = 4 ] || prefix="$model-c$concurrency/"
out=.baton/bench/models
results=.baton/bench/results
mkdir -p "$results"
pa=.baton/bin/perf_analyzer
[ -x "$pa" ] || { echo "perf-peers: no $pa; run bash scripts/setup-clients.sh" >&2; exit 1; }
[ -f "$out/baton/$model/1/MANIFEST" ] || { echo "perf-peers: run bench/models.py first" >&2; exit 1; }

pid=""
cleanup() { if [ -n "$pid" ]; then bash bench/stop.sh "$pid" >/dev/null || true; fi; }
trap cleanup EXIT

measure() { # $1 = label, $2 = port, $3.. = extra perf_analyzer args
  local label=$prefix$1 port=$2
  shift 2
  for i in $(seq "$runs"); do
    local load csv
    load="$(cut -d' ' -f1 /proc/loadavg)"
    csv="$(mktemp)"
    if timeout 300 "$pa" -m "$model" -u "127.0.0.1:$port" -i http -b 1 --concurrency-range "$concurrency" \
      --measurement-mode count_windows --measurement-request-count "$count" --max-trials "$trials" \
      --input-data "$input_data" "$@" -f "$csv" >"$csv.log" 2>&1; then
      python3 - "$csv" "$label" "$load" "$*" <<'PY'
import csv, sys
path, label, load, args = sys.argv[1:]
row = next(csv.DictReader(open(path)))
print(f"{label:24s} {float(row['Inferences/Second']):8.1f} infer/s  p50 {int(row['p50 latency'])/1000:6.2f} ms  "
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
    mlserver | mlserver-w0 | mlserver-w2 | mlserver-t2)
      local w=1 t=1
      [ "$cfg" = mlserver-w0 ] && w=0
      [ "$cfg" = mlserver-w2 ] && w=2
      [ "$cfg" = mlserver-t2 ] && t=2
      cp -r "$out/mlserver/$model" "$d/mlserver/"
      mkdir -p "$d/baton" && ln -s "$root/$out/baton/$model" "$d/baton/$model"
      pid="$(MLSERVER_WORKERS=$w BENCH_ORT_THREADS=$t bash bench/run-mlserver.sh "$d/mlserver" 8100)"
      measure "$cfg" 8100 --input-tensor-format json
      ;;
    kserve | kserve-quiet | kserve-t2)
      local extra=()
      [ "$cfg" = kserve-quiet ] && extra=(--quiet)
      [ "$cfg" = kserve-t2 ] && extra=(--threads 2)
      pid="$(bash bench/run-kserve.sh "$out/baton" 8200 --models "$model" "${extra[@]}")"
      measure "$cfg" 8200
      ;;
    baton | baton-t2)
      [ -x target/release/baton ] || { echo "perf-peers: no target/release/baton" >&2; return 1; }
      mkdir -p "$d/baton" && cp -r "$out/baton/$model" "$d/baton/"
      # The peers' -t2 shape: one session whose inference uses both cores.
      [ "$cfg" = baton-t2 ] && printf '\n[engine]\nsessions = 1\nintra_op_threads = 2\n' >>"$d/baton/$model/model.toml"
      setsid bash -c 'echo $$ >"$0"; exec "$@"' "$d/pid" target/release/baton serve --repo "$d/baton" \
        --http 127.0.0.1:8300 --grpc 127.0.0.1:8301 --no-poll >"$d/server.log" 2>&1 </dev/null &
      sleep 0.5
      pid="$(cat "$d/pid")"
      for _ in $(seq 300); do curl -sf -o /dev/null http://127.0.0.1:8300/v2/health/ready && break; sleep 0.2; done
      if [ "$cfg" = baton-t2 ]; then
        measure baton-t2-binary 8300
      else
        measure baton-binary 8300
        measure baton-json 8300 --input-tensor-format json --output-tensor-format json
      fi
      ;;
    *) echo "perf-peers: unknown config $cfg" >&2; return 2 ;;
  esac
  bash bench/stop.sh "$pid" >/dev/null
  pid=""
}

configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(mlserver kserve)
{
  echo "# $(date -u +%FT%TZ)  $(nproc) cores  perf_analyzer -m $model -i http -b 1 --concurrency-range $concurrency --measurement-mode count_windows --measurement-request-count $count --input-data $input_data"
  for c in "${configs[@]}"; do run_config "$c"; done
} 2>&1 | tee -a "$results/perf-peers.txt"
