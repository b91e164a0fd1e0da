#!/usr/bin/env python3
"""Raw-engine baseline: the MLP called directly through onnxruntime's Python
API in a loop, batch 1, one session with intra_op_num_threads=1 (as baton's
sessions), no server and no HTTP. Reports calls/s and latency percentiles.

    .baton/bench-venv-tools/bin/python bench/raw_engine.py \
        [--model .baton/bench/models/baton/mlp/1/model.onnx] [--seconds 10] [--batch 1]

Bounded: runs --warmup calls, then calls for --seconds (default 10) or
--max-calls, whichever ends first. Each call feeds a fresh-looking input
(one of 64 seeded random rows) so no result is cached anywhere.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / ".baton/bench/models/baton/mlp/1/model.onnx")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="intra_op_num_threads (default 1)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--max-calls", type=int, default=2_000_000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    args = ap.parse_args()

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(str(args.model), sess_options=opts, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    out_name = sess.get_outputs()[0].name
    shape = [args.batch] + [d if isinstance(d, int) else 1 for d in inp.shape[1:]]
    rng = np.random.default_rng(7)
    rows = [rng.standard_normal(shape, dtype=np.float32) for _ in range(64)]

    for i in range(args.warmup):
        sess.run([out_name], {inp.name: rows[i % 64]})

    lat = np.empty(args.max_calls, dtype=np.float64)
    n = 0
    run, name, clock = sess.run, inp.name, time.perf_counter
    start = clock()
    end = start + args.seconds
    while n < args.max_calls:
        t0 = clock()
        run([out_name], {name: rows[n & 63]})
        t1 = clock()
        lat[n] = t1 - t0
        n += 1
        if t1 >= end:
            break
    elapsed = clock() - start
    lat = lat[:n] * 1e6
    result = {
        "model": str(args.model),
        "onnxruntime": ort.__version__,
        "batch": args.batch,
        "threads": args.threads,
        "calls": n,
        "seconds": round(elapsed, 3),
        "calls_per_s": round(n / elapsed, 1),
        "p50_us": round(float(np.percentile(lat, 50)), 1),
        "p90_us": round(float(np.percentile(lat, 90)), 1),
        "p99_us": round(float(np.percentile(lat, 99)), 1),
        "max_us": round(float(lat.max()), 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{args.model.name} batch {args.batch}, {args.threads} intra-op thread(s), onnxruntime {ort.__version__}: "
            f"{result['calls']} calls in {result['seconds']} s = {result['calls_per_s']} calls/s; "
            f"p50 {result['p50_us']} us, p90 {result['p90_us']} us, p99 {result['p99_us']} us, max {result['max_us']} us"
        )


if __name__ == "__main__":
    main()
