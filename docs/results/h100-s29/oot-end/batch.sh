#!/bin/bash
# Batch 1 (s29): does moving the out-of-tree window words to the end of the metadata recover 256 B? pre / now / oot-end interleaved.
set -u
R=/tmp/s29b1; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/smi.txt 2>&1
ROUNDS=5 ITERS=7 BUDGET_S=230 STEP_S=40 VARIANTS="pre now oot-end" EXTRA="--queued" OUT=$R/queued scripts/bench-compare.sh > $R/queued.log 2>&1
ROUNDS=4 ITERS=7 BUDGET_S=200 STEP_S=40 VARIANTS="pre now oot-end" OUT=$R/launch scripts/bench-compare.sh > $R/launch.log 2>&1
cd /tmp && tar czf $1/s29b1.tgz s29b1
