#!/bin/bash
# Batch 5 (s28): block-class variants blk3a-c, and spares shared within groups of 2 / 4 slots (xs2, xs4) against main (m28): span and speed.
set -u
R=/tmp/b5; mkdir -p $R
for p in 1 2; do for b in m28 xs2 xs4; do
  timeout 60 .gpu-var/$b/gpumalloc bench frag --iters 3 --allocators ours --out $R/frag-$b-$p > $R/frag-$b-$p.log 2>&1
done; done
ROUNDS=2 ITERS=5 BUDGET_S=300 STEP_S=40 HEAP_WHOLE=1 HEAP_WHOLE_END_S=380 VARIANTS="m28 xs2 xs4 blk3a blk3b blk3c" OUT=$R/cmp scripts/bench-compare.sh > $R/cmp.log 2>&1
cd /tmp && tar czf $1/b5.tgz b5
