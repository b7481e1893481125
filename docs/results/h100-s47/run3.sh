#!/usr/bin/env bash
# The review fold's form of refills from held segments (`auto`) against
# the rule before (`reuse0`): three interleaved frag runs (maps on), and
# single and mixed kernel alone once each.
set -u
R=results/run3; mkdir -p $R
for round in 1 2 3; do
for v in reuse0 auto; do
GPUMALLOC_FRAG_MAP=1 timeout 60 .gpu-var/$v/gpumalloc bench frag --iters 10 --allocators ours,bump-bound --out $R/$v-frag-$round > $R/$v-frag-$round.log 2>&1; echo "$v frag rc=$?"
if [ $round = 1 ]; then
timeout 60 .gpu-var/$v/gpumalloc bench single --queued --iters 5 --allocators ours,bump-bound --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single rc=$?"
timeout 40 .gpu-var/$v/gpumalloc bench mixed --queued --iters 10 --allocators ours,bump-bound --out $R/$v-mixed-$round > $R/$v-mixed-$round.log 2>&1; echo "$v mixed rc=$?"
fi
done
done
gzip -9 $R/*-frag-*.log
tar czf $OUT/run3.tgz $R
