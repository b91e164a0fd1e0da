#!/usr/bin/env bash
# Loading must not slow serving: `baton drill` measures the MLP (open loop,
# RATE requests/s, default 300 — below every server's capacity, so no queue builds up, JSON) while the 480 MiB `big` model is
# loaded beside it SWAPS times (default 6, alternating versions 2 and 1).
# Each load's window runs from its trigger to 1 s after the load call
# returned, and 4 s of steady load follow it (--swap-gap) however long the
# load took; the drill compares the MLP's latency there with its steady
# latency. Six loads rather than three because at 300 requests/s each p99
# rests on few requests: with three, about 40 above it on either side, and
# the ratio moved between 0.90 and 1.16 from run to run.
#
#   baton     POST /v2/repository/models/big/load {"parameters":{"version":N}}:
#             fetch, verify (SHA-256 of 480 MiB), load, validate every
#             weight, warm up — on its low-priority loader thread
#   mlserver  POST /v2/repository/models/big/load
#   kserve    POST /v2/repository/models/big/load
#   triton    Triton 2.51 (bench/setup-triton.sh), the MLP and `big` on its
#             python backend (each instance a stub process running ONNX
#             Runtime); a load is `bench/run-triton.sh --swap PORT V big`,
#             which makes version V the one served and calls the load API:
#             Triton starts a new stub for it, which loads the 480 MiB
#             version, and ends the old one
#
#   bash bench/load-isolation.sh [baton|mlserver|kserve|baton-noautogroup|baton-worker|triton ...]
#                                                   (default: the first three)
#
#   A name may end in .N (baton.2, baton-noautogroup.3): the same drill
#   again, its reports under that name; bench/summarize.py gives the
#   median of the repeats.
#
#   baton-noautogroup  baton again with the kernel's autogroup switched off
#             for the drill (needs root; restored right after, and on exit),
#             as for a server in a container of its own. With autogroup on,
#             the loader's CPU time is charged to the session it shares with
#             the serving threads (docs/benchmarks-notebook.md §3, "Autogroup").
#
#   baton-worker  baton again with `big` in a worker process (`[engine]
#             isolation = "process"`): each load starts a `baton worker`
#             that maps, loads, validates and warms the version in its own
#             address space; the MLP stays in the server (docs/workers.md).
#
# The drill's stall probe (--stall-probe 2ms, docs/drill.md) records when
# a real-time thread could not get a CPU for 2 ms: in steady time that is
# the machine itself stopping; in the load windows it is the machine or a
# kernel section of the load's (docs/benchmarks-notebook.md §3, "The machine's
# stalls, measured by the drill").
#
# Reports go to .baton/bench/results/isolation-<server>.*.
#
# Where in a load serving slows (baton only): STAGES=1 records every
# request (the drill's --records) and loads through baton's own load API,
# whose answer gives each stage's duration, kept one per line in
# isolation-<server>.loads.jsonl; `python3 bench/load_stages.py
# .baton/bench/results/isolation-<server>` then gives the MLP's latency in
# each stage (docs/benchmarks-notebook.md §3, "Long reads"). PIN=1 as well runs
# baton on the last CPU alone and the drill on the others: every serving
# thread then shares its CPU with the loader, so what shows is what the
# loader's CPU costs a request there, not where the kernel puts it; its
# reports are isolation-pinned-<server>.*, which bench/summarize.py leaves
# out, since that is not the benchmark's drill.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
swaps="${SWAPS:-6}"
rate="${RATE:-300}"

drill() { # $1 = server label, $2 = port
  local label=$1 port=$2 base pin=() extra=() report="$results/isolation-$1"
  base="$(server_of "$label")"
  local load="curl -sf -o /dev/null -X POST http://127.0.0.1:$port/v2/repository/models/big/load"
  local version="\$(( {swap} % 2 + 1 ))" # the shell the drill runs works it out per swap
  base="${base%-worker}"
  if [ "$base" = triton ]; then
    load="bash bench/run-triton.sh --swap $port $version big"
  elif [ "${base%-noautogroup}" = baton ] && [ -z "${STAGES:-}" ]; then
    load="$load -d '{\"parameters\":{\"version\":'$version'}}'"
  elif [ "${base%-noautogroup}" = baton ]; then
    if [ -n "${PIN:-}" ]; then
      local last=$(($(nproc) - 1))
      taskset -a -p -c "$last" "$pid" >/dev/null
      pin=(taskset -c "0-$((last - 1))")
      report="$results/isolation-pinned-$label"
    fi
    local loads="$root/$report.loads.jsonl"
    rm -f "$loads"
    load="curl -sf -X POST http://127.0.0.1:$port/baton/v1/models/big/load -d '{\"version\":'$version'}' >>$loads && echo >>$loads"
    extra=(--records)
  fi
  echo "=== $label  $(date -u +%FT%TZ)  load average $(cut -d' ' -f1-3 /proc/loadavg)"
  "${pin[@]}" "$baton" drill mlp --url "http://127.0.0.1:$port" --protocol http-json --input input:FP32:1,256 \
    --rate "$rate" --connections 32 --warmup 5s --swaps "$swaps" --swap-interval 8s --swap-gap 4s --window 1s \
    --duration "$((swaps * 40 + 30))s" --swap-timeout 120s --pid "$pid" --stall-probe 2ms "${extra[@]}" \
    --swap command --command "$load" \
    --json "$report.json" --svg "$report.svg" | tee "$report.txt" || true
}

run_server() {
  local label=$1 server d=".baton/bench/isolation/$1"
  server="$(server_of "$label")"
  rm -rf "$d"
  mkdir -p "$d"
  case "$server" in
    baton | baton-noautogroup | baton-worker)
      if [ "$server" = baton-noautogroup ]; then autogroup_off "$label" || return 0; fi
      isolation_repo "$d"
      if [ "$server" = baton-worker ]; then printf '\n[engine]\nisolation = "process"\n' >>"$d/big/model.toml"; fi
      start_baton "$d"
      curl -sf -o /dev/null -X POST http://127.0.0.1:8300/v2/repository/models/big/unload
      drill "$label" 8300
      ;;
    mlserver)
      start_mlserver "$d" mlp
      cp -r "$out/mlserver/big" "$d/mlserver/"
      ln -s "$root/$out/baton/big" "$d/baton/big"
      drill "$label" 8100
      ;;
    kserve)
      pid="$(bash bench/run-kserve.sh "$out/baton" 8200 --models mlp)"
      drill "$label" 8200
      ;;
    triton)
      # Both versions of `big` in its repository, version 1 served at
      # start (as the other servers load it before the drill).
      pid="$(TRITON_ALSO="big=$out/baton/big" bash bench/run-triton.sh "$out/baton/mlp" 8700)"
      bash bench/run-triton.sh --swap 8700 1 big >/dev/null
      drill "$label" 8700
      ;;
    *) echo "load-isolation: unknown server $server" >&2; return 2 ;;
  esac
  stop_server
  restore_autogroup
}

each_server run_server "$@"
