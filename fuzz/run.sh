#!/usr/bin/env bash
# Runs specfit's fuzz targets with libFuzzer (cargo fuzz, stable toolchain, no sanitizer):
# RUNS inputs per target (default 1,000,000), any input over 1 s or 2 GiB a failure, new
# inputs kept under WORK (default /tmp/specfit-fuzz), the kept corpus (corpus/TARGET) read as
# well. Prints libFuzzer's final figures per target; exits non-zero on the first failure, whose
# input is in artifacts/TARGET/. Usage: fuzz/run.sh [TARGET ...]   (docs/FUZZING.md)
set -euo pipefail
cd "$(dirname "$0")"
runs=${RUNS:-1000000}
work=${WORK:-/tmp/specfit-fuzz}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(gguf safetensors config pool calibration request)
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --version 0.13.2 --locked
cargo fuzz build -s none
# Model targets write scratch files per input: keep them in memory when the machine can.
scratch=${TMPDIR:-/tmp}
[ -d /dev/shm ] && [ -w /dev/shm ] && scratch=/dev/shm
for t in "${targets[@]}"; do
    mkdir -p "$work/$t"
    echo "== $t: $runs inputs"
    start=$(date +%s)
    TMPDIR=$scratch SPECFIT_THREADS=1 cargo fuzz run -s none "$t" "$work/$t" "corpus/$t" -- \
        -runs="$runs" -timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        -print_final_stats=1 >"$work/$t.log" 2>&1 || {
        grep -E "panicked at|ERROR|SUMMARY|Test unit written" -A2 "$work/$t.log" | head -20
        exit 1
    }
    grep -E "^stat::" "$work/$t.log"
    echo "wall_s: $(($(date +%s) - start))"
done
