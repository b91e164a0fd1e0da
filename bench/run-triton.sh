#!/usr/bin/env bash
# Starts NVIDIA Triton Inference Server (the tritonserver 2.51 binary shipped
# in the nvidia-pytriton wheel, installed by bench/setup-triton.sh) in the
# background on 127.0.0.1, serving one ONNX model through Triton's *python
# backend*: each model instance runs in its own "stub" process
# (triton_python_backend_stub) that talks to the server over shared memory
# (/dev/shm), and runs the ONNX file with onnxruntime (intra_op_num_threads
# 1). Waits until /v2/health/ready answers 200 and prints the server's pid
# (its own process group, stubs included: stop it with
# `bash bench/stop.sh PID`).
#
#   bash bench/run-triton.sh MODEL_DIR PORT
#
# MODEL_DIR: one model's directory of numbered versions, each holding
# model.onnx (e.g. .baton/bench/models/baton/mlp, as written by
# bench/models.py); the model is served under the directory's name. A
# repository directory that holds mlp/ is accepted too (the model is then
# mlp, or TRITON_MODEL).
#
# HTTP on PORT, gRPC on PORT+1, metrics on PORT+2, all bound to 127.0.0.1;
# --model-control-mode=explicit --load-model=<model>.
#
# The Triton repository is built under .baton/bench/run/triton-PORT/models/:
#   <model>/config.pbtxt   backend "python", max_batch_size 64, input/output
#                          from the ONNX file (batch dimension first, -1),
#                          one instance KIND_CPU, version_policy below
#   <model>/<V>/model.py   copied (the python backend wants it in each version)
#   <model>/<V>/model.onnx symlink to MODEL_DIR/<V>/model.onnx
#
# Versions and swaps. Triton serves the versions the config's version_policy
# selects. The policy written at start is `latest { num_versions: 1 }`
# (Triton's default, spelled out): the highest-numbered version directory
# present serves, and only it. A load through the repository API (POST
# /v2/repository/models/<model>/load) re-reads the model's directory, but
# Triton 2.51 reloads nothing when neither the served version set nor the
# config changed: the load answers 200 at once and the same stub keeps
# serving. So `baton drill --swap load-api` alone makes no swap, and
# its `--versions` form is refused by Triton (a string "version" parameter:
# HTTP 500). A swap is therefore made by --swap below, which changes the
# version set and then calls load: Triton creates the new version's instance
# (a new stub process, with its own onnxruntime session), makes it serve once
# ready, and unloads the old version's instance (its stub exits);
# requests go on to the old version meanwhile.
#
#   bash bench/run-triton.sh --swap PORT [V [MODEL]]
#       makes the running server (started on PORT) serve version V of MODEL
#       (default: the model MODEL_DIR names): adds the
#       version directory if the repository lacks it (its model.onnx from
#       MODEL_DIR/V, or the newest version's when MODEL_DIR has no V),
#       rewrites config.pbtxt's version_policy to `specific { versions: [V] }`
#       and POSTs the load; prints the load's HTTP status, fails unless 200.
#       Without V: the highest version number in the repository + 1, a copy
#       of the newest, so every swap is to a new version.
#   With baton drill:
#       baton drill mlp --url http://127.0.0.1:PORT --versions 1,2 \
#         --swap command --command 'bash bench/run-triton.sh --swap PORT {version}'
#
#   bash bench/run-triton.sh --repo REPO PORT [TRITONSERVER_ARGS...]
#       serves the Triton repository REPO as it is (nothing is written into
#       it), in explicit model control, on the same loopback ports; what
#       loads at start is up to TRITONSERVER_ARGS (e.g. --load-model=*).
#       The sidecar agent's tests start Triton so.
#
# Environment:
#   TRITON_VERSIONS  comma-separated versions put in the repository at start
#                    (default: every numbered directory of MODEL_DIR); the
#                    newest of them serves.
#   TRITON_MODEL     the model's name (default: MODEL_DIR's name)
#   TRITON_ALSO      more models served beside it, loaded at start, each as
#                    NAME=DIR (DIR: that model's directory of numbered
#                    versions), separated by spaces; e.g. "other=DIR" for a
#                    second model whose stub can be killed while the first
#                    one serves, or "big=DIR" for one that loads beside it
#   TRITON_AUTO_COMPLETE=1  keep Triton's config auto-completion (its
#                    default; off here, see below)
#   READY_TIMEOUT    seconds to wait for readiness (default 180)
# Logs go to .baton/bench/run/triton-PORT/server.log.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/bench/launch.sh"

venv="$root/.baton/bench-venv-triton"
tsdir="$venv/tritonserver"

# add_version REPO MODEL V ONNX: version directory V with model.py and ONNX.
add_version() {
  local repo=$1 model=$2 v=$3 onnx=$4
  [ -f "$onnx" ] || { echo "run-triton: no $onnx" >&2; return 1; }
  mkdir -p "$repo/$model/$v.tmp"
  cp "$repo/model.py" "$repo/$model/$v.tmp/model.py"
  # Compiled now: else the stub's first import writes __pycache__ into the
  # version directory after Triton has loaded it, and Triton takes the
  # changed directory for a new model, reloading it on the next load call.
  "$venv/bin/python" -m py_compile "$repo/$model/$v.tmp/model.py"
  ln -sfn "$(cd "$(dirname "$onnx")" && pwd)/$(basename "$onnx")" "$repo/$model/$v.tmp/model.onnx"
  rm -rf "${repo:?}/$model/$v"
  mv "$repo/$model/$v.tmp" "$repo/$model/$v"
}

# serve RUN REPO PORT ARGS...: starts tritonserver on REPO, on loopback ports.
serve() {
  local run=$1 repo=$2 port=$3
  shift 3
  cd "$run"
  # The stub embeds CPython in isolated mode (PYTHONPATH/PYTHONHOME ignored):
  # it finds the venv through `python3` on PATH (pyvenv.cfg beside it), and
  # loads libpython from LD_LIBRARY_PATH, the venv's base Python's LIBDIR (see
  # bench/setup-triton.sh).
  export PATH="$venv/bin:$PATH"
  local libdir
  libdir="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')"
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  launch run-triton "$run" "$port" "$tsdir/bin/tritonserver" \
    --model-repository="$repo" \
    --backend-directory="$tsdir/backends" \
    --cache-directory="$tsdir/caches" \
    --model-control-mode=explicit \
    --http-address=127.0.0.1 --http-port="$port" \
    --grpc-address=127.0.0.1 --grpc-port=$((port + 1)) \
    --metrics-address=127.0.0.1 --metrics-port=$((port + 2)) \
    --allow-gpu-metrics=false "$@"
}

if [ "${1:-}" = "--repo" ]; then
  [ $# -ge 3 ] || { echo "usage: $0 --repo REPO PORT [TRITONSERVER_ARGS...]" >&2; exit 2; }
  [ -x "$tsdir/bin/tritonserver" ] && [ -x "$tsdir/backends/python/triton_python_backend_stub" ] ||
    { echo "run-triton: no Triton in $venv; run bash bench/setup-triton.sh" >&2; exit 1; }
  repo="$(cd "$2" && pwd)"
  port="$3"
  shift 3
  run="$root/.baton/bench/run/triton-$port"
  rm -rf "$run"
  mkdir -p "$run"
  serve "$run" "$repo" "$port" --log-info=true --exit-timeout-secs=5 "$@"
  exit 0
fi

if [ "${1:-}" = "--swap" ]; then
  [ $# -ge 2 ] && [ $# -le 4 ] || { echo "usage: $0 --swap PORT [V [MODEL]]" >&2; exit 2; }
  port="$2"
  run="$root/.baton/bench/run/triton-$port"
  [ -f "$run/source" ] || { echo "run-triton: no server started on port $port ($run)" >&2; exit 1; }
  # The first line is the model MODEL_DIR names; TRITON_ALSO's follow.
  if [ -n "${4:-}" ]; then
    read -r model src < <(grep "^$4 " "$run/source") || { echo "run-triton: no model $4" >&2; exit 1; }
  else
    read -r model src <"$run/source"
  fi
  repo="$run/models"
  newest="$(cd "$repo/$model" && ls -d [0-9]* | grep -E '^[0-9]+$' | sort -n | tail -n 1)"
  v="${3:-$((newest + 1))}"
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "run-triton: bad version '$v'" >&2; exit 2; }
  if ! [ -d "$repo/$model/$v" ]; then
    onnx="$src/$v/model.onnx"
    [ -f "$onnx" ] || onnx="$(readlink -f "$repo/$model/$newest/model.onnx")"
    add_version "$repo" "$model" "$v" "$onnx"
  fi
  sed "s/^version_policy:.*/version_policy: { specific { versions: [ $v ] } }/" \
    "$repo/$model/config.pbtxt" >"$repo/$model/config.pbtxt.tmp"
  mv "$repo/$model/config.pbtxt.tmp" "$repo/$model/config.pbtxt"
  code="$(curl -s -o "$run/load.out" -w '%{http_code}' -X POST -d '{}' \
    "http://127.0.0.1:$port/v2/repository/models/$model/load")"
  echo "$code"
  [ "$code" = 200 ] || { cat "$run/load.out" >&2; echo >&2; exit 1; }
  exit 0
fi

if [ $# -ne 2 ]; then
  echo "usage: $0 MODEL_DIR PORT | $0 --swap PORT [V]" >&2
  exit 2
fi
src="$(cd "$1" && pwd)"
port="$2"
[ -x "$tsdir/bin/tritonserver" ] && [ -x "$tsdir/backends/python/triton_python_backend_stub" ] ||
  { echo "run-triton: no Triton in $venv; run bash bench/setup-triton.sh" >&2; exit 1; }

model="${TRITON_MODEL:-}"
if ! compgen -G "$src/[0-9]*/model.onnx" >/dev/null; then
  # A repository directory: the model is TRITON_MODEL, default mlp.
  model="${model:-mlp}"
  src="$src/$model"
fi
model="${model:-$(basename "$src")}"
if [ -n "${TRITON_VERSIONS:-}" ]; then
  IFS=, read -r -a versions <<<"$TRITON_VERSIONS"
else
  versions=()
  for d in "$src"/[0-9]*/; do
    d="$(basename "$d")"
    [[ "$d" =~ ^[0-9]+$ ]] && [ -f "$src/$d/model.onnx" ] && versions+=("$d")
  done
fi
((${#versions[@]})) || { echo "run-triton: no version directory with model.onnx in $src" >&2; exit 1; }

run="$root/.baton/bench/run/triton-$port"
rm -rf "$run"
mkdir -p "$run/models/$model"
repo="$run/models"
printf '%s %s\n' "$model" "$src" >"$run/source"

# The model: one onnxruntime session per instance (stub process).
cat >"$repo/model.py" <<'PY'
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        config = json.loads(args["model_config"])
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            feeds = {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.inputs}
            results = self.session.run(self.outputs, feeds)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(n, np.ascontiguousarray(r)) for n, r in zip(self.outputs, results)]))
        return responses
PY

# write_config MODEL ONNX: config.pbtxt from ONNX's signature (batch dim dropped).
write_config() {
"$venv/bin/python" - "$2" "$1" >"$repo/$1/config.pbtxt" <<'PY'
import sys

import onnxruntime as ort

TYPES = {"tensor(float)": "TYPE_FP32", "tensor(double)": "TYPE_FP64", "tensor(float16)": "TYPE_FP16",
         "tensor(int8)": "TYPE_INT8", "tensor(int16)": "TYPE_INT16", "tensor(int32)": "TYPE_INT32",
         "tensor(int64)": "TYPE_INT64", "tensor(uint8)": "TYPE_UINT8", "tensor(bool)": "TYPE_BOOL"}
path, name = sys.argv[1:]
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def tensors(args):
    out = []
    for a in args:
        dims = [d if isinstance(d, int) and d >= 0 else -1 for d in a.shape][1:]
        out.append(f'  {{ name: "{a.name}" data_type: {TYPES[a.type]} dims: [ {", ".join(map(str, dims))} ] }}')
    return ",\n".join(out)


print(f'''name: "{name}"
backend: "python"
max_batch_size: 64
input [
{tensors(session.get_inputs())}
]
output [
{tensors(session.get_outputs())}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
version_policy: {{ latest {{ num_versions: 1 }} }}''')
PY
}

for v in "${versions[@]}"; do
  add_version "$repo" "$model" "$v" "$src/$v/model.onnx"
done
write_config "$model" "$src/${versions[-1]}/model.onnx"

# TRITON_ALSO: each with every numbered version of its directory.
loads=(--load-model="$model")
for also in ${TRITON_ALSO:-}; do
  name="${also%%=*}" dir="$(cd "${also#*=}" && pwd)"
  mkdir -p "$repo/$name"
  printf '%s %s\n' "$name" "$dir" >>"$run/source"
  newest=
  for d in "$dir"/[0-9]*/; do
    d="$(basename "$d")"
    [[ "$d" =~ ^[0-9]+$ ]] && [ -f "$dir/$d/model.onnx" ] || continue
    add_version "$repo" "$name" "$d" "$dir/$d/model.onnx"
    newest="$d"
  done
  [ -n "$newest" ] || { echo "run-triton: no version directory with model.onnx in $dir" >&2; exit 1; }
  write_config "$name" "$dir/$newest/model.onnx"
  loads+=(--load-model="$name")
done

# The config is complete, so Triton's auto-completion is off: with it, every
# load first starts one more stub to run the model's auto_complete_config
# (importing model.py, onnxruntime included), ~1.5 s per load here.
autocomplete=(--disable-auto-complete-config)
[ -n "${TRITON_AUTO_COMPLETE:-}" ] && autocomplete=()

serve "$run" "$repo" "$port" "${loads[@]}" "${autocomplete[@]}" --log-info=true
