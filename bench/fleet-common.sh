# Shared by the fleet benchmarks (fleet-skew.sh, fleet-big.sh); sourced
# after bench/common.sh, not run. Starts etcd and processes in sessions of
# their own, and stops every one of them by its pid (stop_all, which the
# caller traps on exit). The caller sets work (where logs go) and scratch
# (where etcd's data goes, tmpfs by default).
etcd_bin=/usr/bin/etcd
[ -x "$etcd_bin" ] || { echo "$(basename "$0"): $etcd_bin is missing: bash scripts/setup-packages.sh" >&2; exit 1; }

# stop_each PID...: stops them by pid, in parallel (each may take a
# moment to drain). Waits for those stops only: a bare `wait` would also
# wait for the tee that keeps the summary.
stop_each() {
  local p stops=()
  for p in "$@"; do
    bash bench/stop.sh "$p" >/dev/null 2>&1 &
    stops+=("$!")
  done
  for p in "${stops[@]}"; do wait "$p" || true; done
}

# Every process started here, stopped by pid on exit; etcd last.
started=()
etcd_pid=""
scratch=""
stop_all() {
  stop_each "${started[@]}"
  started=()
  if [ -n "$etcd_pid" ]; then bash bench/stop.sh "$etcd_pid" >/dev/null 2>&1 || true; fi
  etcd_pid=""
  if [ -n "$scratch" ]; then rm -rf "$scratch"; fi
  scratch=""
}

# spawn DIR COMMAND...: runs COMMAND in a session of its own (stdout in
# DIR/stdout, stderr in DIR/stderr) and sets spawned to its pid.
spawn() {
  local d=$1
  shift
  mkdir -p "$d"
  rm -f "$d/pid"
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$d/pid" "$@" >"$d/stdout" 2>"$d/stderr" </dev/null &
  for _ in $(seq 100); do [ -s "$d/pid" ] && break; sleep 0.05; done
  spawned="$(cat "$d/pid")"
}

# unstarted PID: stops one process started here and forgets it.
unstarted() {
  bash bench/stop.sh "$1" >/dev/null 2>&1 || true
  local kept=() p
  for p in "${started[@]}"; do [ "$p" = "$1" ] || kept+=("$p"); done
  started=("${kept[@]}")
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# cpu_ticks PID: user + system time of a process, in clock ticks.
cpu_ticks() {
  awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0
}

note() { echo "=== $1  $(date -u +%FT%TZ)  load average $(cut -d' ' -f1-3 /proc/loadavg)"; }

# start_etcd: etcd on free loopback ports, its log in $work/etcd, its data
# in the scratch dir (tmpfs by default): in a trial run with the data on
# this machine's shared disk, fdatasync took up to 1.5 s while other
# builds ran, etcd stalled past the fleet's 2 s call timeout and 200
# simulated replicas lost the store at once; that measured the
# neighbours' disk, not the protocol.
start_etcd() {
  local d=$work/etcd
  for _ in 1 2 3; do
    rm -rf "$d" "${scratch:?}/etcd"
    mkdir -p "$d"
    etcd_port="$(free_port)"
    local peer client
    peer="http://127.0.0.1:$(free_port)"
    client="http://127.0.0.1:$etcd_port"
    spawn "$d" "$etcd_bin" --name fleetbench --data-dir "$scratch/etcd" \
      --listen-client-urls "$client" --advertise-client-urls "$client" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
      --initial-cluster "fleetbench=$peer" --initial-cluster-state new --initial-cluster-token fleetbench \
      --logger zap --log-outputs stderr
    etcd_pid=$spawned
    for _ in $(seq 200); do
      curl -sf "$client/health" | grep -q '"health":"true"' && { cluster="etcd://127.0.0.1:$etcd_port"; return 0; }
      kill -0 "$etcd_pid" 2>/dev/null || break
      sleep 0.1
    done
    bash bench/stop.sh "$etcd_pid" >/dev/null 2>&1 || true
    etcd_pid=""
    grep -q "address already in use" "$d/stderr" || break
  done
  echo "$(basename "$0"): etcd did not start; $d/stderr:" >&2
  tail -n 20 "$d/stderr" >&2
  return 1
}

