#!/usr/bin/env bash
# Issue 15, prepared in the fifth session of 2026-11-23 (no GPU was lent);
# ran in the sixth (docs/results/h100-s31/fixed-cost/, docs/PERF.md "16 B's
# fixed cost": the fixed part was the 16-64 B slot installs' CAS race on
# one segment word, removed by GPUMALLOC_SLICE_CLAIM_ADD):
# where 16 B's fixed ~0.07 ms goes. At 2^18 … 2^21 threads, 16 B allocation
# took 0.090 / 0.108 / 0.156 / 0.243 ms against the bump bound's 0.011 /
# 0.018 / 0.030 / 0.055 (docs/results/h100-s29/slot-stride/threads/), so
# about 0.07 ms does not scale with the threads; at 128 B it is ~0.03 ms.
# Hypothesis: the 32 slots' first installs each claim 4 blocks, and at 16 B
# a segment holds 128 blocks, so all 32 first claims meet on one segment's
# table and bitmap words (at 128 B, 16 blocks a segment, they spread over
# 8 segments). If so, `ours-nospares` (claims of 1) should show a smaller
# fixed part at 16 B, and the kernel-alone timing (`--queued`) should keep
# the same fixed part (it is in the kernel, not the launch).
#
# Run on the GPU machine from the repo root with `.gpu` carried (built here
# by scripts/stage-gpu.sh): OUT=/tmp/x docs/results/next-gpu/fixed-cost.sh
set -uo pipefail
OUT=${OUT:-/tmp/fixed-cost}
mkdir -p "$OUT"
for threads in 262144 524288 1048576 2097152; do
  for timing in "" "--queued"; do
    name=t$threads${timing:+-queued}
    timeout 60 .gpu/gpumalloc bench single --iters 5 --threads $threads $timing \
      --allocators ours,ours-nospares,bump-bound --out "$OUT/$name" > "$OUT/$name.log" 2>&1
    echo "$name rc=$?" >> "$OUT/summary.txt"
  done
done
