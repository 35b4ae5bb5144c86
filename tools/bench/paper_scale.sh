#!/usr/bin/env bash
# The paper's experiment at paper scale on this machine (BENCHMARKS.md "Paper scale"): on the
# files `specfit inflate` writes, (a) the Q4_K_M target mapped in RAM and (b) the Q8_0 target,
# larger than RAM, on the disk tier at 16 / 32 / 48 slots: calibrate, then `specfit bench` for
# plain decoding, EAGLE-3 (K = 7), SpecFit and SpecFit with read-ahead on predicted routes,
# and on the disk tier plain decoding and SpecFit reading the next layer's predicted experts
# (`+layer-ahead`), every output checked against plain decoding. Summarization prompts are cut to their first 512
# tokens. BENCHMARKS.md gives the measured time of each part on the machine it ran on; the
# reports go to bench-results/paper-{ram,disk}/.
#
#   cargo build --release
#   target/release/specfit inflate --out bench-models/paper --type q4_k_m,q8_0
#   tools/bench/paper_scale.sh [DIR]          # DIR: the inflated files (default bench-models/paper)
#
# Environment: SPECFIT_THREADS (default 2), RAM_PROMPTS (prompts per set for (a), default 4),
# DISK_PROMPTS (for (b), default 1), TOKENS (new tokens per prompt, default 24 for (a), 16 for
# (b)), CAL_PROMPTS (calibration prompts: default all 8 for (a), the first 4 for (b), where each
# one's prefill reads most of the file), CYCLES (probe cycles per calibration prompt, default 4),
# PART (a, b or both: the default), SWEEP (the slot points of (b), default 16,32,48),
# LAYERS_AHEAD (layers the +layer-ahead rows of (b) read ahead, default 1; 0 drops them).
set -euo pipefail
cd "$(dirname "$0")/../.."
P=${1:-bench-models/paper}
BIN=target/release/specfit
export SPECFIT_THREADS=${SPECFIT_THREADS:-2}
RAM_PROMPTS=${RAM_PROMPTS:-4}
DISK_PROMPTS=${DISK_PROMPTS:-1}
PART=${PART:-both}
CAL_FILE=data/calibration/paper_scale.jsonl

[ -x "$BIN" ] || { echo "paper_scale.sh: build first: cargo build --release" >&2; exit 2; }
case $PART in
    a) targets=target-q4_k_m.gguf; types=q4_k_m ;;
    b) targets=target-q8_0.gguf; types=q8_0 ;;
    *) targets="target-q4_k_m.gguf target-q8_0.gguf"; types=q4_k_m,q8_0 ;;
esac
for f in $targets drafter/config.json route-predictor.safetensors; do
    [ -e "$P/$f" ] || {
        echo "paper_scale.sh: $P/$f missing: run $BIN inflate --out $P --type $types" >&2
        exit 2
    }
done

start=$(date +%s)
step() { echo "== $* (at $(( $(date +%s) - start )) s)" >&2; }

if [ "$PART" != b ]; then
    step "(a) calibrate the Q4_K_M file in RAM"
    "$BIN" calibrate --model "$P/target-q4_k_m.gguf" --drafter "$P/drafter" --store ram \
        --prompts "$CAL_FILE" --limit "${CAL_PROMPTS:-8}" --cycles "${CYCLES:-4}"
    step "(a) bench, $RAM_PROMPTS prompts per set"
    "$BIN" bench --model "$P/target-q4_k_m.gguf" --drafter "$P/drafter" \
        --predictor "$P/route-predictor.safetensors" --store ram \
        --calibration "$P/target-q4_k_m.specfit-calibration.ram.json" --max-prompt-tokens 512 \
        --limit "$RAM_PROMPTS" --max-tokens "${TOKENS:-24}" --only 'ar,eagle3,specfit,specfit[predictor]' --validate 0 \
        --out bench-results/paper-ram
fi
if [ "$PART" != a ]; then
    step "(b) calibrate the Q8_0 file on the disk tier at 32 slots"
    "$BIN" calibrate --model "$P/target-q8_0.gguf" --drafter "$P/drafter" --store disk --slots 32 \
        --prompts "$CAL_FILE" --limit "${CAL_PROMPTS:-4}" --cycles "${CYCLES:-4}"
    step "(b) bench at ${SWEEP:-16,32,48} slots, $DISK_PROMPTS prompts per set"
    only='ar,eagle3,specfit[predictor],specfit+ahead[predictor]'
    # LAYERS_AHEAD=0 runs no +layer-ahead rows, so --only must not name them.
    if [ "${LAYERS_AHEAD:-1}" != 0 ]; then
        only="$only,ar+layer-ahead,specfit+layer-ahead[predictor]"
    fi
    "$BIN" bench --model "$P/target-q8_0.gguf" --drafter "$P/drafter" \
        --predictor "$P/route-predictor.safetensors" --store disk --slots 32 --sweep "${SWEEP:-16,32,48}" \
        --calibration "$P/target-q8_0.specfit-calibration.disk.json" --max-prompt-tokens 512 \
        --limit "$DISK_PROMPTS" --max-tokens "${TOKENS:-16}" \
        --only "$only" \
        --layers-ahead "${LAYERS_AHEAD:-1}" --validate 0 \
        --out bench-results/paper-disk
fi
step "done"
