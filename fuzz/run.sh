#!/usr/bin/env bash
# Runs baton's AFL++ targets, each for a bounded time, and prints what each
# did. Usage: fuzz/run.sh [seconds per target] [target...]
# Targets: rest grpc onnx manifest spec sample (all by default).
# Needs cargo-afl (`cargo install cargo-afl`, which builds AFL++ from the
# sources it ships). Crashes are kept in fuzz/out/<target>/default/crashes;
# the script fails if there is any.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(rest grpc onnx manifest spec sample)
fi

cargo afl build --release --locked
# The starting corpus: valid inputs made by baton's own encoders.
rm -rf corpus
(cd .. && cargo run --quiet --locked -p baton-testkit --example fuzz_corpus -- fuzz/corpus)

export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_AFFINITY=1
crashed=0
for target in "${targets[@]}"; do
    rm -rf "out/$target" "out/$target.log"
    mkdir -p out
    cargo afl fuzz -i "corpus/$target" -o "out/$target" -V "$seconds" "target/release/$target" > "out/$target.log" 2>&1 || {
        echo "afl-fuzz failed on $target; see fuzz/out/$target.log" >&2
        exit 1
    }
    stats="out/$target/default/fuzzer_stats"
    field() { awk -v k="$1" '$1 == k { print $3 }' "$stats"; }
    echo "$target: $(field execs_done) executions in $(field run_time) s ($(field execs_per_sec)/s), $(field corpus_count) inputs in the corpus, $(field saved_crashes) crashes, $(field saved_hangs) hangs"
    if [ "$(field saved_crashes)" != "0" ]; then
        crashed=1
    fi
done
exit "$crashed"
