#!/usr/bin/env bash
# A version in the server's process against one in a worker process, the
# same model under the same load, in one run: the trade-off table of
# docs/BENCHMARKS.md. Each part runs once per route: `inproc`, `worker`
# (`[engine] isolation = "process"` added to the model's config),
# `worker-asleep` (a worker whose hop sleeps at once rather than looking
# for the other side's message first, `worker_spin_us = 0`: steady only,
# unless ROUTES names it), and
# `triton`, Triton 2.51 with the MLP on its python backend, whose model
# instance runs in a stub process over shared memory: the same design as a
# worker (bench/setup-triton.sh installs it; NO_TRITON=1 leaves it out).
# Triton's swaps are made by `bench/run-triton.sh --swap`, which changes the
# served version and calls Triton's load API.
#
#   steady   the MLP at batch 1 over gRPC, no swap, DURATION (default 20 s)
#            each: closed loop at concurrency 4 (throughput: what the hop
#            takes from it), then open loop at LIGHT (default 500)
#            requests/s (p50 and p99 with no queue: what the hop adds to a
#            request).
#   swaps    SWAPS (default 100) swaps of the MLP through the load API,
#            alternating versions 1 and 2 (as bench/swap-drill.sh: KServe V2
#            REST with JSON tensors, closed loop at concurrency 4, 1 s
#            between swaps and 1 s of steady load after each window): swap
#            time, p99 and the worst request in swap windows against steady,
#            the peak RSS during a swap and the RSS after them all, of the
#            server and its workers together.
#   blast    (worker and triton) the MLP driven open loop at RATE (default
#            300) requests/s, while a second MLP model, `other`, has its
#            process killed with SIGKILL KILLS times (default 5, every 4 s):
#            the failed requests of the MLP. baton: the MLP in the server's
#            process, `other` in a worker, which the server loads again in a
#            new worker each time. Triton: both on the python backend, and
#            `other`'s stub process is the one killed.
#
#   bash bench/tradeoff.sh [steady] [swaps] [blast]        (default: all)
#   python3 bench/tradeoff_report.py                 (the table, from the reports)
#
# The other model's p99 while a 480 MiB version loads is bench/load-isolation.sh's
# `baton` against `baton-worker`.
#
# Reports go to .baton/bench/results/tradeoff-<part>-<route>.*. Needs
# bench/models.py (the MLP) and a release build of baton.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
swaps="${SWAPS:-100}"
duration="${DURATION:-20s}"
light="${LIGHT:-500}"
rate="${RATE:-300}"
kills="${KILLS:-5}"
in_worker='[engine]
isolation = "process"'

# repo DIR ROUTE: the MLP alone in DIR, in a worker when ROUTE is worker;
# worker-asleep is a worker whose hop sleeps at once, without looking for
# the other side's message first (worker_spin_us = 0).
repo() {
  rm -rf "$1"
  mkdir -p "$1"
  cp -r "$out/baton/mlp" "$1/"
  case "$2" in
    worker) printf '\n%s\n' "$in_worker" >>"$1/mlp/model.toml" ;;
    worker-asleep) printf '\n%s\nworker_spin_us = 0\n' "$in_worker" >>"$1/mlp/model.toml" ;;
  esac
}

# serve ROUTE DIR: starts the server the route stands for and sets pid,
# http and grpc (its ports): baton on the MLP alone in DIR, in a worker when
# ROUTE is worker; Triton on the MLP's versions when ROUTE is triton.
serve() {
  if [ "$1" = triton ]; then
    pid="$(bash bench/run-triton.sh "$out/baton/mlp" 8700)"
    http=8700 grpc=8701
    return
  fi
  repo "$2" "$1"
  start_baton "$2"
  http=8300 grpc=8301
}

# cpu_ticks PID: the CPU time PID and its children (a server's workers,
# Triton's stubs) have used, in clock ticks.
cpu_ticks() {
  local total=0 p
  for p in "$1" $(pgrep -P "$1" || true); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

steady() { # $1 = route
  local d=".baton/bench/tradeoff/steady-$1" report="$results/tradeoff-steady-$1" http grpc before
  serve "$1" "$d"
  echo "=== steady $1  $(date -u +%FT%TZ)  load average $(cut -d' ' -f1-3 /proc/loadavg)"
  before="$(cpu_ticks "$pid")"
  "$baton" drill mlp --url "http://127.0.0.1:$http" --grpc-url "http://127.0.0.1:$grpc" --protocol grpc \
    --input input:FP32:1,256 --concurrency 4 --warmup 3s --swaps 0 --duration "$duration" --pid "$pid" \
    --json "$report.json" --svg "$report.svg" | tee "$report.txt" || true
  # The server's CPU over the drill, its warm-up included: per request, what
  # the route costs beside its latency (bench/tradeoff_report.py).
  echo "$(($(cpu_ticks "$pid") - before)) $(getconf CLK_TCK)" >"$report.cpu"
  echo "=== light $1  $(date -u +%FT%TZ)  load average $(cut -d' ' -f1-3 /proc/loadavg)"
  before="$(cpu_ticks "$pid")"
  "$baton" drill mlp --url "http://127.0.0.1:$http" --grpc-url "http://127.0.0.1:$grpc" --protocol grpc \
    --input input:FP32:1,256 --rate "$light" --connections 8 --warmup 3s --swaps 0 --duration "$duration" \
    --json "$report-light.json" --svg "$report-light.svg" | tee "$report-light.txt" || true
  echo "$(($(cpu_ticks "$pid") - before)) $(getconf CLK_TCK)" >"$report-light.cpu"
  stop_server
}

swaps() { # $1 = route
  local d=".baton/bench/tradeoff/swaps-$1" report="$results/tradeoff-swaps-$1" http grpc swap
  serve "$1" "$d"
  swap=(--swap load-api)
  [ "$1" != triton ] || swap=(--swap command --command "bash bench/run-triton.sh --swap $http {version}")
  echo "=== swaps $1  $(date -u +%FT%TZ)  load average $(cut -d' ' -f1-3 /proc/loadavg)"
  "$baton" drill mlp --url "http://127.0.0.1:$http" --protocol http-json --input input:FP32:1,256 \
    --concurrency 4 --warmup 3s --swaps "$swaps" --swap-interval 1s --swap-gap 1s --window 250ms \
    --duration "$((swaps * 10 + 15))s" --pid "$pid" "${swap[@]}" --versions 1,2 \
    --json "$report.json" --svg "$report.svg" | tee "$report.txt" || true
  [ "$1" = triton ] || curl -sf http://127.0.0.1:8300/baton/v1/unloads >"$report.unloads.json" || true
  stop_server
}

blast() { # $1 = route: worker or triton
  local d=".baton/bench/tradeoff/blast-$1" report="$results/tradeoff-blast-$1" http kill
  if [ "$1" = triton ]; then
    pid="$(TRITON_ALSO="other=$out/baton/mlp" bash bench/run-triton.sh "$out/baton/mlp" 8700)"
    http=8700
    # The stub process of `other`'s instance, whichever version it serves
    # (the bracket keeps the pattern from matching this command's own text).
    # Triton starts a killed stub again only when its model is next asked,
    # so each kill first asks `other` once, which waits for that restart.
    mkdir -p "$d"
    python3 -c 'import json; print(json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 256], "data": [0.0] * 256}]}))' >"$d/other.json"
    kill="curl -s -o /dev/null -d @$d/other.json http://127.0.0.1:8700/v2/models/other/infer; \
kill -9 \$(pgrep -f '[t]riton_python_backend_stub .*/models/other/' | head -1)"
  else
    repo "$d" inproc
    cp -r "$out/baton/mlp" "$d/other"
    printf '\n[policy]\nkeep_previous = 0\n%s\n' "$in_worker" >>"$d/other/model.toml"
    start_baton "$d"
    http=8300
    # The worker of `other`: the server's child that is not gone.
    kill="kill -9 \$(pgrep -P $pid -f 'baton worker' | head -1)"
  fi
  echo "=== blast $1  $(date -u +%FT%TZ)  load average $(cut -d' ' -f1-3 /proc/loadavg)"
  "$baton" drill mlp --url "http://127.0.0.1:$http" --protocol http-json --input input:FP32:1,256 \
    --rate "$rate" --connections 32 --warmup 3s --swaps "$kills" --swap-interval 4s --window 1s \
    --duration "$((kills * 8 + 20))s" --pid "$pid" --swap command --command "$kill" \
    --json "$report.json" --svg "$report.svg" | tee "$report.txt" || true
  if [ "$1" = worker ]; then
    curl -sf http://127.0.0.1:8300/metrics | grep '^baton_worker_exits_total' >"$report.exits.txt" || true
    curl -sf http://127.0.0.1:8300/baton/v1/status >"$report.status.json" || true
  fi
  stop_server
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(steady swaps blast)
routes=(inproc worker worker-asleep)
[ -n "${NO_TRITON:-}" ] || routes+=(triton)
# ROUTES="triton" (say) runs the parts for those routes alone.
[ -z "${ROUTES:-}" ] || read -r -a routes <<<"$ROUTES"
for part in "${parts[@]}"; do
  case "$part" in
    steady) for route in "${routes[@]}"; do steady "$route"; done ;;
    swaps) # worker-asleep swaps only when ROUTES names it.
      for route in "${routes[@]}"; do
        if [ "$route" != worker-asleep ] || [ -n "${ROUTES:-}" ]; then swaps "$route"; fi
      done ;;
    blast)
      for route in "${routes[@]}"; do
        if [ "$route" != inproc ] && [ "$route" != worker-asleep ]; then blast "$route"; fi
      done ;;
    *) echo "tradeoff: unknown part $part" >&2; exit 2 ;;
  esac
done
