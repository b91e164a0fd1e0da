#!/usr/bin/env bash
# "Swap under fire" drills against the peers, each in a scratch copy of the
# benchmark repository (.baton/bench/drill/<peer>), under light load on mlp
# (bench/reload_drill.py: 2 clients x 100 req/s, JSON, batch 1):
#
#   reload    POST /v2/repository/models/mlp/load, nothing changed on disk (3 rounds)
#   new       a new version folder of mlp appears (4, 5, 6), then the same POST (3 rounds)
#   big       POST /v2/repository/models/big/load (the 480 MiB model, not loaded
#             before), then once more (a reload), while mlp is measured (2 rounds)
#
#   bash bench/drill-peers.sh [mlserver|mlserver-thread|kserve|kserve-thread ...]
#   (default: all four)
#
# The -thread variants build the ONNX Runtime session off the event loop
# (MLServer runtime: BENCH_LOAD_IN_THREAD=1; KServe server: --load-in-thread);
# the plain ones load on it, as the peers' own runtimes do. Needs bench/setup-peers.sh and bench/models.py first. Ports
# 8100 (MLServer, +1 gRPC, +2 metrics) and 8200 (KServe). Each server is
# stopped by its pid at the end, also on failure. Output is also appended to
# .baton/bench/results/drill-<peer>.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out=.baton/bench/models
results=.baton/bench/results
mkdir -p "$results"
baton=target/release/baton
[ -x "$baton" ] || baton=target/debug/baton
[ -x "$baton" ] || { echo "drill-peers: no baton binary (needed for baton package)" >&2; exit 1; }
[ -f "$out/baton/mlp/model.toml" ] && [ -f "$out/next/mlp/6/model.onnx" ] && [ -f "$out/baton/big/1/MANIFEST" ] ||
  { echo "drill-peers: run bench/models.py first" >&2; exit 1; }

pid=""
cleanup() { if [ -n "$pid" ]; then bash bench/stop.sh "$pid" >/dev/null || true; fi; }
trap cleanup EXIT

scratch() { # $1 = peer; a fresh copy with mlp 1-3 and big/1 (linked, not loaded at start)
  local d=".baton/bench/drill/$1"
  rm -rf "$d"
  mkdir -p "$d/baton/big" "$d/mlserver"
  cp -r "$out/baton/mlp" "$d/baton/mlp"
  cp "$out/baton/big/model.toml" "$d/baton/big/"
  ln -s "$root/$out/baton/big/1" "$d/baton/big/1"
  cp -r "$out/mlserver/mlp" "$d/mlserver/mlp"
  echo "$d"
}

drill() { # $1 = port, $2.. = reload_drill.py arguments
  local port=$1
  shift
  python3 bench/reload_drill.py --port "$port" --clients 2 --rate 100 "$@"
}

run_peer() {
  local peer=$1 d port
  d="$(scratch "$peer")"
  echo "=== $peer  ($(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg))"
  case "$peer" in
    mlserver | mlserver-thread)
      port=8100
      if [ "$peer" = mlserver-thread ]; then
        pid="$(BENCH_LOAD_IN_THREAD=1 bash bench/run-mlserver.sh "$d/mlserver" "$port")"
      else
        pid="$(bash bench/run-mlserver.sh "$d/mlserver" "$port")"
      fi
      new_version="cp -r $out/next/mlp/\$((3+{round})) $d/baton/mlp/ && cp -r $out/mlserver-next/mlp/\$((3+{round})) $d/mlserver/mlp/"
      big_ready="[ -d $d/mlserver/big ] || { mkdir -p $d/mlserver/big && cp -r $out/mlserver/big/1 $d/mlserver/big/1; }"
      ;;
    kserve | kserve-thread)
      port=8200
      local extra=()
      [ "$peer" = kserve-thread ] && extra=(--load-in-thread)
      pid="$(bash bench/run-kserve.sh "$d/baton" "$port" --models mlp --quiet "${extra[@]}")"
      new_version="cp -r $out/next/mlp/\$((3+{round})) $d/baton/mlp/ && $baton package $d/baton/mlp/\$((3+{round}))"
      big_ready="true"
      ;;
    *) echo "drill-peers: unknown peer $peer" >&2; return 2 ;;
  esac
  echo "--- reload: POST /v2/repository/models/mlp/load, nothing changed"
  drill "$port" --post /v2/repository/models/mlp/load --repeat 3 --interval 3
  echo "--- new: a new version folder of mlp, then POST /v2/repository/models/mlp/load"
  drill "$port" --post /v2/repository/models/mlp/load --repeat 3 --interval 3 --prepare "$new_version"
  echo "--- big: POST /v2/repository/models/big/load (480 MiB) while mlp is measured"
  drill "$port" --post /v2/repository/models/big/load --repeat 2 --interval 8 --prepare "$big_ready" --tail 3
  bash bench/stop.sh "$pid" >/dev/null
  pid=""
}

peers=("$@")
[ ${#peers[@]} -gt 0 ] || peers=(mlserver mlserver-thread kserve kserve-thread)
for p in "${peers[@]}"; do
  run_peer "$p" 2>&1 | tee -a "$results/drill-$p.txt"
done
