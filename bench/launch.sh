# Starts a peer server and waits for it; sourced by run-mlserver.sh and
# run-kserve.sh, not run.
#
# launch NAME RUN PORT COMMAND...: runs COMMAND in its own session (so
# bench/stop.sh can stop its process group, workers included), with its
# log in RUN/server.log; waits until http://127.0.0.1:PORT/v2/health/ready
# answers 200 (READY_TIMEOUT seconds, default 180) and prints the pid. If
# the server exits or is not ready in time, prints its log and fails,
# stopping it first.
launch() {
  local name=$1 run=$2 port=$3
  shift 3
  # setsid may fork (when the caller has job control), so the server's pid
  # is written by the process itself, which then execs the server.
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$run/pid" "$@" >"$run/server.log" 2>&1 </dev/null &
  for _ in $(seq 50); do [ -s "$run/pid" ] && break; sleep 0.1; done
  local pid
  pid="$(cat "$run/pid")"
  local deadline=$((SECONDS + ${READY_TIMEOUT:-180}))
  until curl -sf -o /dev/null "http://127.0.0.1:$port/v2/health/ready"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name: the server exited; log $run/server.log:" >&2
      tail -n 30 "$run/server.log" >&2
      return 1
    fi
    if ((SECONDS > deadline)); then
      echo "$name: not ready after ${READY_TIMEOUT:-180}s; stopping pid $pid; log $run/server.log" >&2
      bash "$root/bench/stop.sh" "$pid" >&2 || true
      return 1
    fi
    sleep 0.2
  done
  echo "$pid"
}
