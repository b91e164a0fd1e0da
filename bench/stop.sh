#!/usr/bin/env bash
# Stops a peer started by bench/run-*.sh: SIGTERM to its process group (the
# run scripts start each server with setsid, so its pid is the group id and
# the group holds its worker processes), then SIGKILL after TIMEOUT seconds
# (default 15) if any is left.
#
#   bash bench/stop.sh PID
set -uo pipefail
pid="${1:?usage: $0 PID}"
timeout="${TIMEOUT:-15}"
[[ "$pid" =~ ^[0-9]+$ ]] && ((pid > 1)) || { echo "stop: bad pid '$pid'" >&2; exit 2; }

if ! kill -0 -- "-$pid" 2>/dev/null; then
  echo "stop: no process group $pid" >&2
  exit 0
fi
kill -TERM -- "-$pid" 2>/dev/null
for _ in $(seq $((timeout * 10))); do
  kill -0 -- "-$pid" 2>/dev/null || { echo "stopped $pid"; exit 0; }
  sleep 0.1
done
echo "stop: group $pid still alive after ${timeout}s; SIGKILL" >&2
kill -KILL -- "-$pid" 2>/dev/null
sleep 0.2
echo "killed $pid"
