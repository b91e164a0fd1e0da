#!/usr/bin/env bash
# Sets up everything baton's tests need on a fresh machine, then runs them all.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/fetch-onnxruntime.sh
# A second ONNX Runtime, older, for a version that runs on its own runtime
# in a worker process beside the server's.
ORT_VERSION=1.24.4 ORT_LIB_DIR=.baton/lib/second bash scripts/fetch-onnxruntime.sh
bash scripts/setup-packages.sh
# The black-box tests drive baton with tritonclient too.
bash scripts/setup-clients.sh
# The sidecar agent is tested against a real MLServer ...
bash bench/setup-peers.sh --only mlserver
# ... and against a real Triton (tritonserver from the nvidia-pytriton wheel).
bash bench/setup-triton.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
bash scripts/compat.sh
