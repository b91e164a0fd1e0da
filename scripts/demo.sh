#!/usr/bin/env bash
# Sets up everything baton needs on a fresh machine (the ONNX Runtime
# library; building needs nothing beyond Rust), then serves the demo
# repository (generated under .baton/demo) on http://127.0.0.1:8000.
# Extra arguments go to `baton serve`, e.g. `--http 127.0.0.1:9000`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/fetch-onnxruntime.sh
cargo build --release --locked -p baton-server
exec target/release/baton serve "$@"
