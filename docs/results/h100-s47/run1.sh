#!/usr/bin/env bash
# Refills from held segments (`auto`, GPUMALLOC_STRIPE_REUSE=1, the new
# default) against the rule before (`reuse0`): three interleaved rounds of
# frag (with the occupancy and segment maps), single and mixed kernel
# alone and (d/) with the default timing. run1: the first form (the class
# tree looked at on every refill); RUN=run2: the second (only on a skip).
set -u
RUN=${RUN:-run1}; R=results/$RUN; mkdir -p $R/d
for round in 1 2 3; do
for v in reuse0 auto; do
GPUMALLOC_FRAG_MAP=1 timeout 60 .gpu-var/$v/gpumalloc bench frag --iters 10 --allocators ours,bump-bound --out $R/$v-frag-$round > $R/$v-frag-$round.log 2>&1; echo "$v frag rc=$?"
timeout 60 .gpu-var/$v/gpumalloc bench single --queued --iters 5 --allocators ours,bump-bound --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single rc=$?"
timeout 40 .gpu-var/$v/gpumalloc bench mixed --queued --iters 10 --allocators ours,bump-bound --out $R/$v-mixed-$round > $R/$v-mixed-$round.log 2>&1; echo "$v mixed rc=$?"
timeout 60 .gpu-var/$v/gpumalloc bench single --iters 5 --allocators ours,bump-bound --out $R/d/$v-single-$round > $R/$v-dsingle-$round.log 2>&1; echo "$v dsingle rc=$?"
done
done
tar czf $OUT/$RUN.tgz $R
