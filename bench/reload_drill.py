#!/usr/bin/env python3
"""Reload drill: light V2 inference load on one model of a server on
127.0.0.1 while the same or another model is (re)loaded through an HTTP
call, and what the clients saw: failed requests, the slowest request, the
longest time with no response completed, and which versions answered.

Standard library only; runs with any python3.

    python3 bench/reload_drill.py --port 8100 --model mlp --shape 1,256 \
        --post /v2/repository/models/mlp/load [--prepare 'shell command'] \
        [--repeat 3] [--interval 3] [--clients 2] [--rate 100] [--lead 2] [--tail 2]

Each round: `--prepare` (a shell command, e.g. copying a new version folder
into the repository) runs, then the POST is sent and timed. Rounds are
--interval seconds apart; load runs from --lead seconds before the first
round to --tail seconds after the last, then stops (bounded). Only
127.0.0.1 is ever contacted.
"""

import argparse
import http.client
import json
import random
import subprocess
import threading
import time
from collections import Counter


def body_for(model, shape, seed):
    rng = random.Random(seed)
    n = 1
    for d in shape:
        n *= d
    return json.dumps(
        {"inputs": [{"name": "input", "shape": shape, "datatype": "FP32", "data": [rng.uniform(-1, 1) for _ in range(n)]}]}
    ).encode()


class Client(threading.Thread):
    def __init__(self, port, path, body, rate, stop, t0, log):
        super().__init__(daemon=True)
        self.port, self.path, self.body, self.rate, self.stop, self.t0, self.log = port, path, body, rate, stop, t0, log

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def run(self):
        c = self.conn()
        period = 1.0 / self.rate if self.rate > 0 else 0.0
        nxt = time.perf_counter()
        while not self.stop.is_set():
            start = time.perf_counter()
            status, version, err = 0, None, None
            try:
                c.request("POST", self.path, self.body, {"Content-Type": "application/json"})
                r = c.getresponse()
                data = r.read()
                status = r.status
                if status == 200:
                    version = json.loads(data).get("model_version")
                else:
                    err = data[:200].decode(errors="replace")
            except Exception as e:  # connection reset, timeout, ...
                err = f"{type(e).__name__}: {e}"
                c.close()
                c = self.conn()
            end = time.perf_counter()
            self.log.append((start - self.t0, end - self.t0, status, version, err))
            if period:
                nxt += period
                delay = nxt - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                else:
                    nxt = time.perf_counter()
        c.close()


def post(port, path, body=b"{}"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data[:300].decode(errors="replace")


def summarize(log, lo, hi):
    """Requests that started or ended inside [lo, hi]."""
    rows = [x for x in log if x[1] >= lo and x[0] <= hi]
    fails = [x for x in rows if x[2] != 200]
    lat = sorted((x[1] - x[0]) * 1000 for x in rows)
    ends = sorted(x[1] for x in log if lo - 1 <= x[1] <= hi + 1)
    gap = max((b - a for a, b in zip(ends, ends[1:])), default=0.0) * 1000
    return {
        "requests": len(rows),
        "failed": len(fails),
        "errors": Counter(f"{x[2]} {x[4]}"[:160] for x in fails).most_common(3),
        "max_ms": round(lat[-1], 1) if lat else None,
        "p50_ms": round(lat[len(lat) // 2], 2) if lat else None,
        "longest_gap_ms": round(gap, 1),
        "versions": dict(Counter(x[3] for x in rows if x[2] == 200)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--shape", default="1,256")
    ap.add_argument("--post", required=True, help="path to POST each round, e.g. /v2/repository/models/mlp/load")
    ap.add_argument("--post-body", default="{}")
    ap.add_argument("--prepare", default="", help="shell command run before each round's POST; {round} is replaced")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--rate", type=float, default=100.0, help="requests/s per client (0 = back to back)")
    ap.add_argument("--lead", type=float, default=2.0)
    ap.add_argument("--tail", type=float, default=2.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.repeat > 50 or args.interval * args.repeat > 600:
        ap.error("keep drills short: --repeat <= 50 and --repeat * --interval <= 600 s")

    shape = [int(s) for s in args.shape.split(",")]
    path = f"/v2/models/{args.model}/infer"
    stop = threading.Event()
    t0 = time.perf_counter()
    log = []
    clients = [Client(args.port, path, body_for(args.model, shape, i), args.rate, stop, t0, log) for i in range(args.clients)]
    for c in clients:
        c.start()
    rounds = []
    time.sleep(args.lead)
    try:
        for i in range(args.repeat):
            if i:
                time.sleep(max(0.0, args.interval - (rounds[-1]["call_end"] - rounds[-1]["call_start"])))
            if args.prepare:
                subprocess.run(args.prepare.replace("{round}", str(i + 1)), shell=True, check=True)
            a = time.perf_counter() - t0
            status, text = post(args.port, args.post, args.post_body.encode())
            b = time.perf_counter() - t0
            rounds.append({"round": i + 1, "call_start": a, "call_end": b, "call_ms": round((b - a) * 1000, 1),
                           "status": status, "answer": text[:120]})
        time.sleep(args.tail)
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=35)

    total = summarize(log, 0, 1e9)
    for r in rounds:
        r.update(summarize(log, r["call_start"], r["call_end"] + 0.5))
    baseline = summarize(log, 0, args.lead - 0.1)
    result = {"total": total, "baseline_before_first_round": baseline, "rounds": rounds}
    if args.json:
        print(json.dumps(result))
        return
    print(f"total: {total['requests']} requests, {total['failed']} failed, versions {total['versions']}")
    print(f"before the first round: p50 {baseline['p50_ms']} ms, max {baseline['max_ms']} ms, longest gap {baseline['longest_gap_ms']} ms")
    for r in rounds:
        print(
            f"round {r['round']}: POST {args.post} -> {r['status']} in {r['call_ms']} ms; "
            f"during it (+0.5 s): {r['requests']} requests, {r['failed']} failed, max {r['max_ms']} ms, "
            f"longest gap {r['longest_gap_ms']} ms, versions {r['versions']}"
        )
        for e, n in r["errors"]:
            print(f"    {n} x {e}")


if __name__ == "__main__":
    main()
