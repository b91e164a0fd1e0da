"""The client side of bench/text-embedding.sh: the texts, a closed-loop
load generator, the check that the servers embed alike, and the report.
Standard library and numpy only; every server is driven the same way:
KServe V2 JSON over HTTP/1.1 keep-alive, one text a request as a BYTES
input named `text`, the answer's first output read as the embedding.

  text_embedding.py texts OUT [--seed S] [--count N]
      writes N texts (JSON list), made from the seed alone: search queries,
      sentences, paragraphs (some past MiniLM's 256 tokens), CJK, emoji.
  text_embedding.py load --server NAME --url URL --model M --texts FILE
                         --concurrency C --seconds S [--max-requests N]
      C threads, each with its own connection, send the texts in turn (each
      thread from its own offset) until S seconds or N requests in all;
      prints one JSON line: requests, errors, throughput, p50, p99, load.
  text_embedding.py compare --texts FILE --reference NAME=URL NAME=URL...
                            [--batch B]
      (URL: the model's, http://HOST:PORT/v2/models/M) each text alone, then in requests of B texts, on every server; prints
      the largest absolute difference of each from the reference's
      embeddings (JSON lines), and fails if a server errs.
  text_embedding.py report RESULTS [--baseline baton]
      medians over rounds of each server at each concurrency, and ratios to
      the baseline, as a Markdown table.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
from urllib.parse import urlsplit

WORDS = """the a of to and in is it that for on with as was by at be this from are or an have not
they which one you had her all she there were their we when your can said use each do how if will
up about out many then them these so some would make like him into time has look two more write go
see number no way could people my than first water been call who oil its now find long down day did
get come made may part model server request latency batch memory network version deploy rollout
customer order invoice payment refund shipping delivery account password login error warning
search query result ranking relevance embedding vector sentence document paragraph summary
weather tomorrow morning evening weekend holiday flight hotel booking cancel change price cheap
fast quickly slowly carefully river mountain city village market coffee bread cheese apple
engine wheel brake battery charger screen keyboard laptop phone camera lens photo video music
doctor nurse hospital medicine fever cough headache appointment insurance policy claim contract
teacher student school exam homework library book chapter author novel poem history science""".split()

CJK = [
    "東京は日本の首都です。", "今日はとても良い天気ですね。", "この商品の配送はいつになりますか？",
    "我想预订明天去上海的火车票。", "请问这家餐厅几点开门？", "机器学习模型需要大量的数据。",
    "서울은 한국의 수도입니다.", "내일 회의는 몇 시에 시작하나요?", "パスワードを忘れてしまいました。",
    "这个问题已经解决了，谢谢你的帮助。",
]

EMOJI = ["🍕", "🎉", "😀", "👍", "🚀", "❤️", "🔥", "😂", "🙏", "✅", "🌧️", "☕"]


def make_texts(seed, count):
    """count texts from seed: 40 % queries (3-9 words), 30 % sentences
    (10-30), 12 % paragraphs (32-360 words, some past 256 tokens), 10 %
    CJK (one to three sentences, some mixed with English), 8 % sentences
    with emoji."""
    rng = random.Random(seed)

    def words(lo, hi):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    texts = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.40:
            texts.append(words(3, 9))
        elif kind < 0.70:
            texts.append(words(10, 30).capitalize() + ".")
        elif kind < 0.82:
            texts.append(". ".join(words(8, 20).capitalize() for _ in range(rng.randint(4, 18))) + ".")
        elif kind < 0.92:
            parts = [rng.choice(CJK) for _ in range(rng.randint(1, 3))]
            if rng.random() < 0.3:
                parts.append(words(3, 8))
            texts.append(" ".join(parts))
        else:
            out = words(5, 15).split()
            for _ in range(rng.randint(1, 4)):
                out.insert(rng.randint(0, len(out)), rng.choice(EMOJI))
            texts.append(" ".join(out))
    return texts


def body(texts):
    return json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]})


def connect(url):
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)


def post(conn, path, payload):
    """One request on conn; the answer's status and body."""
    conn.request("POST", path, payload, {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load(args):
    with open(args.texts) as f:
        texts = json.load(f)
    payloads = [body([t]).encode() for t in texts]
    path = f"/v2/models/{args.model}/infer"
    latencies, errors = [], []
    lock = threading.Lock()
    issued = [0]
    deadline = time.monotonic() + args.seconds
    start = threading.Barrier(args.concurrency + 1)

    def worker(offset):
        conn = connect(args.url)
        mine, i = [], offset
        start.wait()
        while time.monotonic() < deadline:
            with lock:
                if issued[0] >= args.max_requests:
                    break
                issued[0] += 1
            began = time.perf_counter()
            try:
                status, answer = post(conn, path, payloads[i % len(payloads)])
                if status != 200:
                    with lock:
                        errors.append(f"{status} {answer[:200]!r}")
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    errors.append(repr(e))
                conn.close()
                conn = connect(args.url)
            mine.append(time.perf_counter() - began)
            i += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    step = max(1, len(payloads) // args.concurrency)
    threads = [threading.Thread(target=worker, args=(k * step,)) for k in range(args.concurrency)]
    load_before = os.getloadavg()[0]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    ms = [x * 1000 for x in latencies]
    print(json.dumps({
        "server": args.server, "concurrency": args.concurrency, "requests": len(ms), "errors": len(errors),
        "first_error": errors[0] if errors else None, "seconds": round(elapsed, 2),
        "rps": round(len(ms) / elapsed, 1), "p50_ms": round(percentile(ms, 0.50), 2) if ms else None,
        "p99_ms": round(percentile(ms, 0.99), 2) if ms else None, "load1": load_before,
    }), flush=True)


def embeddings(url, texts, batch):
    import numpy as np

    conn = connect(url)
    path = urlsplit(url).path.rstrip("/") + "/infer"
    rows = []
    for k in range(0, len(texts), batch):
        status, answer = post(conn, path, body(texts[k:k + batch]).encode())
        if status != 200:
            raise RuntimeError(f"{url}: {status} {answer[:300]!r}")
        output = json.loads(answer)["outputs"][0]
        rows.append(np.array(output["data"], dtype=np.float32).reshape(output["shape"]))
    conn.close()
    return np.concatenate(rows)


def compare(args):
    with open(args.texts) as f:
        texts = json.load(f)
    servers = [s.split("=", 1) for s in [args.reference, *args.servers]]
    for batch in (1, args.batch):
        got = {name: embeddings(url, texts, batch) for name, url in servers}
        want = got[servers[0][0]]
        for name, _ in servers[1:]:
            diff = abs(got[name] - want).max(axis=1)
            print(json.dumps({"server": name, "reference": servers[0][0], "texts": len(texts), "batch": batch,
                              "shape": list(got[name].shape), "max_abs_diff": float(diff.max()),
                              "worst_text": int(diff.argmax())}), flush=True)


def report(args):
    rows = []
    with open(args.results) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{") and '"rps"' in line:
                rows.append(json.loads(line))
    servers = list(dict.fromkeys(r["server"] for r in rows))
    levels = sorted({r["concurrency"] for r in rows})
    med = {}
    for s in servers:
        for c in levels:
            runs = [r for r in rows if r["server"] == s and r["concurrency"] == c and r["requests"]]
            if runs:
                med[s, c] = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50_ms", "p99_ms")}
                med[s, c]["runs"] = len(runs)
                med[s, c]["errors"] = sum(r["errors"] for r in runs)
    base = args.baseline
    print("| server | concurrency | runs | requests/s | p50 ms | p99 ms | rps vs baton | p50 vs baton | p99 vs baton | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in levels:
        for s in servers:
            m = med.get((s, c))
            if not m:
                continue
            b = med.get((base, c))
            ratio = (lambda k: f"{m[k] / b[k]:.2f}x") if b else (lambda k: "")
            print(f"| {s} | {c} | {m['runs']} | {m['rps']:.1f} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | "
                  f"{ratio('rps')} | {ratio('p50_ms')} | {ratio('p99_ms')} | {m['errors']} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("texts")
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=52)
    p.add_argument("--count", type=int, default=256)
    p = sub.add_parser("load")
    p.add_argument("--server", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--model", default="minilm")
    p.add_argument("--texts", required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--max-requests", type=int, default=100_000)
    p = sub.add_parser("compare")
    p.add_argument("--texts", required=True)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--reference", required=True)
    p.add_argument("servers", nargs="+")
    p = sub.add_parser("report")
    p.add_argument("results")
    p.add_argument("--baseline", default="baton")
    args = parser.parse_args()
    if args.command == "texts":
        with open(args.out, "w") as f:
            json.dump(make_texts(args.seed, args.count), f, ensure_ascii=False, indent=0)
        print(args.out)
    else:
        {"load": load, "compare": compare, "report": report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
