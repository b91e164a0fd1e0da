#!/usr/bin/env python3
"""The request flood: what large JSON requests cost a KServe V2 server's
memory, and whether it keeps answering small requests meanwhile. Run by
bench/request-flood.sh, which starts baton on the MLP; standard library only.

    python3 bench/request_flood.py --url http://127.0.0.1:8300 --pid PID \\
        [--model mlp] [--width 256] [--mib 60] [--clients 32] [--json OUT]

Phases, each reported:

  quiet   small requests (batch 1, JSON) one after another on one
          connection for --quiet seconds: their latency with nothing else.
  one     one large JSON request (about --mib MiB, FP32 rows of --width):
          the rise of the server's peak RSS (VmHWM, reset just before, so
          the rise is over the RSS just before), against the body plus
          twice its tensor bytes (the decoded tensor and the engine's copy).
  flood   --clients such requests at once, while the small requests go on:
          the peak RSS rise, the most request memory the server reported
          (baton_request_memory_bytes, read every 20 ms), the answers by
          status, and the small requests' latency percentiles meanwhile.

The large requests exceed the MLP's max_batch_size (64), so they are
answered 400: what is measured is what a request costs before the model
runs, which is what admission control bounds (a server that checks the
header first refuses them before decoding their data; one that decodes
first pays for the decoding). With the model's max_batch_size raised
(request-flood.sh's MAX_BATCH) they are decoded and run instead.
"""

import argparse
import http.client
import json
import random
import sys
import threading
import time
from urllib.parse import urlparse

MIB = 1 << 20


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid):
    """Resets VmHWM to the present RSS (Linux 4.0+); returns that RSS in bytes."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return status_kb(pid, "VmRSS") * 1024


def peak(pid):
    return status_kb(pid, "VmHWM") * 1024


def small_body(width):
    rng = random.Random(1)
    data = [round(rng.uniform(-1, 1), 6) for _ in range(width)]
    return json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, width], "data": data}]}).encode()


def large_body(width, mib):
    """A flat FP32 JSON request of about `mib` MiB; returns (body, rows)."""
    rng = random.Random(2)
    rows_text = [",".join(f"{rng.uniform(-1, 1):.6f}" for _ in range(width)) for _ in range(64)]
    per_row = sum(len(r) + 1 for r in rows_text) / len(rows_text)
    rows = int(mib * MIB / per_row)
    data = ",".join(rows_text[i % 64] for i in range(rows))
    head = '{"inputs":[{"name":"input","datatype":"FP32","shape":[%d,%d],"data":[' % (rows, width)
    return (head + data + "]}]}").encode(), rows


class Client:
    def __init__(self, url, timeout=600):
        u = urlparse(url)
        self.host, self.port, self.timeout = u.hostname, u.port, timeout
        self.conn = None

    def post(self, path, body):
        """Returns (status, seconds); reconnects when the server closed."""
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            started = time.perf_counter()
            try:
                self.conn.request("POST", path, body, {"content-type": "application/json"})
                response = self.conn.getresponse()
                response.read()
                took = time.perf_counter() - started
                if response.getheader("connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return response.status, took
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                self.conn.close()
                self.conn = None
                if attempt:
                    return f"error: {e}", time.perf_counter() - started
        raise AssertionError("unreachable")

    def get(self, path):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        conn.request("GET", path)
        text = conn.getresponse().read().decode()
        conn.close()
        return text


def percentiles(values):
    if not values:
        return {}
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]
    return {"n": len(s), "p50_ms": pick(0.5) * 1e3, "p90_ms": pick(0.9) * 1e3, "p99_ms": pick(0.99) * 1e3,
            "max_ms": s[-1] * 1e3}


def prober(url, path, body, stop, out):
    """Small requests one after another until `stop` is set."""
    client = Client(url)
    while not stop.is_set():
        status, took = client.post(path, body)
        out.append((status, took))


def memory_gauge(url, stop, out):
    client = Client(url)
    while not stop.is_set():
        for line in client.get("/metrics").splitlines():
            if line.startswith("baton_request_memory_bytes "):
                out.append(float(line.split()[1]))
        time.sleep(0.02)


def fmt(p):
    if not p:
        return "no requests"
    return (f"n={p['n']}  p50 {p['p50_ms']:.2f} ms  p90 {p['p90_ms']:.2f} ms  p99 {p['p99_ms']:.2f} ms  "
            f"max {p['max_ms']:.1f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--mib", type=float, default=60)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--quiet", type=float, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    path = f"/v2/models/{args.model}/infer"
    small = small_body(args.width)
    big, rows = large_body(args.width, args.mib)
    tensor = rows * args.width * 4
    report = {"body_bytes": len(big), "rows": rows, "tensor_bytes": tensor, "clients": args.clients}
    print(f"Large request: {len(big) / MIB:.1f} MiB of JSON, {rows} rows x {args.width} FP32 = "
          f"{tensor / MIB:.1f} MiB of tensor; reference rise (body + 2 x tensor) "
          f"{(len(big) + 2 * tensor) / MIB:.1f} MiB.")

    warm = Client(args.url)
    for _ in range(200):
        status, _ = warm.post(path, small)
        assert status == 200, f"a small request failed: {status}"

    # quiet
    lat = []
    stop = threading.Event()
    t = threading.Thread(target=prober, args=(args.url, path, small, stop, lat))
    t.start()
    time.sleep(args.quiet)
    stop.set()
    t.join()
    report["quiet"] = percentiles([s for st, s in lat if st == 200])
    print(f"quiet: small requests alone: {fmt(report['quiet'])}")

    # one
    before = reset_peak(args.pid)
    status, took = Client(args.url).post(path, big)
    rise = peak(args.pid) - before
    report["one"] = {"status": status, "seconds": took, "rss_before": before, "peak_rise": rise}
    print(f"one: status {status} in {took:.2f} s; peak RSS rose {rise / MIB:.1f} MiB over {before / MIB:.1f} MiB "
          f"({rise / (len(big) + 2 * tensor):.2f}x body + 2 x tensor)")

    # flood
    time.sleep(1)
    before = reset_peak(args.pid)
    lat, gauge, answers = [], [], []
    stop = threading.Event()
    side = [threading.Thread(target=prober, args=(args.url, path, small, stop, lat)),
            threading.Thread(target=memory_gauge, args=(args.url, stop, gauge))]
    for s in side:
        s.start()
    time.sleep(0.5)
    barrier = threading.Barrier(args.clients)

    def large():
        c = Client(args.url)
        barrier.wait()
        answers.append(c.post(path, big))

    started = time.perf_counter()
    flood = [threading.Thread(target=large) for _ in range(args.clients)]
    for f in flood:
        f.start()
    for f in flood:
        f.join()
    elapsed = time.perf_counter() - started
    stop.set()
    for s in side:
        s.join()
    rise = peak(args.pid) - before
    by_status = {}
    for st, _ in answers:
        by_status[str(st)] = by_status.get(str(st), 0) + 1
    small_failed = [st for st, _ in lat if st != 200]
    report["flood"] = {
        "seconds": elapsed, "rss_before": before, "peak_rise": rise, "answers": by_status,
        "max_request_memory": max(gauge) if gauge else None,
        "small": percentiles([s for st, s in lat if st == 200]), "small_failed": len(small_failed),
    }
    print(f"flood: {args.clients} large requests at once, answered in {elapsed:.1f} s: {by_status}")
    print(f"flood: peak RSS rose {rise / MIB:.1f} MiB over {before / MIB:.1f} MiB; the most request memory "
          f"reported: {(max(gauge) if gauge else 0) / MIB:.1f} MiB")
    print(f"flood: small requests meanwhile: {fmt(report['flood']['small'])}; {len(small_failed)} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
