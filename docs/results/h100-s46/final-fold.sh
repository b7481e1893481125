#!/usr/bin/env bash
# The review fold's build (aa82985: block classes have no stripe), staged
# with scripts/stage-gpu.sh: issue 15's table (exhaustion three times) and
# the GPU suite (QUICK=1 BENCH=single).
set -u
R=results/final-fold; mkdir -p $R
OUT_TGZ=$OUT
OUT=$R/table ITERS=10 REPEAT=3 GPUMALLOC_BIN=.gpu timeout 300 scripts/issue15-table.sh; echo "table rc=$?"
GPUMALLOC_BIN=.gpu QUICK=1 BENCH=single OUT=$R/suite timeout 420 scripts/gpu-suite.sh > $R/suite-console.log 2>&1; echo "suite rc=$?"
grep -E "^==|FAILED|skipped|SUMMARY" $R/suite-console.log | tail -30
tar czf $OUT_TGZ/final-fold.tgz --exclude="*.o" --exclude="*.ptx" --exclude="03_alloc_check*" $R
