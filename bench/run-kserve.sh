#!/usr/bin/env bash
# Starts the KServe Python model server (bench/kserve_onnx/server.py) in the
# background on 127.0.0.1, serving the newest version of models of a baton
# repository (default .baton/bench/models/baton, as written by
# bench/models.py); waits until /v2/health/ready answers 200 and prints the
# server's pid (its own process group: stop it with `bash bench/stop.sh PID`).
#
#   bash bench/run-kserve.sh REPO_DIR PORT [server.py options, e.g. --models mlp --grpc-port 8201 --load-in-thread]
#
# READY_TIMEOUT: seconds to wait for readiness (default 180). The log goes to
# .baton/bench/run/kserve-PORT/server.log.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ $# -lt 2 ]; then
  echo "usage: $0 REPO_DIR PORT [server.py options]" >&2
  exit 2
fi
repo="$(cd "$1" && pwd)"
port="$2"
shift 2
venv="$root/.baton/bench-venv-kserve"
[ -x "$venv/bin/python" ] || { echo "run-kserve: no $venv; run bash bench/setup-peers.sh" >&2; exit 1; }

run="$root/.baton/bench/run/kserve-$port"
rm -rf "$run"
mkdir -p "$run"
cd "$run"
# setsid may fork (when the caller has job control), so the server's pid is
# written by the process itself, which then execs the server.
setsid bash -c 'echo $$ >"$0"; exec "$@"' "$run/pid" \
  "$venv/bin/python" "$root/bench/kserve_onnx/server.py" --repo "$repo" --http-port "$port" "$@" \
  >"$run/server.log" 2>&1 </dev/null &
for _ in $(seq 50); do [ -s "$run/pid" ] && break; sleep 0.1; done
pid="$(cat "$run/pid")"

deadline=$((SECONDS + ${READY_TIMEOUT:-180}))
until curl -sf -o /dev/null "http://127.0.0.1:$port/v2/health/ready"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "run-kserve: the server exited; log $run/server.log:" >&2
    tail -n 30 "$run/server.log" >&2
    exit 1
  fi
  if ((SECONDS > deadline)); then
    echo "run-kserve: not ready after ${READY_TIMEOUT:-180}s; stopping pid $pid; log $run/server.log" >&2
    bash "$root/bench/stop.sh" "$pid" >&2 || true
    exit 1
  fi
  sleep 0.2
done
echo "$pid"
