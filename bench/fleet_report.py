#!/usr/bin/env python3
"""The report of bench/fleet-skew.sh: reads what it left in its work dir
and writes one JSON report, printing a summary with the targets; standard
library only.

    python3 bench/fleet_report.py --work .baton/bench/fleet --out OUT.json \\
        [--clk-tck 100] [--replicas 32] [--rollouts 20]

Per rollout: the coordinator's exit code, wall and CPU time (GNU time), the
record's switch summary (skew, first and last switch after the commit
write, replicas that reported), the prepare phase (start to the commit
write: commit_us - started_ms), the reason when it did not promote, and
how many replicas did not serve the outcome right after. For the fleet
part also what the load generator saw: requests, failures, versions, and
per rollout when each replica first answered with the new version (the
client's view of the switch, as fine as one replica's share of the
request rate) and whether any replica answered with the old version again
after that (a flap).
"""

import argparse
import glob
import json
import math
import os
import re
import statistics

LINE = re.compile(r"(\d+) replicas switched within ([\d.]+) ms of each other, ([-\d.]+)\D+([-\d.]+) ms after")


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def pct(values, p):
    """Nearest rank: with 20 values, p99 is the largest."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[max(0, math.ceil(p / 100 * len(values)) - 1)]


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "n": len(values),
        "p50": statistics.median(values),
        "p99": pct(values, 99),
        "max": max(values),
        "min": min(values),
    }


def by_lead(ok):
    """Per switch lead: the skew of the switches, and of the commit's
    delivery (what a switch on delivery would have had)."""
    leads = {}
    for r in ok:
        if r.get("switch"):
            leads.setdefault(r.get("lead") or "?", []).append(r["switch"])
    return {
        lead: {
            "rollouts": len(s),
            "skew_ms": stats([x["skew_ms"] for x in s]),
            "last_switch_ms": stats([x["last_ms"] for x in s]),
            "delivery_skew_ms": stats([x.get("delivery_skew_ms") for x in s if x.get("delivery_skew_ms") is not None]),
            "last_seen_ms": stats([x.get("last_seen_ms") for x in s if x.get("last_seen_ms") is not None]),
        }
        for lead, s in sorted(leads.items())
    }


def rollout(prefix, model):
    """One rollout's files: PREFIX.{txt,time,rc,status.json}."""
    text = read(prefix + ".txt", "")
    times = (read(prefix + ".time", "") or "").strip().splitlines()
    wall = user = system = None
    if times:
        try:
            wall, user, system = (float(x) for x in times[-1].split())
        except ValueError:
            pass
    rc = int((read(prefix + ".rc", "") or "-1").strip() or -1)
    out = {"rc": rc, "wall_s": wall, "cpu_s": None if user is None else round(user + system, 3)}
    out["lead"] = (read(prefix + ".lead", "") or "").strip() or None
    match = LINE.search(text)
    if match:
        out["line"] = {
            "replicas": int(match[1]),
            "skew_ms": float(match[2]),
            "first_ms": float(match[3]),
            "last_ms": float(match[4]),
        }
    ended = [line for line in text.splitlines() if "the rollout ended" in line]
    if ended:
        out["error"] = ended[-1].strip()
    try:
        status = json.loads(read(prefix + ".status.json", "") or "null")
    except ValueError:
        status = None
    if not status:
        return out
    record = next((r for r in status.get("rollouts", []) if r.get("model") == model), None)
    if record:
        out.update(
            version=record["version"],
            phase=record["phase"],
            participants=len(record.get("participants", [])),
            members=len(record.get("members", [])),
            reason=record.get("reason"),
            switch=record.get("switch"),
            started_ms=record.get("started_ms"),
            commit_us=record.get("commit_us"),
        )
        if record.get("commit_us") and record.get("started_ms"):
            out["prepare_ms"] = round(record["commit_us"] / 1000 - record["started_ms"], 1)
        out["decisions"] = [(d["action"], d["at_ms"], d["message"]) for d in record.get("decisions", [])]
        acks = status.get("acks", {}).get(model, {})
        prep = [a["prepare_ms"] for a in acks.values() if a.get("ok")]
        out["replica_prepare_ms"] = stats(prep)
        outcome = record["version"] if record["phase"] == "promoted" else record.get("from")
        off = []
        for replica in status.get("replicas", []):
            serving = replica.get("models", {}).get(model, {})
            if serving.get("stable") != outcome:
                off.append(f"{replica['id']}: stable {serving.get('stable')} candidate {serving.get('candidate')}")
        out["replicas_live"] = len(status.get("replicas", []))
        delays = []
        for line in (read(prefix + ".switched", "") or "").splitlines():
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if report.get("rollout") == record["id"] and report.get("phase") == "promoted":
                delays.append(report["delay_us"] / 1000)
        if delays:
            out["switch_delays_ms"] = {
                "n": len(delays),
                **{f"p{p}": round(pct(delays, p), 2) for p in (10, 50, 90, 100)},
            }
        out["replicas_not_on_outcome"] = off
    return out


def client_view(r, transitions, next_start_ms):
    """When each replica first answered with the rollout's version, from
    the load generator's transitions, relative to the commit write."""
    if r.get("phase") != "promoted" or not r.get("commit_us"):
        return None
    commit = r["commit_us"] / 1e6
    lo = r["started_ms"] / 1000
    hi = next_start_ms / 1000 if next_start_ms else float("inf")
    new = str(r["version"])
    first = {}
    flaps = 0
    for port, _thread, sent, received, before, to in transitions:
        if not lo <= sent < hi:
            continue
        if to == new:
            first[port] = min(first.get(port, received), received)
        elif before == new:
            flaps += 1
    if not first:
        return {"replicas": 0, "flaps": flaps}
    times = sorted(first.values())
    return {
        "replicas": len(first),
        "first_ms": round((times[0] - commit) * 1000, 1),
        "last_ms": round((times[-1] - commit) * 1000, 1),
        "spread_ms": round((times[-1] - times[0]) * 1000, 1),
        "flaps": flaps,
    }


def etcd_warnings(path):
    """etcd's warning and error lines, counted by message."""
    counts = {}
    for line in (read(path, "") or "").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("level") in ("warn", "error", "fatal", "panic"):
            key = f"{entry['level']}: {entry.get('msg', '')}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def fleet(work, clk, replicas, rollouts):
    d = os.path.join(work, "fleet")
    if not os.path.isdir(d):
        return None
    load = json.loads(read(os.path.join(d, "load.json"), "null") or "null") or {}
    transitions = load.pop("transitions", [])
    runs = [rollout(os.path.join(d, f"rollout.{i}"), "mlp") for i in range(1, rollouts + 1)]
    aborts = [rollout(p[: -len(".txt")], "mlp") for p in sorted(glob.glob(os.path.join(d, "abort.*.txt")))]
    after = rollout(os.path.join(d, "after"), "mlp")
    sequence = runs + aborts + [after]
    for i, r in enumerate(sequence):
        nxt = next((s.get("started_ms") for s in sequence[i + 1 :] if s.get("started_ms")), None)
        r["client"] = client_view(r, transitions, nxt)
    victim = (read(os.path.join(d, "victim"), "") or "").strip()
    memory = [line.split() for line in (read(os.path.join(d, "memory"), "") or "").splitlines()]
    rss = [int(m[1]) for m in memory if len(m) > 2]
    pss = [int(m[2]) for m in memory if len(m) > 2]
    before = int((read(os.path.join(d, "mem-available-before"), "0") or "0").strip() or 0)
    ready = int((read(os.path.join(d, "mem-available-ready"), "0") or "0").strip() or 0)
    ticks = (read(os.path.join(d, "etcd-ticks"), "") or "").split()
    began = float(read(os.path.join(d, "rollouts-began"), "0") or 0)
    ok = [r for r in runs if r.get("phase") == "promoted"]
    summary = {
        "replicas": replicas,
        "rollouts": len(runs),
        "promoted": len(ok),
        "skew_ms": stats([r["switch"]["skew_ms"] for r in ok if r.get("switch")]),
        "first_switch_ms": stats([r["switch"]["first_ms"] for r in ok if r.get("switch")]),
        "last_switch_ms": stats([r["switch"]["last_ms"] for r in ok if r.get("switch")]),
        "reported": [r["switch"]["replicas"] for r in ok if r.get("switch")],
        "by_lead": by_lead(ok),
        "prepare_ms": stats([r.get("prepare_ms") for r in ok]),
        "coordinator_wall_s": stats([r.get("wall_s") for r in ok]),
        "coordinator_cpu_s": stats([r.get("cpu_s") for r in ok]),
        "client_spread_ms": stats([r["client"]["spread_ms"] for r in ok if r.get("client") and "spread_ms" in r["client"]]),
        "client_last_ms": stats([r["client"]["last_ms"] for r in ok if r.get("client") and "last_ms" in r["client"]]),
        "flaps": sum(r["client"]["flaps"] for r in sequence if r.get("client")),
        "not_on_outcome": {i + 1: r["replicas_not_on_outcome"] for i, r in enumerate(runs) if r.get("replicas_not_on_outcome")},
        "etcd_cpu_s": (int(ticks[1]) - int(ticks[0])) / clk if len(ticks) == 2 else None,
        "memory": {
            "rss_mib_sum": round(sum(rss) / 1024, 1),
            "rss_mib_each": stats([r / 1024 for r in rss]),
            "pss_mib_sum": round(sum(pss) / 1024, 1),
            "available_mib_before": round(before / 1024),
            "available_mib_ready": round(ready / 1024),
        },
        "load": load,
        "aborts": [
            {
                "rc": a["rc"],
                "phase": a.get("phase"),
                "reason": a.get("reason"),
                "names_victim": bool(victim) and f"replica {victim} " in (a.get("reason") or ""),
                "wall_s": a.get("wall_s"),
                "prepare_phase_ms": None if not a.get("decisions") else a["decisions"][-1][1] - a["started_ms"],
            }
            for a in aborts
        ],
        "after": {k: after.get(k) for k in ("rc", "phase", "switch", "wall_s")},
        "victim": victim,
        "rollouts_began_s": began,
    }
    versions = load.get("versions", {})
    summary["targets"] = {
        # Judged on baton's default, the scheduled switch, when it ran.
        "max skew <= 20 ms": (
            summary["by_lead"]["250ms"]["skew_ms"]["max"] <= 20
            if "250ms" in summary["by_lead"]
            else summary["skew_ms"] is not None and summary["skew_ms"]["max"] <= 20
        )
        and len(ok) == len(runs),
        "commit write -> all switched <= 1 s": summary["last_switch_ms"] is not None
        and summary["last_switch_ms"]["max"] <= 1000
        and all(n == replicas for n in summary["reported"]),
        "zero failed requests": load.get("requests", 0) > 0 and load.get("failed", 1) == 0,
        "no answer from an aborted version": bool(aborts)
        and versions.get("3", 0) == 0
        and all(a["rc"] != 0 and a.get("phase") == "aborted" for a in aborts),
    }
    return {"summary": summary, "rollouts": runs, "aborts": aborts, "after": after}


def scale(work, clk):
    d = os.path.join(work, "scale")
    if not os.path.isdir(d):
        return None
    out = {}
    for s in sorted(glob.glob(os.path.join(d, "n*")), key=lambda p: int(p.rsplit("n", 1)[1])):
        n = int(s.rsplit("n", 1)[1])
        runs = [rollout(p[: -len(".txt")], "m") for p in sorted(glob.glob(os.path.join(s, "rollout.*.txt")), key=lambda p: int(p.split(".")[-2]))]
        joined = (read(os.path.join(s, "joined"), "0 0") or "0 0").split()
        ticks = [int(t) for t in (read(os.path.join(s, "ticks"), "") or "").split()]
        began = float(read(os.path.join(s, "rollouts-began"), "0") or 0)
        ended = float(read(os.path.join(s, "rollouts-ended"), "0") or 0)
        ok = [r for r in runs if r.get("phase") == "promoted"]
        entry = {
            "replicas": n,
            "joined": int(joined[0]),
            "join_s": int(joined[1]),
            "rollouts": len(runs),
            "promoted": len(ok),
            "failed": [
                {"rc": r["rc"], "phase": r.get("phase"), "reason": r.get("reason"), "error": r.get("error")}
                for r in runs
                if r.get("phase") != "promoted"
            ],
            "capped": (read(os.path.join(s, "capped"), "") or "").strip() or None,
            "skew_ms": stats([r["switch"]["skew_ms"] for r in ok if r.get("switch")]),
            "first_switch_ms": stats([r["switch"]["first_ms"] for r in ok if r.get("switch")]),
            "last_switch_ms": stats([r["switch"]["last_ms"] for r in ok if r.get("switch")]),
            "reported": [r["switch"]["replicas"] for r in ok if r.get("switch")],
            "prepare_ms": stats([r.get("prepare_ms") for r in ok]),
            "coordinator_wall_s": stats([r.get("wall_s") for r in ok]),
            "coordinator_cpu_s": stats([r.get("cpu_s") for r in ok]),
            "not_on_outcome": {i + 1: len(r["replicas_not_on_outcome"]) for i, r in enumerate(runs) if r.get("replicas_not_on_outcome")},
            "switch_delays_ms": [r.get("switch_delays_ms") for r in ok],
            "etcd_warnings": etcd_warnings(os.path.join(s, "etcd.log")),
            "runs": runs,
        }
        if len(ticks) == 5:
            span = ended - began
            entry["etcd_cpu_s_join"] = (ticks[1] - ticks[0]) / clk
            entry["etcd_cpu_s_rollouts"] = (ticks[2] - ticks[1]) / clk
            entry["sim_cpu_s_rollouts"] = (ticks[4] - ticks[3]) / clk
            entry["rollouts_span_s"] = round(span, 1)
            entry["etcd_cpu_share_rollouts"] = round((ticks[2] - ticks[1]) / clk / span, 3) if span > 0 else None
            entry["sim_cpu_share_rollouts"] = round((ticks[4] - ticks[3]) / clk / span, 3) if span > 0 else None
        out[n] = entry
    return out


def fmt(s, key="p50", d=1):
    return "-" if not s else f"{s[key]:.{d}f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--clk-tck", type=int, default=100)
    parser.add_argument("--replicas", type=int, default=32)
    parser.add_argument("--rollouts", type=int, default=20)
    args = parser.parse_args()
    report = {"fleet": fleet(args.work, args.clk_tck, args.replicas, args.rollouts), "scale": scale(args.work, args.clk_tck)}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)

    f = report["fleet"]
    if f:
        s = f["summary"]
        print(f"## fleet: {s['replicas']} replicas under load, {s['rollouts']} rollouts, {s['promoted']} promoted")
        for i, r in enumerate(f["rollouts"], 1):
            sw = r.get("switch") or {}
            c = r.get("client") or {}
            print(
                f"rollout {i:2} -> {r.get('version')}: {r.get('phase')} rc {r['rc']}; skew {sw.get('skew_ms')} ms, "
                f"commit -> first {sw.get('first_ms')} / last {sw.get('last_ms')} ms ({sw.get('replicas')} reported); "
                f"prepare {r.get('prepare_ms')} ms, coordinator {r.get('wall_s')} s wall {r.get('cpu_s')} s CPU; "
                f"client: first new answers {c.get('first_ms')}..{c.get('last_ms')} ms, spread {c.get('spread_ms')} ms, "
                f"flaps {c.get('flaps')}"
            )
        for k in ("skew_ms", "first_switch_ms", "last_switch_ms", "prepare_ms", "coordinator_wall_s", "client_spread_ms", "client_last_ms"):
            v = s[k]
            if v:
                print(f"{k}: p50 {v['p50']:.2f}, p99 {v['p99']:.2f}, max {v['max']:.2f}, min {v['min']:.2f} (n {v['n']})")
        load = s["load"]
        print(
            f"load: {load.get('requests')} requests, {load.get('failed')} failed {load.get('failures')}, "
            f"versions {load.get('versions')}, {load.get('rate_per_s')}/s over {load.get('seconds')} s, "
            f"latency ms {load.get('latency_ms')}"
        )
        for lead, g in s["by_lead"].items():
            print(
                f"switch lead {lead} ({g['rollouts']} rollouts): skew p50 {fmt(g['skew_ms'])} max {fmt(g['skew_ms'], 'max')} ms; "
                f"commit -> last switch p50 {fmt(g['last_switch_ms'])} max {fmt(g['last_switch_ms'], 'max')} ms; "
                f"delivery skew p50 {fmt(g['delivery_skew_ms'])} max {fmt(g['delivery_skew_ms'], 'max')} ms"
            )
        print(f"memory: {s['memory']}")
        print(f"switch delays after the commit write, per rollout: {[r.get('switch_delays_ms') for r in f['rollouts']]}")
        print(f"etcd CPU over the {s['rollouts']} rollouts: {s['etcd_cpu_s']} s; flaps {s['flaps']}; "
              f"replicas not on the outcome after a rollout: {s['not_on_outcome'] or 'none'}")
        for a in s["aborts"]:
            print(f"abort: rc {a['rc']}, {a['phase']}, names {s['victim']}: {a['names_victim']}; {a['wall_s']} s; {a['reason']}")
        print(f"after the aborts: {s['after']}")
        for target, met in s["targets"].items():
            print(f"target {target}: {'met' if met else 'MISSED'}")
    for n, e in (report["scale"] or {}).items():
        print(
            f"## scale N={n}: joined {e['joined']} in {e['join_s']} s; {e['promoted']}/{e['rollouts']} promoted; "
            f"skew p50 {fmt(e['skew_ms'])} max {fmt(e['skew_ms'], 'max')} ms; commit -> last switch p50 "
            f"{fmt(e['last_switch_ms'])} max {fmt(e['last_switch_ms'], 'max')} ms; reported {e['reported']}; "
            f"prepare p50 {fmt(e['prepare_ms'])} ms; coordinator wall p50 {fmt(e['coordinator_wall_s'], d=2)} s, "
            f"CPU p50 {fmt(e['coordinator_cpu_s'], d=2)} s; etcd CPU {e.get('etcd_cpu_s_rollouts')} s over "
            f"{e.get('rollouts_span_s')} s ({e.get('etcd_cpu_share_rollouts')} of a core), simulator "
            f"{e.get('sim_cpu_share_rollouts')} of a core; etcd warnings {e['etcd_warnings'] or 'none'}"
        )
        print(f"  switch delays after the commit write, per rollout (p10/p50/p90/max ms): {e['switch_delays_ms']}")
        for failed in e["failed"]:
            print(f"  not promoted: {failed}")
        if e["capped"]:
            print(f"  {e['capped']}")


if __name__ == "__main__":
    main()
