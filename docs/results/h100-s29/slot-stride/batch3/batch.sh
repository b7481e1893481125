#!/bin/bash
# Batch 3 (s29): slot words a line apart (ss16), with every metadata region on a line of its own (ss16a), regions aligned alone (ss1a), against main (now); interleaved, both timings.
set -u
R=/tmp/s29b3; mkdir -p $R
ROUNDS=4 ITERS=7 BUDGET_S=230 STEP_S=40 VARIANTS="now ss16 ss16a ss1a" EXTRA="--queued" OUT=$R/queued scripts/bench-compare.sh > $R/queued.log 2>&1
ROUNDS=4 ITERS=7 BUDGET_S=230 STEP_S=40 VARIANTS="now ss16 ss16a ss1a" OUT=$R/launch scripts/bench-compare.sh > $R/launch.log 2>&1
cd /tmp && tar czf $1/s29b3.tgz s29b3
