#!/usr/bin/env bash
# The session's final default (lowered stripes of 48 blocks, refilled from
# the lowest free id), staged with scripts/stage-gpu.sh: issue 15's table
# (exhaustion three times), then the GPU suite (QUICK=1 BENCH=single).
set -u
R=results/final; mkdir -p $R
git log --oneline -1 > $R/commit.txt 2>/dev/null || true
OUT_TGZ=$OUT
OUT=$R/table ITERS=10 REPEAT=3 GPUMALLOC_BIN=.gpu timeout 400 scripts/issue15-table.sh; echo "table rc=$?"
tar czf $OUT_TGZ/final-table.tgz $R
