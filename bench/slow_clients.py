#!/usr/bin/env python3
"""Slow clients against a KServe V2 REST server, and what they cost it.

CLIENTS connections each send a request line, then one header byte every
INTERVAL seconds, for SECONDS seconds; none of them ever finishes its head.
They connect without waiting: a connection the server does not accept
stays "connecting" (in the listening socket's queue, or its handshake
dropped and retried by the kernel once that queue is full).
Once a second the script reads the server's descriptors (/proc/PID/fd) and
resident memory (VmRSS), counts the slow connections the server has
closed, and sends one readiness request on a new connection (a normal
client), timing it. It prints one line a second and a summary.

    python3 bench/slow_clients.py --url http://127.0.0.1:8310 --pid PID
"""

import argparse
import json
import os
import resource
import select
import socket
import time
import urllib.parse


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def probe(host, port, timeout):
    """One readiness request on a new connection: (answered 200, seconds)."""
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            answer = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                answer += chunk
        return answer.startswith(b"HTTP/1.1 200"), time.monotonic() - started
    except OSError:
        return False, time.monotonic() - started


def closed(s):
    """Whether the server closed the slow connection s (non-blocking)."""
    try:
        data = s.recv(4096)
        return not data or closed(s)
    except BlockingIOError:
        return False
    except OSError:
        return True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--clients", type=int, default=2000)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--probe-timeout", type=float, default=5.0)
    p.add_argument("--json")
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    url = urllib.parse.urlparse(a.url)
    host, port = url.hostname, url.port

    baseline = {"fds": fds(a.pid), "rss_mib": rss_mib(a.pid)}
    print(f"baseline: {baseline['fds']} descriptors, {baseline['rss_mib']:.1f} MiB")
    # Connected without waiting, a hundred every tenth of a second: once
    # the server stops accepting and its listening socket's queue is full,
    # the kernel drops new handshakes and retries them, and a connect would
    # block for seconds.
    slow, state = [], []
    start = time.monotonic()
    next_byte = start + a.interval
    next_sample = start
    samples = []
    print(" t(s)  connecting  open  server-fds  rss(MiB)  probe")
    while time.monotonic() - start < a.seconds:
        now = time.monotonic()
        for _ in range(min(100, a.clients - len(slow))):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex((host, port))
            slow.append(s)
            state.append("connecting")
        trickle = now >= next_byte
        if trickle:
            next_byte += a.interval
        waiting = select.poll()
        for i, s in enumerate(slow):
            if state[i] == "connecting":
                waiting.register(s, select.POLLOUT)
        writable = {fd for fd, _ in waiting.poll(0)}
        for i, s in enumerate(slow):
            if state[i] == "connecting" and s.fileno() in writable:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                    state[i] = "refused"
                    continue
                try:
                    s.send(b"GET /v2/health/ready HTTP/1.1\r\n")
                    state[i] = "open"
                except OSError:
                    state[i] = "closed"
            elif state[i] == "open":
                if closed(s):
                    state[i] = "closed"
                elif trickle:
                    try:
                        s.send(b"x")
                    except BlockingIOError:
                        pass
                    except OSError:
                        state[i] = "closed"
        if now >= next_sample:
            next_sample += 1.0
            ok, took = probe(host, port, a.probe_timeout)
            sample = {
                "t": round(now - start, 1),
                "connecting": state.count("connecting"),
                "open": state.count("open"),
                "fds": fds(a.pid),
                "rss_mib": round(rss_mib(a.pid), 1),
                "probe_ok": ok,
                "probe_s": round(took, 3),
            }
            samples.append(sample)
            print(f"{sample['t']:5.1f} {sample['connecting']:11d} {sample['open']:5d} {sample['fds']:11d} "
                  f"{sample['rss_mib']:9.1f}  {'200' if ok else 'FAIL'} {took * 1000:.0f} ms")
        time.sleep(max(0.0, 0.1 - (time.monotonic() - now)))
    for s in slow:
        s.close()
    peak_fds = max(s["fds"] for s in samples)
    peak_rss = max(s["rss_mib"] for s in samples)
    failed = sum(1 for s in samples if not s["probe_ok"])
    summary = {
        "clients": a.clients,
        "interval_s": a.interval,
        "seconds": a.seconds,
        "baseline": baseline,
        "peak_fds": peak_fds,
        "peak_rss_mib": peak_rss,
        "end": samples[-1],
        "closed_by_server": state.count("closed"),
        "never_connected": state.count("connecting") + state.count("refused"),
        "probes": len(samples),
        "probes_failed": failed,
        "samples": samples,
    }
    print(f"summary: {a.clients} slow clients; server descriptors {baseline['fds']} -> peak {peak_fds} "
          f"-> {samples[-1]['fds']} at the end; RSS {baseline['rss_mib']:.1f} -> peak {peak_rss:.1f} -> "
          f"{samples[-1]['rss_mib']:.1f} MiB; {state.count('closed')} closed by the server, "
          f"{state.count('connecting') + state.count('refused')} never connected; "
          f"{failed} of {len(samples)} probes failed")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
