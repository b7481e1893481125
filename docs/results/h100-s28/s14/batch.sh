#!/bin/bash
# Batch 2 (s28): 16 KiB as a slice class (s14) against main (diag), interleaved; spans; s14's GPU tests.
set -u
R=/tmp/b2; mkdir -p $R
ROUNDS=3 ITERS=5 BUDGET_S=270 HEAP_WHOLE=1 HEAP_WHOLE_END_S=330 VARIANTS="diag s14" OUT=$R/cmp scripts/bench-compare.sh > $R/cmp.log 2>&1
for p in 1 2; do for b in diag s14; do
  timeout 60 .gpu-var/$b/gpumalloc bench frag --iters 3 --allocators ours --out $R/frag-$b-$p > $R/frag-$b-$p.log 2>&1
done; done
timeout 100 .gpu-var/s14/test-gpu --include-ignored --test-threads=1 > $R/s14-tests.log 2>&1; echo "s14 test-gpu rc=$?" >> $R/summary.txt
cd /tmp && tar czf $1/b2.tgz b2
