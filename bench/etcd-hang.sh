#!/usr/bin/env bash
# A fleet through a hung etcd member, on one machine. Three etcd members
# (/usr/bin/etcd, scripts/setup-packages.sh) on free loopback ports, their
# data on tmpfs, and two `baton serve --cluster` replicas given all three
# endpoints (lease 3 s, the default), each with its own copy of the demo
# ranker (.baton/demo, which `baton serve` without --repo generates),
# versions 1 to 1+RUNS. Then RUNS times (default 3):
#
#   - the member replica r1 speaks to (as its status says, or the etcd
#     port its process holds a connection to; when the member leads,
#     leadership is moved away first: a
#     hung leader of etcd before 3.4.28 revokes every lease when it
#     resumes, docs/fleet.md) is stopped with SIGSTOP for HANG seconds
#     (default 8);
#   - meanwhile `baton fleet rollout ranker --version N`, through the two
#     other members, coordinates a rollout to the next version;
#   - the member is continued, and each replica's
#     baton_cluster_leases_lost_total and its log say whether its lease
#     survived and when the lease's renewals left the hung member.
#
#   BATON=target/debug/baton bash bench/etcd-hang.sh
#
# BATON names the binary (default target/release/baton, built first when
# missing). Every process it starts is stopped by its pid on exit. Logs go
# to HANG_WORK (default .baton/bench/etcd-hang/), the summary to
# .baton/bench/results/etcd-hang.txt. docs/BENCHMARKS.md §13 has a run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
baton="${BATON:-target/release/baton}"
[ -x "$baton" ] || cargo build --release --locked -p baton-server --quiet
runs="${RUNS:-3}"
hang="${HANG:-8}"
work="${HANG_WORK:-.baton/bench/etcd-hang}"
results=.baton/bench/results
mkdir -p "$results"
summary="$results/etcd-hang.txt"
demo=.baton/demo
[ -d "$demo/models/ranker/1" ] && [ -d "$demo/next/2" ] || {
  echo "$(basename "$0"): $demo is missing: run \`$baton serve\` once (it generates the demo repository)" >&2
  exit 1
}

rm -rf "$work"
mkdir -p "$work"
source bench/fleet-common.sh
# After fleet-common.sh, which clears it; stop_all removes it.
scratch="$(mktemp -d "${SCRATCH:-/dev/shm}/baton-etcd-hang.XXXXXX")"
members=()
trap 'for p in "${members[@]}"; do kill -CONT "$p" 2>/dev/null || true; bash bench/stop.sh "$p" >/dev/null 2>&1 || true; done; stop_all' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Three members as one cluster; client ports in ports[], pids in members[].
ports=()
peers=()
for i in 0 1 2; do
  ports+=("$(free_port)")
  peers+=("$(free_port)")
done
initial="m0=http://127.0.0.1:${peers[0]},m1=http://127.0.0.1:${peers[1]},m2=http://127.0.0.1:${peers[2]}"
for i in 0 1 2; do
  client="http://127.0.0.1:${ports[$i]}"
  spawn "$work/etcd$i" "$etcd_bin" --name "m$i" --data-dir "$scratch/etcd$i" \
    --listen-client-urls "$client" --advertise-client-urls "$client" \
    --listen-peer-urls "http://127.0.0.1:${peers[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peers[$i]}" \
    --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token etcd-hang \
    --logger zap --log-outputs stderr
  members+=("$spawned")
done
for i in 0 1 2; do
  for _ in $(seq 200); do
    curl -sf -m 1 "http://127.0.0.1:${ports[$i]}/health" | grep -q '"health":"true"' && break
    sleep 0.1
  done
done
all="etcd://127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
etcdctl_at() { ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$1" "${@:2}"; }

# leader: the index of the member that leads.
leader() {
  local i id lead
  for i in 0 1 2; do
    id="$(etcdctl_at "${ports[$i]}" endpoint status -w json | python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["Status"]; print(s["header"]["member_id"], s["leader"])')"
    read -r id lead <<<"$id"
    [ "$id" = "$lead" ] && { echo "$i"; return; }
  done
  echo -1
}

# publish REPO VERSION: the demo's next version as VERSION, sealed.
publish() {
  cp -r "$demo/next/2" "$1/ranker/$2"
  "$baton" package "$1/ranker/$2" >/dev/null
}

# Two replicas with version 1 (the fleet is seeded at 1); each run
# publishes the next.
echo t0ken >"$work/token"
repl_ports=()
repl_pids=()
for r in r1 r2; do
  repo="$scratch/$r"
  mkdir -p "$repo/ranker"
  cp "$demo/models/ranker/model.toml" "$repo/ranker/"
  cp -r "$demo/models/ranker/1" "$repo/ranker/1"
  port="$(free_port)"
  spawn "$work/$r" env BATON_LOG=info "$baton" serve --repo "$repo" --http "127.0.0.1:$port" --grpc "127.0.0.1:$(free_port)" \
    --cluster "$all" --cluster-name hang --replica-id "$r" --admin-token-file "$work/token"
  started+=("$spawned")
  repl_ports+=("$port")
  repl_pids+=("$spawned")
done
for port in "${repl_ports[@]}"; do
  for _ in $(seq 600); do curl -sf -o /dev/null "http://127.0.0.1:$port/v2/health/ready" && break; sleep 0.2; done
done

# member_of PID PORT: the index of the member the replica at PORT speaks
# to, as its status says (cluster.endpoint), or, from a baton whose status
# does not say, the member whose client port PID's process holds an
# established connection to.
member_of() {
  local pids i endpoint
  endpoint="$(curl -sf -H 'authorization: Bearer t0ken' "http://127.0.0.1:$2/baton/v1/status" |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("cluster", {}).get("endpoint") or "")')"
  for i in 0 1 2; do
    [ "$endpoint" = "http://127.0.0.1:${ports[$i]}" ] && { echo "$i"; return; }
  done
  pids="$(pgrep -g "$1" | paste -sd'|')"
  for i in 0 1 2; do
    ss -tnpH state established "( dport = :${ports[$i]} )" | grep -qE "pid=($pids)," && { echo "$i"; return; }
  done
  echo -1
}

lost() { curl -sf "http://127.0.0.1:$1/metrics" | awk '$1 == "baton_cluster_leases_lost_total" { print $2 }'; }

{
  note "etcd-hang: $runs runs, each member hung for ${hang} s; baton $("$baton" --version) ($baton)"
  for run in $(seq 1 "$runs"); do
    version=$((run + 1))
    for r in r1 r2; do publish "$scratch/$r" "$version"; done
    hung="$(member_of "${repl_pids[0]}" "${repl_ports[0]}")"
    if [ "$hung" -lt 0 ]; then
      # "${members[-1]}" would be the last member, whichever r1 speaks to.
      echo "run $run: cannot tell which etcd member r1 speaks to (its status names none, and it holds no connection to one); no member stopped"
      continue
    fi
    if [ "$(leader)" = "$hung" ]; then
      other=$(((hung + 1) % 3))
      target="$(etcdctl_at "${ports[$other]}" endpoint status -w json | python3 -c 'import json,sys; print("%x" % json.load(sys.stdin)[0]["Status"]["header"]["member_id"])')"
      etcdctl_at "${ports[$hung]}" move-leader "$target" >/dev/null
    fi
    before=("$(lost "${repl_ports[0]}")" "$(lost "${repl_ports[1]}")")
    others=""
    for i in 0 1 2; do [ "$i" = "$hung" ] || others="${others:+$others,}127.0.0.1:${ports[$i]}"; done
    stopped_at="$(date -u +%FT%T.%3NZ)"
    kill -STOP "${members[$hung]}"
    t0=$(date +%s.%N)
    set +e
    timeout 60 "$baton" fleet --cluster "etcd://$others" --cluster-name hang rollout ranker --version "$version" >"$work/rollout.$run.txt" 2>&1
    rc=$?
    set -e
    rollout_s=$(echo "$(date +%s.%N) - $t0" | bc)
    left=$(echo "$hang - ($(date +%s.%N) - $t0)" | bc)
    if [ "$(echo "$left > 0" | bc)" = 1 ]; then sleep "$left"; fi
    kill -CONT "${members[$hung]}"
    after=("$(lost "${repl_ports[0]}")" "$(lost "${repl_ports[1]}")")
    echo "run $run: member m$hung (r1's) stopped at $stopped_at for ${hang} s; rollout to $version exit $rc in ${rollout_s} s: $(tail -n 1 "$work/rollout.$run.txt")"
    for k in 0 1; do
      moved="$(sed 's/\x1b\[[0-9;]*m//g' "$work/r$((k + 1))/stderr" | python3 -c '
import sys, datetime
t0 = datetime.datetime.fromisoformat(sys.argv[1].replace("Z", "+00:00"))
for line in sys.stdin:
    if "renewing it through another" not in line:
        continue
    at = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))
    if at >= t0:
        print("%.2f s after the stop" % (at - t0).total_seconds())
        break
' "$stopped_at")"
      echo "  r$((k + 1)): leases lost ${before[$k]} -> ${after[$k]}; its lease left the hung member: ${moved:-never}"
    done
    # The replicas settle (ready, on the new version) before the next run.
    for port in "${repl_ports[@]}"; do
      for _ in $(seq 150); do curl -sf -o /dev/null "http://127.0.0.1:$port/v2/health/ready" && break; sleep 0.2; done
    done
  done
} | tee "$summary"
