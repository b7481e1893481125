#!/bin/bash
# Batch 7 (s28): the GPU suite and sanitizers on main with blk3 and null-window merged, exhaustion repeated, issue 15's done-when run.
set -u
R=/tmp/b7; mkdir -p $R/rep
GPUMALLOC_BIN=.gpu OUT=$R/suite BENCH=" " STEP_TIMEOUT=200 SANITIZER_THREADS=4096 timeout 400 scripts/gpu-suite.sh > $R/suite.log 2>&1; echo "suite rc=$?" >> $R/summary.txt
for i in 1 2 3 4 5; do
  timeout 40 .gpu/test-gpu --include-ignored --test-threads=1 --nocapture exhaustion > $R/rep/exh-$i.log 2>&1; echo "exh $i rc=$?" >> $R/summary.txt
done
for t in single mixed frag; do
  timeout 60 .gpu/gpumalloc bench $t --iters 10 --allocators ours,bump-bound --out $R/i15/$t > $R/i15-$t.log 2>&1; echo "$t rc=$?" >> $R/summary.txt
  timeout 60 .gpu/gpumalloc bench $t --iters 10 --queued --allocators ours,bump-bound --out $R/i15q/$t > $R/i15q-$t.log 2>&1; echo "$t queued rc=$?" >> $R/summary.txt
done
cd /tmp && tar czf $1/b7.tgz b7
