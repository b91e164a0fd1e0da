#!/usr/bin/env bash
# One copy of the weights, in one run: bytes_held per pool size (packed
# and not), the memory a version changing one layer in ten adds, the peak
# memory of availability and resource swaps of the 480 MiB MLP (pools of 2
# and of 1) with the resource swap's pause, and the load of 1 GiB of
# safetensors (packed and not) and of the same model as one ONNX file,
# each stage timed.
#
#   bash bench/weights.sh
#
# The figures come from ignored tests of crates/baton-testkit/tests/
# weights_memory.rs, which load real versions through the registry and
# the ONNX Runtime backend in one process, one measurement at a time.
# Prints `figure:` lines and writes them to $results/weights.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
results=.baton/bench/results
mkdir -p "$results"
log="$results/weights.txt"
: >"$log"
run() {
  cargo test --release -q -p baton-testkit --test weights_memory -- --ignored --nocapture --exact "$1" 2>&1 |
    grep '^figure:' | tee -a "$log"
}
cargo test --release -q -p baton-testkit --test weights_memory --no-run
run bytes_held_per_pool_size
run memory_added_by_a_version_changing_one_layer_in_ten
SESSIONS=2 run peak_memory_of_availability_and_resource_swaps
SESSIONS=1 run peak_memory_of_availability_and_resource_swaps
PREPACK=true run a_gigabyte_of_safetensors_loads
PREPACK=false run a_gigabyte_of_safetensors_loads
PREPACK=true run a_gigabyte_as_one_onnx_file_loads
PREPACK=false run a_gigabyte_as_one_onnx_file_loads
MANIFEST_FORMAT=1 PREPACK=false run a_gigabyte_as_one_onnx_file_loads
MANIFEST_FORMAT=1 PREPACK=false run a_gigabyte_of_safetensors_loads
echo "Wrote $log"
