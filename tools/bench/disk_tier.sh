#!/usr/bin/env bash
# The disk-tier table of BENCHMARKS.md: raw O_DIRECT bandwidth of the expert file, then decode
# tok/s at 100/50/25/12.5% of the experts as slots and with the cache cleared every forward.
# Each row is the median of REPS runs. Usage (after `specfit convert --model MODEL`):
#   tools/bench/disk_tier.sh [MODEL] [REPS] [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-bench-models/peer115m/bf16}
reps=${2:-5}
tokens=${3:-64}
bin=target/release/specfit
experts=$(python3 -c "import json;print(json.load(open('$model/config.json'))['num_experts'])")
block=$(python3 -c "import json;c=json.load(open('$model/config.json'));print(3*c['hidden_size']*c['moe_intermediate_size']*2)")
echo "## raw O_DIRECT reads of $(basename "$model")/experts.specfit ($((block / 1024)) KiB blocks)"
for t in 1 2 4; do
  target/release/examples/direct_read "$model/experts.specfit" "$block" 1000 "$t"
done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| slots/layer | tok/s (median of $reps) | hits/token | misses/token | MiB copied/token | read MiB/s | waiting for reads |"
echo "|---|---|---|---|---|---|---|"
for slots in "$experts" $((experts / 2)) $((experts / 4)) $((experts / 8)) cleared; do
  if [ "$slots" = cleared ]; then
    args=(--clear-cache); label="cleared every forward"
  else
    args=(--slots "$slots"); label="$slots ($((100 * slots / experts))%)"
  fi
  runs=()
  for _ in $(seq "$reps"); do
    runs+=("$($bin generate --model "$model" --store disk "${args[@]}" --prompt-ids 1,100,200,300,400,500,600,700 \
      --max-tokens "$tokens" --ignore-eos 2>&1 >/dev/null | tr '\n' ' ')")
  done
  tps=$(for r in "${runs[@]}"; do sed 's/.*tokens, \([0-9.]*\) tok.*/\1/' <<<"$r"; done | median)
  last=${runs[-1]}
  hits=$(sed 's/.*token \([0-9.]*\) hits.*/\1/' <<<"$last")
  misses=$(sed 's/.*hits, \([0-9.]*\) misses.*/\1/' <<<"$last")
  mib=$(sed 's/.*misses, \([0-9.]*\) MiB.*/\1/' <<<"$last")
  rate=$(sed -n 's/.*reads: \([0-9.]*\) MiB\/s.*/\1/p' <<<"$last")
  wait=$(sed 's/.*copies took \([0-9]*\)%.*/\1/' <<<"$last")
  echo "| $label | $tps | $hits | $misses | $mib | ${rate:--} | ${wait}% |"
done
