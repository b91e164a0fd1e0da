#!/usr/bin/env bash
# How much of the engine's rate the server delivers, with the shared
# machine's drift taken out. The engine's rate on these machines moves by
# 10-15 % within an hour, so a server rate and an engine rate measured
# twenty minutes apart can put the ratio on either side of its line (the
# target: at least half the raw engine's rate). Here they alternate, ROUNDS
# times (default 5), each round:
#
#   raw    the MLP through ONNX Runtime in a loop, one session, batch 1,
#          5 s, nothing else running (crates/baton-onnx/examples/raw_engine.rs)
#   pa     baton serving the MLP under perf_analyzer, concurrency 4, HTTP
#          binary, batch 1 (as bench/perf-peers.sh measures it)
#   drill  the same server under `baton drill`, 4 connections, HTTP binary,
#          8 s after 2 s of warm-up: a client that costs the two cores less
#          per request than perf_analyzer does
#
# and bench/summarize.py gives each round's ratios and their medians. The
# clients run on the same two cores as the server, so what they cost per
# request is taken from it (docs/BENCHMARKS.md, "Half the engine's rate").
#
#   bash bench/engine-share.sh
#
# One line per round goes to stdout and to .baton/bench/results/engine-share.txt.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds="${ROUNDS:-5}"
pa=.baton/bin/perf_analyzer
raw=target/release/examples/raw_engine
model="$out/baton/mlp/1/model.onnx"
[ -x "$pa" ] || { echo "engine-share: no $pa; run bash scripts/setup-clients.sh" >&2; exit 1; }
[ -x "$raw" ] || { echo "engine-share: build the raw engine: cargo build --release -p baton-onnx --example raw_engine" >&2; exit 1; }
[ -f "$model" ] || { echo "engine-share: run bench/models.py first" >&2; exit 1; }

d=.baton/bench/engine-share
rm -rf "$d"
mkdir -p "$d"
cp -r "$out/baton/mlp" "$d/"
start_baton "$d"

for round in $(seq "$rounds"); do
  "$raw" "$model" 5 1 1 >"$d/raw.json"
  "$pa" -m mlp -u 127.0.0.1:8300 -i http -b 1 --concurrency-range 4 --measurement-mode count_windows \
    --measurement-request-count 500 --max-trials 30 -f "$d/pa.csv" >"$d/pa.log" 2>&1 || { echo "engine-share: perf_analyzer failed" >&2; tail -n3 "$d/pa.log" >&2; exit 1; }
  "$baton" drill mlp --url http://127.0.0.1:8300 --protocol http-binary --input input:FP32:1,256 \
    --concurrency 4 --warmup 2s --duration 8s --swaps 0 --json "$d/drill.json" >"$d/drill.txt" 2>&1 ||
    { echo "engine-share: the drill failed" >&2; tail -n3 "$d/drill.txt" >&2; exit 1; }
  python3 - "$round" "$d" <<'PY'
import csv, json, sys
from pathlib import Path
n, d = sys.argv[1], Path(sys.argv[2])
raw = json.loads((d / "raw.json").read_text())["calls_per_s"]
pa = next(csv.DictReader(open(d / "pa.csv")))
drill = json.loads((d / "drill.json").read_text())
print(f"round {n}: raw {raw:.1f} calls/s | perf_analyzer {float(pa['Inferences/Second']):.1f} infer/s "
      f"p99 {int(pa['p99 latency']) / 1000:.2f} ms | drill {drill['rate_per_s']:.1f} requests/s "
      f"p99 {drill['steady']['p99_ms']:.2f} ms, {drill['failed']} failed")
PY
done | tee "$results/engine-share.txt"
