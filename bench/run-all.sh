#!/usr/bin/env bash
# Every benchmark of docs/BENCHMARKS.md, side by side in one run, on one
# machine: set-up, throughput of the MLP and the encoder (perf_analyzer and
# the raw engine), swap under fire, loading beside serving, and memory over
# many swaps. Results go to
# .baton/bench/results/ (one file per measurement) and a summary to
# .baton/bench/results/run-all.txt.
#
#   bash bench/run-all.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
results=.baton/bench/results
mkdir -p "$results"
# bench/summarize.py reads every drill report it finds; none of an earlier run may stay.
rm -f "$results"/swap-* "$results"/isolation-* "$results"/memory-* "$results"/tradeoff-*
exec > >(tee "$results/run-all.txt") 2>&1

echo "# run-all $(date -u +%FT%TZ) on $(nproc) cores, $(free -g | awk '/Mem/ {print $2}') GiB; $(uname -r)"
bash scripts/fetch-onnxruntime.sh
bash scripts/setup-clients.sh
bash bench/setup-peers.sh
cargo build --release --locked -p baton-server -p baton-onnx --example raw_engine --quiet
cargo build --release --locked -p baton-server --quiet
.baton/bench-venv-tools/bin/python bench/models.py

raw_engine() { # $1 = model: three 5 s runs each with 1 and 2 threads
  for threads in 1 2; do
    for i in 1 2 3; do target/release/examples/raw_engine ".baton/bench/models/baton/$1/1/model.onnx" 5 1 "$threads"; done
  done
}

echo "## raw engine (ONNX Runtime, no server), MLP 256-1024-512-1, batch 1"
raw_engine mlp
.baton/bench-venv-tools/bin/python bench/raw_engine.py --model .baton/bench/models/baton/mlp/1/model.onnx --seconds 5 --json || true

echo "## throughput: perf_analyzer, concurrency 4, batch 1"
RUNS=3 bash bench/perf-peers.sh baton mlserver kserve

echo "## engine share: the raw engine and baton alternated, MLP, batch 1"
# The target's ratio, taken round by round: the engine's rate drifts by
# 10-15 % within an hour here, more than the margin the line leaves.
bash bench/engine-share.sh

echo "## raw engine (ONNX Runtime, no server), encoder, batch 1"
raw_engine encoder

echo "## throughput: encoder, perf_analyzer, concurrency 1 and 4, batch 1"
for c in 1 4; do
  MODEL=encoder CONCURRENCY=$c COUNT=100 INPUT_DATA=zero RUNS=3 bash bench/perf-peers.sh baton baton-t2 mlserver mlserver-t2 kserve kserve-t2
done

echo "## swap under fire"
# baton-noautogroup: baton once more with autogroup off (needs root; skipped
# otherwise), the case of a server in a container. Its p99 ratio moved by
# ±0.05 from one drill to the next on these machines, as much as the margin
# the target leaves, so it runs three times, spread over the drills, and
# bench/summarize.py takes the median. baton with autogroup runs once: its
# drill takes 12 minutes.
bash bench/swap-drill.sh baton baton-noautogroup mlserver baton-noautogroup.2 kserve baton-noautogroup.3

echo "## loading beside serving"
# baton-noautogroup: as for the swap drill. Both of baton's drills run five
# times, alternated (a drill takes a minute): single drills of this
# benchmark have scattered between 0.8 and 5 when the machine stalls, and
# bench/summarize.py gives a verdict only from drills in which the machine
# was quiet; with three of each, a stalling hour left one quiet drill or
# none.
bash bench/load-isolation.sh baton baton-noautogroup mlserver baton.2 baton-noautogroup.2 kserve \
  baton.3 baton-noautogroup.3 baton.4 baton-noautogroup.4 baton.5 baton-noautogroup.5

echo "## memory over many swaps"
bash bench/memory-drill.sh baton mlserver kserve

echo "## a version in a worker process: the trade-off"
# The load-isolation drills with `big` in a worker, then the MLP steady,
# swapped 100 times and beside a killed worker, in the server, in a worker
# and on Triton's python backend (docs/BENCHMARKS.md §11).
bash bench/setup-triton.sh
bash bench/load-isolation.sh baton-worker baton-worker.2
bash bench/tradeoff.sh
python3 bench/tradeoff_report.py
echo "# done $(date -u +%FT%TZ)"
