#!/usr/bin/env bash
# `lowest` (a lowered stripe that also refills from the run at the lowest
# free id) against `lower` (14e7baf) and main (5cd9d2f): two interleaved
# rounds of frag, and single and mixed kernel alone; one default-timed
# single each of main and lowest.
set -u
R=results/run2; mkdir -p $R/d
for round in 1 2; do
for v in main lower lowest; do
timeout 60 .gpu-var/$v/gpumalloc bench frag --iters 10 --allocators ours,bump-bound --out $R/$v-frag-$round > $R/$v-frag-$round.log 2>&1; echo "$v frag rc=$?"
timeout 60 .gpu-var/$v/gpumalloc bench single --queued --iters 5 --allocators ours,bump-bound --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single rc=$?"
timeout 40 .gpu-var/$v/gpumalloc bench mixed --queued --iters 10 --allocators ours,bump-bound --out $R/$v-mixed-$round > $R/$v-mixed-$round.log 2>&1; echo "$v mixed rc=$?"
done
done
for v in main lowest; do
timeout 60 .gpu-var/$v/gpumalloc bench single --iters 5 --allocators ours,bump-bound --out $R/d/$v-single-1 > $R/$v-dsingle-1.log 2>&1; echo "$v dsingle rc=$?"
done
tar czf $OUT/run2.tgz $R
