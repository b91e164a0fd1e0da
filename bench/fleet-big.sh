#!/usr/bin/env bash
# A fleet of two replicas serving a model of over 1 GiB, started as the
# README starts a fleet (default lease of 3 s): how long each takes to be
# ready, how long rollouts take, and how many leases were lost (the
# target is none: a load of several seconds must not cost a replica its
# registration).
#
#   bash bench/fleet-big.sh
#
# The model is an MLP 256-16384-16384-1 (272 M parameters, 1.01 GiB of
# weights), versions 1 and 2, written once by the testkit's mlp_repo
# example into FLEET_BIG_WORK (default .baton/bench/fleet-big; 2.2 GB,
# kept for the next run). One etcd on free loopback ports with its data on
# tmpfs; the fleet's committed version is set to 1 before the replicas
# start; both read the same repository. Then ROLLOUTS rollouts (default 4)
# alternate versions 2 and 1, each `baton fleet rollout big --version V`
# with a prepare timeout of 300 s. Every process started is stopped by its
# pid on exit. Prints `figure:` lines and writes them to
# .baton/bench/results/fleet-big.txt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --locked -p baton-server --quiet
cargo build --release --locked -p baton-testkit --example mlp_repo --quiet
source bench/common.sh
source bench/fleet-common.sh

work="${FLEET_BIG_WORK:-.baton/bench/fleet-big}"
rollouts="${ROLLOUTS:-4}"
sizes=256,16384,16384,1
mkdir -p "$work"
log="$results/fleet-big.txt"
: >"$log"
figure() { echo "figure: $*" | tee -a "$log"; }

if [ "$(cat "$work/repo.stamp" 2>/dev/null)" != "$sizes" ]; then
  rm -rf "$work/repo"
  echo "Writing the 1 GiB model's two versions into $work/repo ..."
  target/release/examples/mlp_repo "$work/repo" big "$sizes" 2 >/dev/null
  echo "$sizes" >"$work/repo.stamp"
fi
du -sb "$work/repo/big/1" | awk '{ printf "figure: version size %.2f GiB\n", $1 / 2^30 }' | tee -a "$log"

scratch="$(mktemp -d -p "${SCRATCH:-/dev/shm}" baton-fleet-big.XXXXXX)"
trap 'stop_all; cleanup' EXIT
start_etcd || exit 1
fleet_cmd() { BATON_LOG=warn "$baton" fleet --cluster "$cluster" --cluster-name big "$@"; }
ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$etcd_port" put /baton/big/desired/big \
  '{"version":1,"rollout":null,"at_ms":0}' >/dev/null

# The two replicas, as the README starts them (the default lease).
began=$(date +%s.%N)
pids=()
for r in a b; do
  spawn "$work/$r" "$baton" serve --repo "$work/repo" --http 127.0.0.1:0 --grpc 127.0.0.1:0 \
    --cluster "$cluster" --cluster-name big --replica-id "$r"
  started+=("$spawned")
  pids+=("$spawned")
done
ports=()
for r in a b; do
  port=""
  until [ -n "$port" ]; do
    port="$(grep -o 'http://127.0.0.1:[0-9]*' "$work/$r/stdout" 2>/dev/null | head -1 | sed 's/.*://' || true)"
    [ -n "$port" ] || sleep 0.1
  done
  ports+=("$port")
done
for i in 0 1; do
  until curl -sf -o /dev/null "http://127.0.0.1:${ports[$i]}/v2/health/ready"; do
    kill -0 "${pids[$i]}" 2>/dev/null || { echo "fleet-big: a replica exited; see $work" >&2; exit 1; }
    sleep 0.1
  done
  figure "replica $i ready after $(echo "$(date +%s.%N) - $began" | bc) s"
done

for i in $(seq 1 "$rollouts"); do
  v=$((i % 2 == 1 ? 2 : 1))
  start=$(date +%s.%N)
  rc=0
  fleet_cmd rollout big --version "$v" --prepare-timeout 300s >"$work/rollout.$i.txt" 2>&1 || rc=$?
  figure "rollout $i to version $v: exit $rc in $(echo "$(date +%s.%N) - $start" | bc) s; $(grep -E 'switched within|ended' "$work/rollout.$i.txt" | head -1)"
done

lost=0
for i in 0 1; do
  n="$(curl -sf "http://127.0.0.1:${ports[$i]}/metrics" | awk '$1 == "baton_cluster_leases_lost_total" { print $2 }')"
  lost=$((lost + ${n:-0}))
done
figure "leases lost: $lost (baton_cluster_leases_lost_total over both replicas)"
figure "store lost in the logs: $(cat "$work"/a/stderr "$work"/b/stderr | grep -c 'Lost the cluster store' || true)"
for i in 0 1; do
  figure "replica $i RSS at the end: $(awk '/VmRSS/ { printf "%.0f MiB", $2 / 1024 }' "/proc/${pids[$i]}/status")"
done
echo "Wrote $log"
