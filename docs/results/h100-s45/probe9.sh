#!/usr/bin/env bash
# Stripe size: 64 (stripe1, stripe2), 32 and 16 blocks, against main:
# kernel alone, two interleaved rounds, and two frag runs each.
set -u
R=results/probe9; mkdir -p $R
B=.gpu-var
V="main stripe1 stripe1+sb32 stripe1+sb16 stripe2 stripe2+sb16"
for round in 1 2; do
for v in $V; do
timeout 60 $B/$v/gpumalloc bench single --queued --iters 5 --allocators ours --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single rc=$?"
timeout 40 $B/$v/gpumalloc bench mixed --queued --iters 10 --allocators ours --out $R/$v-mixed-$round > $R/$v-mixed-$round.log 2>&1; echo "$v mixed rc=$?"
timeout 60 $B/$v/gpumalloc bench frag --iters 5 --allocators ours --out $R/$v-frag-$round > $R/$v-frag-$round.log 2>&1; echo "$v frag rc=$?"
done
done
tar czf $OUT/probe9.tgz $R
