#!/usr/bin/env bash
# Starts MLServer in the background on 127.0.0.1, serving every model under
# MODEL_DIR (MLServer layout: <name>/<version>/model-settings.json, as
# written by bench/models.py under .baton/bench/models/mlserver) with the
# ONNX runtime in bench/mlserver_onnx; waits until /v2/health/ready answers
# 200 and prints the server's pid (its own process group: stop it, workers
# included, with `bash bench/stop.sh PID`).
#
#   bash bench/run-mlserver.sh MODEL_DIR PORT
#
# HTTP on PORT, gRPC on PORT+1, metrics on PORT+2, all bound to 127.0.0.1.
# Environment:
#   MLSERVER_WORKERS   parallel_workers (default 1, MLServer's default: one
#                      inference worker process beside the HTTP process;
#                      0 runs inference in the HTTP process)
#   READY_TIMEOUT      seconds to wait for readiness (default 180)
# Writes MODEL_DIR/settings.json; logs and MLServer's .metrics/.envs go to
# .baton/bench/run/mlserver-PORT/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/bench/launch.sh"

if [ $# -ne 2 ]; then
  echo "usage: $0 MODEL_DIR PORT" >&2
  exit 2
fi
model_dir="$(cd "$1" && pwd)"
port="$2"
workers="${MLSERVER_WORKERS:-1}"
venv="$root/.baton/bench-venv-mlserver"
[ -x "$venv/bin/mlserver" ] || { echo "run-mlserver: no $venv; run bash bench/setup-peers.sh" >&2; exit 1; }

run="$root/.baton/bench/run/mlserver-$port"
rm -rf "$run"
mkdir -p "$run"

cat > "$model_dir/settings.json" <<JSON
{
  "host": "127.0.0.1",
  "http_port": $port,
  "grpc_port": $((port + 1)),
  "metrics_port": $((port + 2)),
  "parallel_workers": $workers,
  "debug": false,
  "metrics_dir": "$run/.metrics",
  "environments_dir": "$run/.envs"
}
JSON

cd "$run"
export PYTHONPATH="$root/bench/mlserver_onnx:$root/bench${PYTHONPATH:+:$PYTHONPATH}"
launch run-mlserver "$run" "$port" "$venv/bin/mlserver" start "$model_dir"
