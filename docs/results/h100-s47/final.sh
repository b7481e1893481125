#!/usr/bin/env bash
# The session's final build (refills from held segments, after the review
# fold), staged with scripts/stage-gpu.sh: issue 15's table (exhaustion
# three times) and the GPU suite (QUICK=1 BENCH=single), which runs
# memcheck, racecheck and synccheck.
set -u
R=results/final; mkdir -p $R
OUT_TGZ=$OUT
OUT=$R/table ITERS=10 REPEAT=3 GPUMALLOC_BIN=.gpu timeout 280 scripts/issue15-table.sh; echo "table rc=$?"
GPUMALLOC_BIN=.gpu QUICK=1 BENCH=single OUT=$R/suite timeout 290 scripts/gpu-suite.sh > $R/suite-console.log 2>&1; echo "suite rc=$?"
grep -E "^==|FAILED|skipped|SUMMARY" $R/suite-console.log | tail -30
tar czf $OUT_TGZ/final.tgz --exclude="*.o" --exclude="*.ptx" --exclude="03_alloc_check*" $R
