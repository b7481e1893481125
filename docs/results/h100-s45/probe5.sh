#!/usr/bin/env bash
set -u
R=results/probe5; mkdir -p $R
B=.gpu-var
for round in 1 2; do
for v in main stripe3 stripe3np stripe3b8; do
timeout 100 $B/$v/gpumalloc bench single --queued --iters 5 --allocators ours --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single rc=$?"
done
done
for v in stripe3np stripe3b8; do
timeout 60 $B/$v/gpumalloc bench frag --iters 3 --allocators ours --out $R/$v-frag > $R/$v-frag.log 2>&1; echo "$v frag rc=$?"
done
tar czf $OUT/probe5.tgz $R
