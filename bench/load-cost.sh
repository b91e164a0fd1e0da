#!/usr/bin/env bash
# What a load of one model costs an idle baton: the server's CPU and page
# faults per load (from /proc/PID/stat), its RSS after, and the load's
# stage times (from the load call's answer).
#
#   bash bench/load-cost.sh [MODEL [LOADS]]        (default: big 6)
#   ENGINE='stage_weights = false' bash bench/load-cost.sh big
#
# Serves MODEL alone from the benchmark models (bench/models.py) on
# 127.0.0.1:8300, unloads it, then loads it LOADS times through the
# repository API, alternating versions 1 and 2, one after the other.
# ENGINE is added to the model's `[engine]` table; BATON_SERVE_ARGS reaches
# the server. Prints a line per load and the medians, and writes
# $results/load-cost-MODEL.json. The second and third loads of a run grow
# the process to a size it has not had before (a version, the one kept for
# rollback, a third loading), so they cost more than the others here
# (docs/benchmarks-notebook.md §3, "Weights mapped, not copied").
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
model="${1:-big}"
loads="${2:-6}"
d=.baton/bench/load-cost
rm -rf "$d"
mkdir -p "$d/$model"
cp "$out/baton/$model/model.toml" "$d/$model/"
sed -i '1i required = false' "$d/$model/model.toml"
[ -z "${ENGINE:-}" ] || printf '\n[engine]\n%s\n' "$ENGINE" >>"$d/$model/model.toml"
for v in 1 2; do ln -s "$root/$out/baton/$model/$v" "$d/$model/$v"; done
start_baton "$d"
api=http://127.0.0.1:8300
for _ in $(seq 600); do curl -sf -o /dev/null "$api/v2/models/$model/ready" && break; sleep 0.2; done
curl -sf -o /dev/null -X POST "$api/v2/repository/models/$model/unload"

ticks=$(getconf CLK_TCK)
report="$results/load-cost-$model.json"
: >"$report"
for i in $(seq "$loads"); do
  read -r faults0 cpu0 < <(awk '{print $10, $14 + $15}' "/proc/$pid/stat")
  answer=$(curl -sf -X POST "$api/v2/repository/models/$model/load" \
    -d "{\"parameters\":{\"version\":$((i % 2 + 1))}}") || { echo "load $i failed" >&2; exit 1; }
  read -r faults1 cpu1 < <(awk '{print $10, $14 + $15}' "/proc/$pid/stat")
  rss_kib=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
  printf '{"load": %d, "faults": %d, "cpu_ms": %d, "rss_kib": %d, "answer": %s}\n' "$i" \
    $((faults1 - faults0)) $(((cpu1 - cpu0) * 1000 / ticks)) "$rss_kib" "$answer" >>"$report"
done

python3 - "$report" "$model" "${ENGINE:-}" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"load cost of {sys.argv[2]}, engine options: {sys.argv[3] or '(as in model.toml)'}")
print("load  faults     cpu ms  rss MiB  call ms  verify  load  validate  warmup")
stage = lambda r, s: next(x["duration"] for x in r["answer"]["stages"] if x["stage"] == s)
for r in rows:
    a = r["answer"]
    print(f"{r['load']:>4}  {r['faults']:>9,}  {r['cpu_ms']:>6}  {r['rss_kib'] / 1024:>7.0f}  {a['total']:>7.0f}"
          f"  {stage(r, 'verify'):>6.0f}  {stage(r, 'load'):>4.0f}  {stage(r, 'validate'):>8.0f}  {stage(r, 'warmup'):>6.0f}")
med = lambda f: statistics.median(f(r) for r in rows)
print(f"median: {med(lambda r: r['faults']):,.0f} faults, {med(lambda r: r['cpu_ms']):.0f} ms CPU, "
      f"call {med(lambda r: r['answer']['total']):.0f} ms, load stage {med(lambda r: stage(r, 'load')):.0f} ms")
EOF
