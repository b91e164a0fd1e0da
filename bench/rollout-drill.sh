#!/usr/bin/env bash
# Rollouts under fire, baton only. `baton drill --swap rollout` drives the
# benchmark MLP (KServe V2 REST with JSON tensors, input 1×256, as in
# bench/swap-drill.sh) while a rollout runs inside the server:
#
#   1. drift    a canary of version 2 beside version 1 (other weights: its
#               outputs drift) with steps 10,50,100 and 2 s windows, guarded
#               by max_rel_l2 0.05 and baton's default guards (error rate,
#               p99 ratio 1.5).
#               The guards roll it back at the first window. The report
#               gives failed requests, p50/p99 per phase (before, the step,
#               after), the answers per role, the decisions with their
#               guard values, and the time from the failing window's end to
#               the candidate's last answer and to the server's store of
#               its weight 0. REPEAT times (default 3).
#   2. shadow   the overhead of a shadow rollout: the same open-loop load
#               (RATE requests/s; default a quarter of the capacity a closed
#               loop of 4 workers measures first: at 100 % the shadow runs
#               every request twice, so that is half the capacity with it;
#               at half the capacity without it, the shadow's copies
#               saturated the 2 cores and the stable p99 went to seconds) run PAIRS times (default 5)
#               without a rollout and then with a shadow rollout of version
#               2 at 100 % (steps [100], a 10 min window: it never decides),
#               alternating. Each pair's p99 is over the requests started
#               after the shadow took its share (the `started` decision of
#               the run with it), the same span in both runs; the result is
#               the median of the per-pair ratios with / without.
#
#   3. identical, nan, watch   bench/rollout_scenarios.py against
#               candidates bench/rollout_models.py makes from version 1 (an
#               identical copy; one that answers NaN for one input in ten;
#               one that drifts only on inputs the clients send after its
#               promotion), with the default guards on: the p99 ratio of
#               every judged window of the identical candidate, and the time
#               from the failing window's end to the rollback of the others
#               (the late one's inside the watch after promotion). REPEAT
#               times each.
#
#   bash bench/rollout-drill.sh [drift] [shadow] [identical] [nan] [watch]
#                                       (default: all)
#
# Both drills serve a scratch copy of the benchmark repository holding
# version 1 only, started with --no-poll; version 2 is copied in once 1
# serves. Between shadow runs the rollout is aborted through the API and
# the next run waits for the model to settle. Reports (JSON, SVG, table)
# go to .baton/bench/results/rollout-*; the summary of each part to
# rollout-drift.summary and rollout-shadow.summary. Needs bench/models.py
# and a release build of baton.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
repeat="${REPEAT:-3}"
pairs="${PAIRS:-5}"
duration="${DURATION:-20s}"
port=8300
url="http://127.0.0.1:$port"
load=(--protocol http-json --input input:FP32:1,256)

# serve_v1: a scratch repository with version 1 of the MLP served, and
# version 2 published beside it.
serve_v1() {
  local d=.baton/bench/rollout
  rm -rf "$d"
  mkdir -p "$d/mlp"
  cp "$out/baton/mlp/model.toml" "$d/mlp/"
  printf '%s' "${WARMUP_TOML:-}" >>"$d/mlp/model.toml"
  cp -r "$out/baton/mlp/1" "$d/mlp/"
  start_baton "$d"
  settle
  cp -r "$out/baton/mlp/2" "$d/mlp/"
}

# settle: waits until the MLP is READY with no operation under way (an
# abort's drain included).
settle() {
  for _ in $(seq 300); do
    [ "$(curl -sf "$url/baton/v1/models/mlp/status" | jq -r '"\(.state) \(.busy)"')" = "READY false" ] && return 0
    sleep 0.1
  done
  echo "rollout-drill: the MLP did not settle" >&2
  return 1
}

# abort: ends a rollout still running (a shadow one never decides).
abort() {
  curl -sf -o /dev/null -X POST "$url/baton/v1/models/mlp/rollout/abort" || true
  settle
}

note() { echo "=== $1  $(date -u +%FT%TZ)  load average $(cut -d' ' -f1-3 /proc/loadavg)"; }

drift() {
  serve_v1
  local guards='{"min_samples": 100, "max_rel_l2": 0.05}'
  for i in $(seq "$repeat"); do
    note "drift.$i"
    "$baton" drill mlp --url "$url" "${load[@]}" --concurrency 4 --warmup 3s --tail 3s --duration 60s \
      --swap rollout --rollout-version 2 --rollout-mode canary --rollout-steps 10,50,100 --rollout-interval 2s \
      --rollout-guards "$guards" --pid "$pid" --stall-probe 2ms --quiet \
      --json "$results/rollout-drift.$i.json" --svg "$results/rollout-drift.$i.svg" |
      tee "$results/rollout-drift.$i.txt" || true
    settle
  done
  stop_server
  python3 - "$results" "$repeat" <<'PY' | tee "$results/rollout-drift.summary"
import json, statistics, sys
results, n = sys.argv[1], int(sys.argv[2])
fmt = lambda v, d=1: "-" if v is None else f"{v:.{d}f}"
rows = []
for i in range(1, n + 1):
    r = json.load(open(f"{results}/rollout-drift.{i}.json"))
    ro = r["rollout"]
    t = ro.get("rollback") or {}
    p99 = {p["name"]: p["stats"]["p99_ms"] for p in ro["phases"]}
    rows.append((r["requests"], r["failed"], ro["outcome"], p99, t.get("decided_ms"),
                 t.get("last_candidate_answer_ms"), t.get("weight_zero_ms"),
                 t.get("candidate_answers_started_after_weight_zero")))
    print(f"run {i}: {r['requests']} requests, {r['failed']} failed, {ro['outcome']}; p99 ms "
          + ", ".join(f"{k} {v:.2f}" for k, v in p99.items() if v is not None)
          + f"; from the window's end: decided {fmt(t.get('decided_ms'))} ms, last candidate answer "
          f"{fmt(t.get('last_candidate_answer_ms'))} ms, weight 0 stored {fmt(t.get('weight_zero_ms'))} ms; "
          f"candidate answers after the store {t.get('candidate_answers_started_after_weight_zero')}")
med = lambda xs: statistics.median([x for x in xs if x is not None]) if any(x is not None for x in xs) else None
print(f"median of {n}: failed {sum(r[1] for r in rows)} of {sum(r[0] for r in rows)}; "
      f"decided {fmt(med([r[4] for r in rows]))} ms, last candidate answer {fmt(med([r[5] for r in rows]))} ms, "
      f"weight 0 stored {fmt(med([r[6] for r in rows]))} ms after the failing window's end")
for phase in ["before", "step 1 (10%)", "after rolled_back"]:
    print(f"  p99 {phase}: median {fmt(med([r[3].get(phase) for r in rows]), 2)} ms")
PY
}

shadow() {
  serve_v1
  local rate="${RATE:-}"
  if [ -z "$rate" ]; then
    note "capacity"
    "$baton" drill mlp --url "$url" "${load[@]}" --concurrency 4 --swaps 0 --duration 8s --quiet \
      --json "$results/rollout-capacity.json" --svg /dev/null | tail -n +2 | head -1
    rate="$(jq '.rate_per_s / 4 | floor' "$results/rollout-capacity.json")"
  fi
  echo "shadow: open loop at $rate requests/s, $pairs pairs of $duration"
  local common=(mlp --url "$url" "${load[@]}" --rate "$rate" --duration "$duration" --warmup 3s --records --quiet)
  for i in $(seq "$pairs"); do
    note "shadow pair $i: without"
    "$baton" drill "${common[@]}" --swaps 0 --json "$results/rollout-plain.$i.json" \
      --svg "$results/rollout-plain.$i.svg" >"$results/rollout-plain.$i.txt" || true
    note "shadow pair $i: with a shadow rollout at 100 %"
    "$baton" drill "${common[@]}" --swap rollout --rollout-version 2 --rollout-mode shadow --rollout-steps 100 \
      --rollout-interval 10m --rollout-guards '{"min_samples": 100}' \
      --json "$results/rollout-shadow.$i.json" --svg "$results/rollout-shadow.$i.svg" >"$results/rollout-shadow.$i.txt" || true
    curl -sf "$url/baton/v1/models/mlp/rollout" >"$results/rollout-shadow.$i.status.json" || true
    abort
  done
  stop_server
  python3 - "$results" "$pairs" "$rate" <<'PY' | tee "$results/rollout-shadow.summary"
import json, math, statistics, sys
results, n, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def p99_after(report, t0_ms):
    rec = report["records"]
    lat = sorted(l for s, l, e in zip(rec["start_ms"], rec["latency_ms"], rec["error"]) if s >= t0_ms and e == 0)
    return lat[max(0, math.ceil(0.99 * len(lat)) - 1)], len(lat)

ratios = []
for i in range(1, n + 1):
    plain = json.load(open(f"{results}/rollout-plain.{i}.json"))
    shadow = json.load(open(f"{results}/rollout-shadow.{i}.json"))
    ro = shadow["rollout"]
    step = next(p for p in ro["phases"] if p["name"].startswith("step"))
    t0 = step["from_s"] * 1000
    (p_with, n_with), (p_without, n_without) = p99_after(shadow, t0), p99_after(plain, t0)
    roles = ", ".join(f"{s['role']} {s['share']*100:.1f}%" for s in step["roles"])
    try:
        totals = json.load(open(f"{results}/rollout-shadow.{i}.status.json"))["rollout"]["totals"]
        roles += f"; shadow copies run {totals['candidate']['requests']}, compared {totals['compared']}, dropped {totals['dropped']}"
    except (OSError, KeyError, ValueError):
        pass
    ratios.append(p_with / p_without)
    print(f"pair {i}: from {t0/1000:.2f} s, p99 without {p_without:.3f} ms ({n_without} requests, "
          f"{plain['failed']} failed), with shadow {p_with:.3f} ms ({n_with} requests, {shadow['failed']} failed; "
          f"{roles}); ratio {p_with / p_without:.3f}")
print(f"open loop {rate}/s: median ratio of p99 with a shadow rollout / without over {n} pairs: "
      f"{statistics.median(ratios):.3f} (ratios {', '.join(f'{r:.3f}' for r in ratios)})")
PY
}

# scenario NAME VARIANT: REPEAT runs of bench/rollout_scenarios.py NAME,
# each against a fresh server with VARIANT (of bench/rollout_models.py)
# published as version 5 beside version 1.
scenario() {
  local name=$1 variant=$2 d=.baton/bench/rollout
  local tools=.baton/bench-venv-tools/bin/python
  [ -x "$tools" ] || { echo "rollout-drill: run bench/setup-peers.sh first (the tools venv)" >&2; return 1; }
  "$tools" bench/rollout_models.py "$out/baton/mlp/1" .baton/bench/rollout-models "$baton" >/dev/null
  for i in $(seq "$repeat"); do
    # The load transaction's generated warmup inputs, spread over [-1, 1],
    # catch the NaN candidate before it serves (warmup_failed: the output
    # holds NaN). To measure the guard behind it, the nan part warms with
    # shipped samples only, as a model whose own samples miss the rare
    # inputs would.
    WARMUP_TOML="$( [ "$variant" = nan ] && printf '[warmup]\ngenerated = false\n' )" serve_v1
    cp -r ".baton/bench/rollout-models/$variant" "$d/mlp/5"
    note "$name.$i"
    python3 bench/rollout_scenarios.py "$name" --url "$url" --version 5 --out "$results/rollout-$name.$i.json" |
      tee "$results/rollout-$name.$i.txt" || true
    stop_server
  done
}

for part in "${@:-drift shadow identical nan watch}"; do
  for p in $part; do
    case "$p" in
      drift) drift ;;
      shadow) shadow ;;
      identical) scenario identical identical ;;
      nan) scenario nan nan ;;
      watch) scenario watch late ;;
      *) echo "rollout-drill: unknown part $p (drift, shadow, identical, nan or watch)" >&2; exit 2 ;;
    esac
  done
done
