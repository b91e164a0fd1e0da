#!/usr/bin/env bash
# Fleet rollouts over etcd: how far apart the replicas switch, on one
# machine. In one run:
#
#   1. fleet    one etcd (/usr/bin/etcd, scripts/setup-packages.sh) on free
#               loopback ports with a scratch data dir (on tmpfs: see
#               start_etcd), and REPLICAS baton
#               replicas (default 32; `baton serve --cluster`, each on free
#               ports with its own copy of the benchmark MLP's repository,
#               version 1 only, so the fleet is seeded at 1). Once all are
#               ready, version 2 is copied into every repository and
#               bench/fleet_load.py sends small JSON inferences round robin
#               across all of them (THREADS threads, default 4, keep-alive)
#               for the whole part. Then ROLLOUTS rollouts (default 20),
#               alternating versions 2 and 1 and the switch leads in LEADS
#               (default "0ms 250ms"), each `baton fleet rollout mlp
#               --version V --switch-lead L` as the coordinator: its wall and CPU time, its
#               printed line, and `baton fleet status --json` after it (the
#               record's switch summary, started_ms and commit_us; every
#               replica's serving versions). Then ABORTS rollouts (default
#               2) of a version 3 that is damaged on one replica only (a
#               flipped byte in model.onnx: its MANIFEST check fails): each
#               must exit non-zero with an abort naming that replica, and
#               the load must see no answer from version 3. One more
#               rollout after them shows the fleet still rolls out.
#   2. scale    `baton fleet simulate --replicas N` (one process, N
#               participants, each with its own connection and lease, no
#               model) for each N in SIM_SIZES (default 100 300 1000), on a
#               fresh cluster name each, SIM_ROLLOUTS rollouts (default 5) of
#               m to 2, 3, 4, ...; each N is capped at SIM_TIMEOUT seconds
#               (default 600) and each rollout at SIM_ROLLOUT_TIMEOUT
#               (default 240), at the switch lead SIM_LEAD (default
#               250ms). etcd's and the simulator's CPU time over the N,
#               and etcd's warnings, are recorded.
#
#   bash bench/fleet-skew.sh [fleet] [scale]      (default: both)
#
# Builds baton (release) first; generates the MLP with bench/models.py if
# it is missing. Every process it starts is stopped by its pid on exit.
# The replicas' repositories and etcd's data live in a scratch dir under
# SCRATCH (default /dev/shm), removed on exit. Logs and raw outputs go to
# FLEET_WORK (default .baton/bench/fleet/), the report to
# .baton/bench/results/fleet-skew.json and the summary to
# .baton/bench/results/fleet-skew.txt. docs/BENCHMARKS.md §8 has a run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --locked -p baton-server --quiet
source bench/common.sh

replicas="${REPLICAS:-32}"
rollouts="${ROLLOUTS:-20}"
# Switch leads the rollouts alternate between (--switch-lead): 0 switches
# each replica when the commit reaches it, 250ms (the default) at one
# instant the commit names. Alternated in one run, so that both see the
# same machine.
leads="${LEADS:-0ms 250ms}"
aborts="${ABORTS:-2}"
threads="${THREADS:-4}"
sim_sizes="${SIM_SIZES:-100 300 1000}"
sim_rollouts="${SIM_ROLLOUTS:-5}"
sim_timeout="${SIM_TIMEOUT:-600}"
sim_rollout_timeout="${SIM_ROLLOUT_TIMEOUT:-240}"
sim_lead="${SIM_LEAD:-250ms}"
rollout_timeout="${ROLLOUT_TIMEOUT:-180}"
victim="r$((replicas / 4))"
work="${FLEET_WORK:-.baton/bench/fleet}"

source bench/fleet-common.sh
trap 'stop_all; cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fleet_cmd() { "$baton" fleet --cluster "$cluster" --cluster-name "$@"; }

# rollout NAME TIMEOUT OUT MODEL VERSION: one coordinated rollout; its
# output in OUT.txt, wall/user/system seconds in OUT.time, exit code in
# OUT.rc. Then GAP seconds (default 1: the replicas rewrite their
# registrations within a 500 ms tick) and `baton fleet status --json` in
# OUT.status.json: the record, and what every replica serves after it;
# each replica's switch report (etcdctl) in OUT.switched.
rollout() {
  local name=$1 limit=$2 o=$3 model=$4 version=$5 lead=${6:-250ms} rc=0
  echo "$lead" >"$o.lead"
  BATON_LOG=warn /usr/bin/time -f '%e %U %S' -o "$o.time" \
    timeout "$limit" "$baton" fleet --cluster "$cluster" --cluster-name "$name" rollout "$model" --version "$version" \
    --switch-lead "$lead" >"$o.txt" 2>&1 || rc=$?
  echo "$rc" >"$o.rc"
  sleep "${GAP:-1}"
  BATON_LOG=warn fleet_cmd "$name" status --json >"$o.status.json" 2>/dev/null || true
  ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$etcd_port" get --prefix --print-value-only \
    "/baton/$name/switched/$model/" >"$o.switched" 2>/dev/null || true
  echo "  $(basename "$o") -> $version: exit $rc, $(tail -n 1 "$o.time" 2>/dev/null | cut -d' ' -f1) s; $(grep -E 'switched within|ended' "$o.txt" | head -2 | tr '\n' ' ')"
}

part_fleet() {
  local d=$work/fleet mlp=$out/baton/mlp
  rm -rf "$d"
  mkdir -p "$d"
  note "fleet: $replicas replicas"
  grep MemAvailable /proc/meminfo | awk '{ print $2 }' >"$d/mem-available-before"
  : >"$d/ports"
  local pids=() i r
  for i in $(seq 0 $((replicas - 1))); do
    r=$d/r$i
    # Copies, not hard links: linking a file changes its inode's change
    # time, and a replica verifying that file refuses it as changed.
    mkdir -p "$scratch/r$i/mlp"
    cp "$mlp/model.toml" "$scratch/r$i/mlp/"
    cp -r "$mlp/1" "$scratch/r$i/mlp/"
    spawn "$r" "$baton" serve --repo "$scratch/r$i" --http 127.0.0.1:0 --grpc 127.0.0.1:0 \
      --cluster "$cluster" --cluster-name fleet --replica-id "r$i"
    started+=("$spawned")
    pids+=("$spawned")
  done
  echo "${pids[@]}" >"$d/pids"
  local deadline=$((SECONDS + 300)) port
  for i in $(seq 0 $((replicas - 1))); do
    r=$d/r$i
    until port="$(grep -o 'http://127.0.0.1:[0-9]*' "$r/stdout" 2>/dev/null | head -1 | sed 's/.*://')" && [ -n "$port" ] &&
      curl -sf -o /dev/null "http://127.0.0.1:$port/v2/health/ready"; do
      if ! kill -0 "${pids[$i]}" 2>/dev/null || ((SECONDS > deadline)); then
        echo "fleet-skew: replica r$i is not ready (exited or 300 s passed); $r/stderr:" >&2
        tail -n 20 "$r/stderr" >&2
        return 1
      fi
      sleep 0.2
    done
    echo "$port" >>"$d/ports"
  done
  note "fleet: all $replicas ready"
  grep MemAvailable /proc/meminfo | awk '{ print $2 }' >"$d/mem-available-ready"
  for p in "${pids[@]}"; do
    echo "$p $(awk '/VmRSS/ { print $2 }' "/proc/$p/status") $(awk '/^Pss:/ { print $2 }' "/proc/$p/smaps_rollup")"
  done >"$d/memory"
  for i in $(seq 0 $((replicas - 1))); do cp -r "$mlp/2" "$scratch/r$i/mlp/"; done

  spawn "$d/load" python3 bench/fleet_load.py --ports "$d/ports" --out "$d/load.json" --threads "$threads"
  local load_pid=$spawned
  started+=("$load_pid")
  sleep 3
  local etcd0 v
  etcd0="$(cpu_ticks "$etcd_pid")"
  date +%s.%N >"$d/rollouts-began"
  local leads_list
  read -r -a leads_list <<<"$leads"
  for i in $(seq 1 "$rollouts"); do
    v=$((i % 2 == 1 ? 2 : 1))
    rollout fleet "$rollout_timeout" "$d/rollout.$i" mlp "$v" "${leads_list[$(((i - 1) % ${#leads_list[@]}))]}"
  done
  echo "$etcd0 $(cpu_ticks "$etcd_pid")" >"$d/etcd-ticks"

  # Version 3, damaged on the victim only.
  for i in $(seq 0 $((replicas - 1))); do cp -r "$mlp/3" "$scratch/r$i/mlp/"; done
  printf '\xde\xad\xbe\xef' | dd of="$scratch/$victim/mlp/3/model.onnx" bs=1 seek=100000 conv=notrunc status=none
  for i in $(seq 1 "$aborts"); do
    rollout fleet "$rollout_timeout" "$d/abort.$i" mlp 3
  done
  v=$((rollouts % 2 == 1 ? 1 : 2))
  rollout fleet "$rollout_timeout" "$d/after" mlp "$v"
  date +%s.%N >"$d/rollouts-ended"
  stop_each "$load_pid"
  stop_each "${pids[@]}"
  started=()
  echo "$victim" >"$d/victim"
  note "fleet: done"
}

part_scale() {
  local d=$work/scale n deadline etcd0 sim0 sim_pid v log_from
  rm -rf "$d"
  mkdir -p "$d"
  for n in $sim_sizes; do
    local s=$d/n$n
    mkdir -p "$s"
    note "scale: $n simulated replicas"
    deadline=$((SECONDS + sim_timeout))
    log_from="$(wc -l <"$work/etcd/stderr")"
    etcd0="$(cpu_ticks "$etcd_pid")"
    local joined_at=$SECONDS
    spawn "$s/sim" env BATON_LOG=warn "$baton" fleet --cluster "$cluster" --cluster-name "sim$n" \
      simulate --replicas "$n" --prefix s --prepare 50ms
    sim_pid=$spawned
    started+=("$sim_pid")
    local live=0
    until [ "$live" -ge "$n" ]; do
      live="$(BATON_LOG=warn fleet_cmd "sim$n" status --json 2>/dev/null | jq '[.replicas[] | select(.ready)] | length' || echo 0)"
      if ! kill -0 "$sim_pid" 2>/dev/null || ((SECONDS > deadline)); then break; fi
      [ "$live" -ge "$n" ] || sleep 1
    done
    echo "$live $((SECONDS - joined_at))" >"$s/joined"
    echo "  $live of $n joined in $((SECONDS - joined_at)) s"
    sim0="$(cpu_ticks "$sim_pid")"
    local etcd1
    etcd1="$(cpu_ticks "$etcd_pid")"
    date +%s.%N >"$s/rollouts-began"
    if [ "$live" -ge "$n" ]; then
      for i in $(seq 1 "$sim_rollouts"); do
        local left=$((deadline - SECONDS))
        if ((left < 10)); then
          echo "  the $sim_timeout s cap for N=$n ran out before rollout $i" | tee "$s/capped"
          break
        fi
        rollout "sim$n" "$((left < sim_rollout_timeout ? left : sim_rollout_timeout))" "$s/rollout.$i" m "$((i + 1))" "$sim_lead"
      done
    fi
    date +%s.%N >"$s/rollouts-ended"
    echo "$etcd0 $etcd1 $(cpu_ticks "$etcd_pid") $sim0 $(cpu_ticks "$sim_pid")" >"$s/ticks"
    tail -n "+$((log_from + 1))" "$work/etcd/stderr" >"$s/etcd.log"
    unstarted "$sim_pid"
    grep -c . "$s/sim/stderr" >"$s/sim-log-lines" || true
  done
  note "scale: done"
}

mkdir -p "$work"
scratch="$(mktemp -d -p "${SCRATCH:-/dev/shm}" baton-fleet.XXXXXX)"
[ -s "$out/baton/mlp/3/MANIFEST" ] || .baton/bench-venv-tools/bin/python bench/models.py --only mlp
exec > >(tee "$results/fleet-skew.txt") 2>&1
echo "# fleet-skew $(date -u +%FT%TZ) on $(nproc) cores, $(free -g | awk '/Mem/ {print $2}') GiB; $(uname -r); baton $(git rev-parse --short HEAD)"
start_etcd
echo "$("$etcd_bin" --version | head -1) on $cluster (pid $etcd_pid), data in $scratch/etcd"
parts=("${@:-fleet scale}")
for part in ${parts[*]}; do
  case "$part" in
    fleet) part_fleet ;;
    scale) part_scale ;;
    *) echo "fleet-skew: unknown part $part (fleet or scale)" >&2; exit 2 ;;
  esac
done
python3 bench/fleet_report.py --work "$work" --out "$results/fleet-skew.json" --clk-tck "$(getconf CLK_TCK)" \
  --replicas "$replicas" --rollouts "$rollouts"
