#!/usr/bin/env bash
# Runs real clients against the real binary: NVIDIA's tritonclient over HTTP
# and gRPC (tests/compat), the Python examples of docs/clients.md as they are
# written, then short perf_analyzer runs over both protocols.
# Expects the debug build of the workspace (scripts/test.sh builds it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup-clients.sh
cargo build --quiet --locked -p baton-server -p baton-testkit --example compat_repo --example mlp_repo --example minilm_repo

work=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    wait "$pid" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

target/debug/examples/compat_repo "$work/repo" > "$work/expected.json"
# docs/clients.md's examples use the demo's ranker: 8 features in, one score out.
target/debug/examples/mlp_repo "$work/repo" ranker 8,32,16,1 2 > /dev/null
# ... and the real all-MiniLM-L6-v2, which takes texts (docs/processing.md).
target/debug/examples/minilm_repo "$work/repo" > /dev/null
target/debug/baton serve --repo "$work/repo" --http 127.0.0.1:0 --grpc 127.0.0.1:0 --no-poll \
  > "$work/stdout" 2> "$work/baton.log" &
pid=$!

for _ in $(seq 1 600); do
  [ "$(grep -c '^Listening on' "$work/stdout" || true)" -ge 2 ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/baton.log"; echo "baton exited before listening" >&2; exit 1; }
  sleep 0.1
done
http=$(sed -n 's|^Listening on http://\([^ ]*\).*|\1|p' "$work/stdout")
grpc=$(sed -n 's|^Listening on grpc://\([^ ]*\).*|\1|p' "$work/stdout")
[ -n "$http" ] && [ -n "$grpc" ] || { cat "$work/stdout" "$work/baton.log"; echo "no addresses" >&2; exit 1; }
for _ in $(seq 1 600); do
  .baton/venv/bin/python -c "import urllib.request,sys; urllib.request.urlopen('http://$http/v2/health/ready')" \
    2>/dev/null && break
  sleep 0.1
done

export BATON_HTTP=$http BATON_GRPC=$grpc BATON_EXPECTED=$work/expected.json
if ! (cd tests/compat && ../../.baton/venv/bin/python -m pytest -q -p no:cacheprovider .); then
  echo "--- baton log ---"; tail -50 "$work/baton.log"; exit 1
fi

# Every Python block of docs/clients.md, run as written but for the
# addresses: an example that no longer works fails here.
BATON_DOC=docs/clients.md .baton/venv/bin/python - "$work" <<'PY' || { echo "--- baton log ---"; tail -50 "$work/baton.log"; exit 1; }
import os, re, subprocess, sys
text = open(os.environ["BATON_DOC"]).read()
blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
assert len(blocks) >= 2, f"{os.environ['BATON_DOC']} has {len(blocks)} Python examples"
for i, code in enumerate(blocks, 1):
    code = code.replace("localhost:8000", os.environ["BATON_HTTP"]).replace("localhost:8001", os.environ["BATON_GRPC"])
    path = os.path.join(sys.argv[1], f"client_example_{i}.py")
    open(path, "w").write(code)
    run = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        sys.exit(f"example {i} of {os.environ['BATON_DOC']} failed:\n{code}\n--- output ---\n{run.stdout}{run.stderr}")
    print(f"{os.environ['BATON_DOC']} example {i}: ok")
PY

for protocol in http grpc; do
  url=$([ "$protocol" = http ] && echo "$http" || echo "$grpc")
  echo "perf_analyzer -i $protocol against baton:"
  .baton/bin/perf_analyzer -m mlp -u "$url" -i "$protocol" -b 1 --concurrency-range 2 \
    --measurement-mode count_windows --measurement-request-count 100 -s 100 -r 5 > "$work/perf-$protocol.txt" 2>&1 \
    || { cat "$work/perf-$protocol.txt"; exit 1; }
  grep -E 'Throughput|p99 latency' "$work/perf-$protocol.txt" | head -2
done
