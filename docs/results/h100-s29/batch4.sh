#!/bin/bash
# Batch 4 (s29): GPU suite and sanitizers on main with slot words a line apart; issue 15's done-when run (both timings); remat search latency of main-before-session against now on this quiet CPU.
set -u
R=/tmp/s29b4; mkdir -p $R/rep
( BIN_A=.gpu-var/remat-main/remat BIN_B=.gpu-var/remat-now/remat NAME_A=s28 NAME_B=s29 STEP_TIMEOUT=120 timeout 420 scripts/remat-latency-compare.sh 5 $R/remat-lat > $R/remat-lat.log 2>&1; echo "remat-lat rc=$?" >> $R/summary.txt ) &
GPUMALLOC_BIN=.gpu OUT=$R/suite BENCH=" " STEP_TIMEOUT=200 SANITIZER_THREADS=4096 timeout 330 scripts/gpu-suite.sh > $R/suite.log 2>&1; echo "suite rc=$?" >> $R/summary.txt
for i in 1 2 3; do
  timeout 40 .gpu/test-gpu --include-ignored --test-threads=1 --nocapture exhaustion > $R/rep/exh-$i.log 2>&1; echo "exh $i rc=$?" >> $R/summary.txt
done
wait
for t in single mixed frag; do
  timeout 50 .gpu/gpumalloc bench $t --iters 10 --allocators ours,bump-bound --out $R/i15/$t > $R/i15-$t.log 2>&1; echo "$t rc=$?" >> $R/summary.txt
  timeout 50 .gpu/gpumalloc bench $t --iters 10 --queued --allocators ours,bump-bound --out $R/i15q/$t > $R/i15q-$t.log 2>&1; echo "$t queued rc=$?" >> $R/summary.txt
done
cd /tmp && tar czf $1/s29b4.tgz s29b4
