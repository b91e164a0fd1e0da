#!/usr/bin/env bash
# What large requests cost baton's memory, and whether the MLP keeps
# answering small requests meanwhile: baton (release) serves the MLP, and
# bench/request_flood.py sends one ~60 MiB JSON request, then 32 at once
# while small requests go on, reading the server's peak RSS (VmHWM) around
# each (see the script's header for what is measured and how).
#
#   bash bench/request-flood.sh
#
# MIB (default 60) and CLIENTS (default 32) size the flood; MAX_BATCH sets
# the MLP's max_batch_size (default 64, which refuses the large requests
# before their data is decoded; 100000 lets them decode and run); BATON_SERVE_ARGS
# adds server options (e.g. --request-memory-budget 256MiB); MODELS points
# at another output of bench/models.py (default .baton/bench/models).
# Reports go to .baton/bench/results/request-flood.{txt,json}.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
out="${MODELS:-$out}"
[ -d "$out/baton/mlp" ] || { echo "request-flood.sh: no MLP in $out; run bench/models.py --only mlp" >&2; exit 1; }

d=.baton/bench/flood
rm -rf "$d"
mkdir -p "$d"
cp -r "$out/baton/mlp" "$d/"
if [ -n "${MAX_BATCH:-}" ]; then
  sed -i "s/^max_batch_size = .*/max_batch_size = $MAX_BATCH/" "$d/mlp/model.toml"
fi
start_baton "$d"
{
  echo "# $(date -u +%FT%TZ)  $(nproc) cores  $(git rev-parse --short HEAD 2>/dev/null || echo "(no git)")  baton serve ${BATON_SERVE_ARGS:-}"
  python3 bench/request_flood.py --url http://127.0.0.1:8300 --pid "$pid" --mib "${MIB:-60}" \
    --clients "${CLIENTS:-32}" --json "$results/request-flood.json"
} | tee "$results/request-flood.txt"
stop_server
