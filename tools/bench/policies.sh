#!/usr/bin/env bash
# One run of every decoding policy on the same prompts (issue 4's BENCHMARKS table): probe and
# calibrate the engine first, train a route predictor, then `specfit generate` per policy.
# Usage: tools/bench/policies.sh [MODEL] [DRAFTER] [SLOTS] [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-fixtures/qwen3moe/eagle_target}
drafter=${2:-fixtures/eagle3/tiny}
slots=${3:-2}
tokens=${4:-64}
bin=target/release/specfit
out=bench-results/policies; mkdir -p "$out"
prompts=("1,243,56,119,188" "1,17,9,200,4,77" "1,100,100,31,8")
$bin probe --model "$model" --drafter "$drafter" --prompt-ids "${prompts[0]}" --cycles 64 --slots "$slots" --out "$out/probes.jsonl" 2>/dev/null
$bin calibrate --probes "$out/probes.jsonl" --model "$model" --out "$out/cal.json" 2>/dev/null
$bin train-predictor --model "$model" --drafter "$drafter" --prompt-ids "${prompts[1]}" --positions 60 --out "$out/predictor.safetensors" 2>/dev/null
echo "| policy | routes | tok/s (mean of ${#prompts[@]} prompts) | tokens/cycle | nodes verified/cycle | misses/token | same tokens as ar |"
echo "|---|---|---:|---:|---:|---:|---|"
run() { # label policy routes extra...
  local label=$1 policy=$2 routes=$3; shift 3
  local tps=0 tpc=0 npc=0 mpt=0 same=yes
  for p in "${prompts[@]}"; do
    local args=(generate --model "$model" --store ram --slots "$slots" --prompt-ids "$p" --max-tokens "$tokens" --ignore-eos)
    local base; base=$($bin "${args[@]}" 2>/dev/null)
    local res err
    if [ "$policy" = ar ]; then
      res=$($bin "${args[@]}" 2>/tmp/policy.err)
    else
      res=$($bin "${args[@]}" --drafter "$drafter" --policy "$policy" --routes "$routes" --calibration "$out/cal.json" "$@" 2>/tmp/policy.err)
    fi
    err=$(cat /tmp/policy.err)
    [ "$res" = "$base" ] || same=no
    tps=$(python3 -c "print($tps + float('$(sed -n 's/.*tokens, \([0-9.]*\) tok.*/\1/p' <<<"$err")'))")
    if [ "$policy" != ar ]; then
      tpc=$(python3 -c "print($tpc + float('$(sed -n 's/.*and \([0-9.]*\) tokens committed.*/\1/p' <<<"$err")'))")
      npc=$(python3 -c "print($npc + float('$(sed -n 's/.*cycles: \([0-9.]*\) draft nodes.*/\1/p' <<<"$err")'))")
      mpt=$(python3 -c "print($mpt + float('$(sed -n 's/.*hits, \([0-9.]*\) misses.*/\1/p' <<<"$err")'))")
    else
      tpc=$(python3 -c "print($tpc + 1)")
      mpt=$(python3 -c "print($mpt + float('$(sed -n 's/.*hits, \([0-9.]*\) misses.*/\1/p' <<<"$err")'))")
    fi
  done
  local n=${#prompts[@]}
  python3 -c "print('| $label | $routes | %.1f | %.2f | %.2f | %.1f | $same |' % ($tps/$n, $tpc/$n, $npc/$n, $mpt/$n))"
}
run ar ar -
run eagle3 eagle3 atlas
run "eagle3, cache cleared every forward (vanilla)" eagle3 atlas --clear-cache
run specfit specfit atlas
run "specfit-lambda (λ 0.05)" specfit-lambda atlas --lambda 0.05
run specfit-resident specfit-resident atlas
run specfit specfit "predictor:$out/predictor.safetensors"
run specfit specfit corrupt:0.4
