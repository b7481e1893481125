#!/bin/bash
# Batch 8 (s28): main (now) against the build just before null-window (pre), interleaved, both timings.
set -u
R=/tmp/b8; mkdir -p $R
ROUNDS=4 ITERS=7 BUDGET_S=200 STEP_S=40 VARIANTS="pre now" OUT=$R/launch scripts/bench-compare.sh > $R/launch.log 2>&1
ROUNDS=4 ITERS=7 BUDGET_S=200 STEP_S=40 VARIANTS="pre now" EXTRA="--queued" OUT=$R/queued scripts/bench-compare.sh > $R/queued.log 2>&1
cd /tmp && tar czf $1/b8.tgz b8
