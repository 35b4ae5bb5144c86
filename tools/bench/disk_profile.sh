#!/usr/bin/env bash
# What this machine's disk gives to random O_DIRECT reads at the block sizes the tiers read
# (64 KiB: a GGUF expert part's 4 KiB-aligned cover at small scale; 2.6 MB and 5 MB: one
# Qwen3-30B-A3B expert as Q4_K_M and as Q8_0) and queue depths 1 to 64, with fio (io_uring, one
# job), REPS alternating sweeps. Writes one JSON line per cell and sweep to OUT (default
# bench-results/disk_profile.jsonl) and prints the median MB/s [min–max] of each cell.
# Usage: tools/bench/disk_profile.sh [REPS] [SECONDS] [FILE_GIB] [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
secs=${2:-5}
gib=${3:-8}
out=${4:-bench-results/disk_profile.jsonl}
command -v fio >/dev/null || { echo "fio is needed: apt-get install fio" >&2; exit 2; }
mkdir -p "$(dirname "$out")" bench-results
file=bench-results/disk_profile.data
# A file of real (not sparse) blocks, written once.
if [ ! -f "$file" ] || [ "$(stat -c %s "$file")" -ne $((gib << 30)) ]; then
    fio --name=fill --filename="$file" --size="${gib}G" --rw=write --bs=4M --direct=1 \
        --ioengine=io_uring --iodepth=8 --output-format=terse >/dev/null
fi
tmp=$out.tmp
: >"$tmp"
for rep in $(seq "$reps"); do
    for bs in 65536 2600960 5001216; do
        for qd in 1 2 4 8 16 32 64; do
            fio --name=rand --filename="$file" --rw=randread --bs="$bs" --direct=1 \
                --ioengine=io_uring --iodepth="$qd" --runtime="$secs" --time_based \
                --randrepeat=0 --norandommap --output-format=json |
                python3 -c '
import json, sys
j = json.loads(sys.stdin.read())["jobs"][0]["read"]
print(json.dumps({"sweep": int(sys.argv[3]), "block_bytes": int(sys.argv[1]),
    "queue_depth": int(sys.argv[2]), "mb_per_s": j["bw_bytes"] / 1e6, "iops": j["iops"],
    "clat_p50_us": j["clat_ns"]["percentile"]["50.000000"] / 1e3,
    "clat_p99_us": j["clat_ns"]["percentile"]["99.000000"] / 1e3}))' "$bs" "$qd" "$rep" >>"$tmp"
        done
    done
done
mv "$tmp" "$out"
python3 - "$out" "$reps" "$secs" "$gib" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
depths = sorted({r["queue_depth"] for r in rows})
print("| block | " + " | ".join(f"QD {d}" for d in depths) + " |")
print("|---|" + "---|" * len(depths))
for bs in sorted({r["block_bytes"] for r in rows}):
    cells = []
    for d in depths:
        v = [r["mb_per_s"] for r in rows if r["block_bytes"] == bs and r["queue_depth"] == d]
        cells.append(f"{statistics.median(v):.0f} [{min(v):.0f}–{max(v):.0f}]")
    print(f"| {bs} B | " + " | ".join(cells) + " |")
print(f"(MB/s, median [min–max] of {sys.argv[2]} alternating sweeps; fio, one job, io_uring, "
      f"O_DIRECT, random reads, {sys.argv[3]} s per cell, {sys.argv[4]} GiB file) -> {sys.argv[1]}")
PY
