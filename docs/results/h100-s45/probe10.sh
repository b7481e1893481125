#!/usr/bin/env bash
# Stripes of 64 blocks (auto, the default) against 32 (sb32, 32 B keeping
# two-segment stripes): three interleaved rounds of single and mixed with
# both timings, two frag runs each.
set -u
R=results/probe10; mkdir -p $R
B=.gpu-var
for round in 1 2 3; do
for v in auto sb32; do
timeout 60 $B/$v/gpumalloc bench single --queued --iters 5 --allocators ours,bump-bound --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single rc=$?"
timeout 40 $B/$v/gpumalloc bench mixed --queued --iters 10 --allocators ours,bump-bound --out $R/$v-mixed-$round > $R/$v-mixed-$round.log 2>&1; echo "$v mixed rc=$?"
timeout 60 $B/$v/gpumalloc bench single --iters 5 --allocators ours,bump-bound --out $R/d/$v-single-$round > $R/$v-dsingle-$round.log 2>&1; echo "$v dsingle rc=$?"
timeout 40 $B/$v/gpumalloc bench mixed --iters 10 --allocators ours,bump-bound --out $R/d/$v-mixed-$round > $R/$v-dmixed-$round.log 2>&1; echo "$v dmixed rc=$?"
done
done
for round in 1 2; do
for v in auto sb32; do
timeout 60 $B/$v/gpumalloc bench frag --iters 10 --allocators ours,bump-bound --out $R/$v-frag-$round > $R/$v-frag-$round.log 2>&1; echo "$v frag rc=$?"
done
done
tar czf $OUT/probe10.tgz $R
