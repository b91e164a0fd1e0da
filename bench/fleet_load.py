#!/usr/bin/env python3
"""Load across a fleet of baton replicas, for bench/fleet-skew.sh; standard
library only.

    python3 bench/fleet_load.py --ports FILE --out OUT.json [--threads 4] [--model mlp]

Sends small KServe V2 JSON inference requests (batch 1, 256 FP32) to every
replica listed in FILE (one HTTP port a line, all on 127.0.0.1), round
robin, from --threads threads, each with one keep-alive connection per
replica, until SIGTERM or SIGINT. Counts the requests, the failures (an
answer other than 200, or a connection error or timeout) and the
`model_version` of each answer, and notes every change of version a
replica answers with: when a thread saw replica R answer with version V
after an answer with another one (the send and receive times of the first
such answer, wall clock). On stop it writes OUT.json:

  requests, failed, failures (by kind), versions (answers per version),
  per_replica (answers per replica port), seconds, rate_per_s,
  latency_ms (p50, p99, max), transitions ([port, thread, sent, received,
  from, to], wall-clock seconds).
"""

import argparse
import http.client
import json
import math
import signal
import threading
import time

stop = threading.Event()


def worker(index, ports, body, path, timeout, out):
    """One thread: round robin over `ports` from its own offset."""
    conns = {}
    last = {}
    counts = {"requests": 0, "failed": 0, "failures": {}, "versions": {}, "per_replica": {}}
    latencies = []
    transitions = []
    n = index
    while not stop.is_set():
        port = ports[n % len(ports)]
        n += 1
        conn = conns.get(port)
        if conn is None:
            conn = conns[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        sent = time.time()
        kind = None
        version = None
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                kind = f"http_{response.status}"
            else:
                version = json.loads(data).get("model_version")
                if version is None:
                    kind = "no_model_version"
        except (OSError, http.client.HTTPException, ValueError) as error:
            kind = type(error).__name__
            conn.close()
            conns.pop(port, None)
        received = time.time()
        counts["requests"] += 1
        counts["per_replica"][port] = counts["per_replica"].get(port, 0) + 1
        if kind is not None:
            counts["failed"] += 1
            counts["failures"][kind] = counts["failures"].get(kind, 0) + 1
            continue
        latencies.append(received - sent)
        counts["versions"][version] = counts["versions"].get(version, 0) + 1
        before = last.get(port)
        if before != version:
            last[port] = version
            if before is not None:
                transitions.append([port, index, sent, received, before, version])
    for conn in conns.values():
        conn.close()
    out[index] = (counts, latencies, transitions)


def percentile(sorted_values, p):
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ports", required=True, help="a file with one replica HTTP port a line")
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args()

    with open(args.ports) as f:
        ports = [int(line) for line in f if line.strip()]
    values = [round(0.01 * (i % 100), 2) for i in range(args.width)]
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, args.width], "datatype": "FP32", "data": values}]}
    ).encode()
    path = f"/v2/models/{args.model}/infer"
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    out = {}
    started = time.time()
    threads = [
        threading.Thread(target=worker, args=(i, ports, body, path, args.timeout, out), daemon=True)
        for i in range(args.threads)
    ]
    for t in threads:
        t.start()
    print(f"fleet_load: {args.threads} threads over {len(ports)} replicas", flush=True)
    while not stop.is_set():
        stop.wait(0.5)
    for t in threads:
        t.join(args.timeout + 5)
    seconds = time.time() - started

    total = {"requests": 0, "failed": 0, "failures": {}, "versions": {}, "per_replica": {}}
    latencies = []
    transitions = []
    for counts, lat, trans in out.values():
        total["requests"] += counts["requests"]
        total["failed"] += counts["failed"]
        for key in ("failures", "versions", "per_replica"):
            for k, v in counts[key].items():
                total[key][str(k)] = total[key].get(str(k), 0) + v
        latencies.extend(lat)
        transitions.extend(trans)
    latencies.sort()
    ms = lambda v: None if v is None else round(v * 1000, 3)
    report = dict(
        total,
        seconds=round(seconds, 3),
        rate_per_s=round(total["requests"] / seconds, 1) if seconds > 0 else 0,
        latency_ms={
            "p50": ms(percentile(latencies, 50)),
            "p99": ms(percentile(latencies, 99)),
            "max": ms(latencies[-1] if latencies else None),
        },
        threads=args.threads,
        replicas=len(ports),
        transitions=sorted(transitions, key=lambda t: t[3]),
    )
    with open(args.out, "w") as f:
        json.dump(report, f)
    print(
        f"fleet_load: {total['requests']} requests, {total['failed']} failed, versions {total['versions']}",
        flush=True,
    )


if __name__ == "__main__":
    main()
