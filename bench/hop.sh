#!/usr/bin/env bash
# What a call to a worker process costs: the same run in process and
# across the hop (shared memory plus a control message each way),
# alternated call by call, for a small input and for 1 MiB and 16 MiB ones.
#
#   bash bench/hop.sh
#
# Prints `figure:` lines and writes them to $results/hop.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
results=.baton/bench/results
mkdir -p "$results"
log="$results/hop.txt"
cargo test --release -q -p baton-worker --test hop -- --ignored --exact what_a_call_across_the_hop_costs --nocapture 2>&1 |
  grep '^figure:' | tee "$log"
echo "Wrote $log"
