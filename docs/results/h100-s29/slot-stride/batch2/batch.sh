#!/bin/bash
# Batch 2 (s29): slot words a sector / a line apart (ss4, ss16) against main (now), interleaved, both timings; SASS of heap_alloc/install before and after null-window.
set -u
R=/tmp/s29b2; mkdir -p $R/sass
for v in pre now; do
  timeout 60 cuobjdump -sass .gpu-var/sass/$v.cubin > $R/sass/$v.all.sass 2>&1
done
ROUNDS=4 ITERS=7 BUDGET_S=210 STEP_S=40 VARIANTS="now ss4 ss16" EXTRA="--queued" OUT=$R/queued scripts/bench-compare.sh > $R/queued.log 2>&1
ROUNDS=4 ITERS=7 BUDGET_S=210 STEP_S=40 VARIANTS="now ss4 ss16" OUT=$R/launch scripts/bench-compare.sh > $R/launch.log 2>&1
for t in 262144 524288 2097152; do
  timeout 60 .gpu-var/now/gpumalloc bench single --queued --threads $t --iters 5 --allocators ours,bump-bound --out $R/threads-$t > $R/threads-$t.log 2>&1
done
cd /tmp && tar czf $1/s29b2.tgz s29b2
