#!/usr/bin/env bash
set -u
R=results/probe4; mkdir -p $R
B=.gpu-var
for round in 1 2; do
for v in main stripe3 stripe3+iclock2; do
timeout 100 $B/$v/gpumalloc bench single --queued --iters 5 --allocators ours --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single rc=$?"
done
done
tar czf $OUT/probe4.tgz $R
