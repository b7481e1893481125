#!/usr/bin/env bash
# Stripes of 48 blocks (`sb48`) against 64 (`lowest`, the default) on the
# lowered stripe: three interleaved rounds of single and mixed, kernel alone
# and (d/) with the default timing, and frag.
set -u
R=results/run4; mkdir -p $R/d
for round in 1 2 3; do
for v in lowest sb48; do
timeout 60 .gpu-var/$v/gpumalloc bench single --queued --iters 5 --allocators ours,bump-bound --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single rc=$?"
timeout 40 .gpu-var/$v/gpumalloc bench mixed --queued --iters 10 --allocators ours,bump-bound --out $R/$v-mixed-$round > $R/$v-mixed-$round.log 2>&1; echo "$v mixed rc=$?"
timeout 60 .gpu-var/$v/gpumalloc bench single --iters 5 --allocators ours,bump-bound --out $R/d/$v-single-$round > $R/$v-dsingle-$round.log 2>&1; echo "$v dsingle rc=$?"
timeout 40 .gpu-var/$v/gpumalloc bench mixed --iters 10 --allocators ours,bump-bound --out $R/d/$v-mixed-$round > $R/$v-dmixed-$round.log 2>&1; echo "$v dmixed rc=$?"
timeout 60 .gpu-var/$v/gpumalloc bench frag --iters 10 --allocators ours,bump-bound --out $R/$v-frag-$round > $R/$v-frag-$round.log 2>&1; echo "$v frag rc=$?"
done
done
tar czf $OUT/run4.tgz $R
