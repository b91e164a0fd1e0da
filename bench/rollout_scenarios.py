#!/usr/bin/env python3
"""Rollout scenarios against a running baton, with the default guards on.

    python3 bench/rollout_scenarios.py SCENARIO --url URL --version V [--out FILE]

Drives the benchmark MLP (input [1, 256]) over KServe V2 REST with JSON
tensors from WORKERS threads (default 4), each input drawn at random per
request (uniform in [-1, 1), seeded), while a canary of version V runs
inside the server, and reports what the rollout decided and when:

  identical  V has the weights of the stable version. Steps 10, 50, 100,
             3 s windows, guards {min_samples 100} and baton's defaults
             (error rate +0.01, p99 ratio 1.5): the p99 ratio of every
             judged window, and whether it was promoted.
  nan        V answers NaN for inputs whose first element is below -0.8
             (one request in ten), the same as stable otherwise. Steps 50,
             100, 2 s windows, guards {min_samples 100, max_rel_l2 0.05}
             and the defaults: rolled back, and the time from the failing
             window's end to the decision and to the candidate's last
             answer.
  watch      V answers as stable does for inputs whose first element is at
             most 0.9, and drifts far above it. Until the promotion the
             clients send only such inputs; once V is promoted (the watch
             begins), one request in five has a first element above 0.9: a
             regression that shows only after promotion. Steps 50, 100, 2 s
             windows, watch 60 s, guards as for nan: rolled back inside the
             watch, with the same times.

Every request's start, latency, status and answering version is kept; the
report (JSON) holds the rollout's final status, the decisions and the
figures above. Stops by itself: at the rollout's end, or after LIMIT
seconds (default 120).
"""

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time

SCENARIOS = {
    "identical": {"steps": [10, 50, 100], "interval_ms": 3000, "watch_ms": 0, "guards": {"min_samples": 100}},
    "nan": {
        "steps": [50, 100],
        "interval_ms": 2000,
        "watch_ms": 0,
        "guards": {"min_samples": 100, "max_rel_l2": 0.05},
    },
    "watch": {
        "steps": [50, 100],
        "interval_ms": 2000,
        "watch_ms": 60000,
        "guards": {"min_samples": 100, "max_rel_l2": 0.05},
    },
}
ENDED = ("promoted", "rolled_back", "aborted")


class Load:
    """Clients sending requests until told to stop."""

    def __init__(self, host, port, workers, seed):
        self.host, self.port = host, port
        self.stop = threading.Event()
        self.after_promotion = threading.Event()
        self.lock = threading.Lock()
        self.records = []  # (start_s, latency_ms, status, version)
        self.threads = [threading.Thread(target=self.run, args=(seed + i,), daemon=True) for i in range(workers)]

    def start(self):
        for t in self.threads:
            t.start()

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join()

    def run(self, seed):
        rng = random.Random(seed)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        while not self.stop.is_set():
            data = [rng.uniform(-1.0, 1.0) for _ in range(256)]
            if self.scenario == "watch":
                # Before the promotion: inputs where both versions agree.
                data[0] = rng.uniform(-1.0, 0.9)
                if self.after_promotion.is_set() and rng.random() < 0.2:
                    data[0] = rng.uniform(0.9001, 1.0)
            body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 256], "data": data}]})
            start = time.time()
            try:
                conn.request("POST", "/v2/models/mlp/infer", body, {"content-type": "application/json"})
                response = conn.getresponse()
                text = response.read()
                status = response.status
                version = json.loads(text).get("model_version") if status == 200 else None
            except (OSError, http.client.HTTPException, ValueError):
                status, version = 0, None
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            with self.lock:
                self.records.append((start, (time.time() - start) * 1000, status, version))


def call(host, port, method, path, body=None):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request(method, path, json.dumps(body) if body is not None else None, {"content-type": "application/json"})
    response = conn.getresponse()
    text = response.read()
    conn.close()
    return response.status, json.loads(text) if text else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--url", default="http://127.0.0.1:8300")
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--limit", type=float, default=120)
    p.add_argument("--warmup", type=float, default=3)
    p.add_argument("--out")
    p.add_argument("--plan", help="JSON fields that replace the scenario's plan's (an experiment)")
    args = p.parse_args()
    host, port = args.url.split("//")[1].split(":")
    port = int(port)
    plan = dict(SCENARIOS[args.scenario], version=args.version)
    plan.update(json.loads(args.plan or "{}"))

    load = Load(host, port, args.workers, seed=20261204)
    load.scenario = args.scenario
    load.start()
    time.sleep(args.warmup)
    status, answer = call(host, port, "POST", "/baton/v1/models/mlp/rollout", plan)
    if status != 200:
        load.join()
        sys.exit(f"rollout_scenarios: the start was refused ({status}): {answer}")
    started = time.time()
    final = None
    while time.time() - started < args.limit:
        _, final = call(host, port, "GET", "/baton/v1/models/mlp/rollout")
        phase = final["rollout"]["phase"]
        if phase == "watching":
            load.after_promotion.set()
        if phase in ENDED:
            break
        time.sleep(0.05)
    time.sleep(0.5)  # answers in flight at the end come back
    load.join()
    if final["rollout"]["phase"] not in ENDED:
        call(host, port, "POST", "/baton/v1/models/mlp/rollout/abort", {})
        _, final = call(host, port, "GET", "/baton/v1/models/mlp/rollout")

    rollout = final["rollout"]
    decisions = rollout["decisions"]
    records = load.records
    failed = sum(1 for r in records if r[2] != 200)
    judged = []
    for d in decisions:
        verdict = d.get("verdict")
        if not verdict:
            continue
        p99 = next((c for c in verdict["checks"] if c["guard"] == "p99_ratio"), None)
        judged.append({
            "action": d["action"],
            "weight_percent": d["weight_percent"],
            "p99_ratio": p99 and p99["value"],
            "p99_samples": p99 and p99["samples"],
            "window_end_ms": d.get("window_end_ms"),
            "decided_after_window_end_ms": d["at_ms"] - d["window_end_ms"] if d.get("window_end_ms") else None,
            "reason": verdict["reason"],
        })
    report = {"scenario": args.scenario, "plan": plan, "phase": rollout["phase"], "requests": len(records),
              "failed": failed, "judged": judged, "decisions": decisions}
    last = decisions[-1] if decisions else {}
    if last.get("action") == "rolled_back" and last.get("window_end_ms"):
        end_s = last["window_end_ms"] / 1000
        # The candidate's last answer: a request the rolled-back version answered.
        candidate = str(args.version)
        answered = [r[0] + r[1] / 1000 for r in records if r[3] == candidate]
        promoted_at = next((d["at_ms"] / 1000 for d in decisions if d["action"] == "promoted"), None)
        report["rollback"] = {
            "decided_ms": last["at_ms"] - last["window_end_ms"],
            "last_candidate_answer_ms": (max(answered) - end_s) * 1000 if answered else None,
            "in_watch": promoted_at is not None,
            "seconds_after_promotion": last["at_ms"] / 1000 - promoted_at if promoted_at else None,
        }
    latencies = [r[1] for r in records if r[2] == 200]
    report["p99_ms"] = statistics.quantiles(latencies, n=100)[98] if len(latencies) > 100 else None
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(f"{args.scenario}: {rollout['phase']}; {len(records)} requests, {failed} failed; client p99 "
          f"{report['p99_ms'] and round(report['p99_ms'], 2)} ms")
    for j in judged:
        ratio = "-" if j["p99_ratio"] is None else f"{j['p99_ratio']:.3f}"
        print(f"  {j['action']:>11} at {j['weight_percent']:g}%: p99 ratio {ratio} over {j['p99_samples']} runs; "
              f"decided {j['decided_after_window_end_ms']} ms after the window's end; {j['reason'][:160]}")
    if "rollback" in report:
        r = report["rollback"]
        last_answer = r["last_candidate_answer_ms"]
        print(f"  rolled back {'inside the watch, ' + format(r['seconds_after_promotion'], '.1f') + ' s after promotion' if r['in_watch'] else 'before promotion'}:"
              f" decided {r['decided_ms']} ms after the failing window's end; the candidate's last answer "
              f"{'-' if last_answer is None else format(last_answer, '.1f')} ms after it")


if __name__ == "__main__":
    main()
