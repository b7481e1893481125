#!/usr/bin/env bash
# The default build with class stripes (GPUMALLOC_STRIPE=2): issue 15's
# table (scripts/issue15-table.sh, exhaustion three times), then main and
# the default interleaved, kernel alone, twice.
set -u
R=results/final-a; mkdir -p $R/ab
OUT_TGZ=$OUT
OUT=$R/table ITERS=10 REPEAT=3 GPUMALLOC_BIN=.gpu-var/default scripts/issue15-table.sh
for round in 1 2; do
for v in main default; do
timeout 60 .gpu-var/$v/gpumalloc bench single --queued --iters 5 --allocators ours --out $R/ab/$v-single-$round > $R/ab-$v-single-$round.log 2>&1; echo "$v single rc=$?"
timeout 40 .gpu-var/$v/gpumalloc bench mixed --queued --iters 10 --allocators ours --out $R/ab/$v-mixed-$round > $R/ab-$v-mixed-$round.log 2>&1; echo "$v mixed rc=$?"
done
done
tar czf $OUT_TGZ/final-a.tgz $R
