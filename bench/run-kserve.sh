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
source "$root/bench/launch.sh"

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
launch run-kserve "$run" "$port" "$venv/bin/python" "$root/bench/kserve_onnx/server.py" --repo "$repo" --http-port "$port" "$@"
