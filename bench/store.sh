#!/usr/bin/env bash
# A 1 GiB weights-only version (four 8192 × 8192 FP32 layers, warmup off,
# one session) loaded by the release binary from a local directory, from an
# S3-compatible store on loopback (SeaweedFS) with an empty cache, and from
# the store after a restart (its cache); each load's stages, and the p99
# of a small model of the same server (300 requests/s, open loop) while the
# version comes in (fetch and verify) against the five seconds before.
#
#   bash bench/store.sh   # PREPACK=true packs matrices; ROUNDS=3;
#                         # STORE_NICE=19 runs the store below serving;
#                         # SERVER_ARGS="--loader-idle" adds server flags;
#                         # LOCAL_ONLY=1 loads from the local directory only;
#                         # MANIFEST_FORMAT=1 writes plain SHA-256 digests;
#                         # ELSEWHERE=1 also downloads the bytes by curl in
#                         # another process beside serving (at nice
#                         # ELSEWHERE_NICE, 19 unless set)
#
# Prints `figure:` lines and writes them to $results/store.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup-clients.sh >/dev/null
results=.baton/bench/results
mkdir -p "$results"
log="$results/store.txt"
cargo test --release -q -p baton-server --test store_bench -- --ignored --nocapture 2>&1 |
  grep '^figure:' | tee "$log"
echo "Wrote $log"
