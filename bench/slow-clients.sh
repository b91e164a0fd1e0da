#!/usr/bin/env bash
# What slow clients cost baton: bench/slow_clients.py opens CLIENTS
# (default 2000) connections that each send a request line, then one header
# byte every INTERVAL (default 5) seconds, for DURATION (default 30) seconds, while it
# samples the server's descriptors and RSS and times a normal client's
# requests on new connections (see the script's header).
#
#   bash bench/slow-clients.sh
#
# BATON picks the binary (default target/release/baton; a debug build or an
# older binary to compare with works too); FILES sets the server's soft
# limit on open files and HARD_FILES its hard one (default: this shell's
# hard limit for both; baton raises the soft limit to the hard one);
# BATON_SERVE_ARGS adds server options (e.g.
# --header-read-timeout 0 --idle-timeout 0). baton serves its demo
# repository. Reports go to .baton/bench/results/slow-clients.{txt,json}.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
baton="${BATON:-target/release/baton}"
[ -x "$baton" ] || { echo "slow-clients.sh: no $baton; build it (cargo build --release -p baton-server) or set BATON" >&2; exit 1; }
results=.baton/bench/results
d=.baton/bench/slow-clients
rm -rf "$d"
mkdir -p "$d" "$results"

hard="${HARD_FILES:-$(ulimit -Hn)}"
files="${FILES:-$hard}"
pid=""
cleanup() { if [ -n "$pid" ]; then bash bench/stop.sh "$pid" >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT
# shellcheck disable=SC2086 # BATON_SERVE_ARGS is a list of options
setsid bash -c 'ulimit -Sn "$2" && ulimit -Hn "$1" && echo $$ >"$3"; shift 3; exec "$@"' _ "$hard" "$files" "$d/pid" "$baton" serve \
  --http 127.0.0.1:8310 --grpc 127.0.0.1:8311 ${BATON_SERVE_ARGS:-} >"$d/server.log" 2>&1 </dev/null &
for _ in $(seq 600); do [ -s "$d/pid" ] && curl -sf -o /dev/null http://127.0.0.1:8310/v2/health/ready && break; sleep 0.2; done
pid="$(cat "$d/pid")"
{
  echo "# $(date -u +%FT%TZ)  $(nproc) cores  $baton  files $files (hard $hard)  baton serve ${BATON_SERVE_ARGS:-}"
  python3 bench/slow_clients.py --url http://127.0.0.1:8310 --pid "$pid" --clients "${CLIENTS:-2000}" \
    --interval "${INTERVAL:-5}" --seconds "${DURATION:-30}" --json "$results/slow-clients.json"
} | tee "$results/slow-clients.txt"
