#!/bin/bash
# Batch 4 (s28): the GPU suite and sanitizers on main (16 KiB slices, blk-add2), then issue 15's done-when run.
set -u
R=/tmp/b4; mkdir -p $R
GPUMALLOC_BIN=.gpu OUT=$R/suite BENCH=" " STEP_TIMEOUT=200 SANITIZER_THREADS=4096 timeout 420 scripts/gpu-suite.sh > $R/suite.log 2>&1; echo "suite rc=$?" >> $R/summary.txt
for t in single mixed frag; do
  timeout 60 .gpu/gpumalloc bench $t --iters 10 --allocators ours,bump-bound --out $R/i15/$t > $R/i15-$t.log 2>&1; echo "$t rc=$?" >> $R/summary.txt
  timeout 60 .gpu/gpumalloc bench $t --iters 10 --queued --allocators ours,bump-bound --out $R/i15q/$t > $R/i15q-$t.log 2>&1; echo "$t queued rc=$?" >> $R/summary.txt
done
cd /tmp && tar czf $1/b4.tgz b4
