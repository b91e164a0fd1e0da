# Shared by the drill benchmarks (swap-drill.sh, load-isolation.sh,
# memory-drill.sh); sourced, not run. Sets root, out, results and baton,
# stops the server in $pid on exit, and starts servers the same way for
# every benchmark.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)"
cd "$root"
out=.baton/bench/models
results=.baton/bench/results
mkdir -p "$results"
baton=target/release/baton
[ -x "$baton" ] || { echo "$(basename "$0"): build baton first: cargo build --release -p baton-server" >&2; exit 1; }

pid=""
cleanup() {
  if [ -n "$pid" ]; then bash bench/stop.sh "$pid" >/dev/null 2>&1 || true; fi
  restore_autogroup
}
trap cleanup EXIT

# The kernel's autogroup shares the CPU between sessions before priorities
# count, and it applies only to processes in the root CPU cgroup: a server
# in a container of its own is not under it. The *-noautogroup drills run
# baton with it switched off (docs/benchmarks-notebook.md §2 and §3, "Autogroup").
autogroup=/proc/sys/kernel/sched_autogroup_enabled
autogroup_was=""

# autogroup_off LABEL: switches autogroup off until restore_autogroup (or
# the script's exit); fails with a note when not root. Call it before the
# server starts: the kernel places a thread in an autogroup when it is
# created, and a change of the setting does not move threads that already run.
autogroup_off() {
  if ! [ -w "$autogroup" ]; then
    echo "$(basename "$0"): $1 needs root (it writes $autogroup); skipped" >&2
    return 1
  fi
  autogroup_was="$(cat "$autogroup")"
  echo 0 >"$autogroup"
}

restore_autogroup() {
  if [ -n "$autogroup_was" ]; then echo "$autogroup_was" >"$autogroup"; fi
  autogroup_was=""
}

# start_baton DIR: serves the repository DIR on 8300 (gRPC 8301), waits for
# readiness and sets pid. BATON_SERVE_ARGS adds options.
start_baton() {
  local d=$1
  # shellcheck disable=SC2086 # BATON_SERVE_ARGS is a list of options
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$d/pid" "$baton" serve --repo "$d" \
    --http 127.0.0.1:8300 --grpc 127.0.0.1:8301 --no-poll ${BATON_SERVE_ARGS:-} >"$d/server.log" 2>&1 </dev/null &
  for _ in $(seq 600); do [ -s "$d/pid" ] && curl -sf -o /dev/null http://127.0.0.1:8300/v2/health/ready && break; sleep 0.2; done
  pid="$(cat "$d/pid")"
}

# isolation_repo DIR: a repository for the load-isolation drills in DIR:
# the MLP, and the 480 MiB `big` model with versions 1 and 2, not required
# for readiness. Start baton on it, then unload big (the first scan loads
# every model) so that each load of the drill is a full one.
isolation_repo() {
  local d=$1
  rm -rf "$d"
  mkdir -p "$d/big"
  cp -r "$out/baton/mlp" "$d/"
  cp "$out/baton/big/model.toml" "$d/big/"
  for v in 1 2; do ln -s "$root/$out/baton/big/$v" "$d/big/$v"; done
  sed -i '1i required = false' "$d/big/model.toml"
}

# start_mlserver DIR MODEL...: serves the MODELs from a scratch MLServer
# layout under DIR on 8100 and sets pid.
start_mlserver() {
  local d=$1
  shift
  mkdir -p "$d/mlserver" "$d/baton"
  for m in "$@"; do
    cp -r "$out/mlserver/$m" "$d/mlserver/"
    # model-settings.json points at ../../../baton/<model>/<v>/model.onnx
    ln -s "$root/$out/baton/$m" "$d/baton/$m"
  done
  pid="$(bash bench/run-mlserver.sh "$d/mlserver" 8100)"
}

# stop_server: stops the server in $pid.
stop_server() {
  bash bench/stop.sh "$pid" >/dev/null 2>&1 || true
  pid=""
}

# server_of NAME: the server a drill's name stands for. A name may end in
# .N, a repeat of the same drill (baton-noautogroup.2): one drill on these
# machines is not a measurement the noise lets stand alone, so the full run
# repeats baton's and bench/summarize.py reports the median.
server_of() {
  echo "${1%.[0-9]*}"
}

# each_server FUNCTION [SERVER...]: calls FUNCTION for each server named
# (default: baton mlserver kserve).
each_server() {
  local run=$1
  shift
  local servers=("$@")
  [ ${#servers[@]} -gt 0 ] || servers=(baton mlserver kserve)
  for s in "${servers[@]}"; do "$run" "$s"; done
}
