#!/usr/bin/env bash
# The session's final builds, staged with scripts/stage-gpu.sh; results
# under results/$NAME: NAME=final the build with refills from held segments
# after the review fold, NAME=final2 (the default) that and 64 and 128 KiB
# slice classes. Two calls, since the tree and
# the whole of .gpu pass the device's 64 MiB carry:
#   PART=table (carry .gpu/gpumalloc, .gpu/test-gpu, .gpu/test-graph_gpu):
#     issue 15's table (exhaustion three times) and the dynamic-graph test;
#   PART=suite (carry .gpu without test-graph_gpu, test-gpu_vmm_peers and
#     lake-periodic): the GPU suite (QUICK=1 BENCH=single), which runs
#     memcheck, racecheck and synccheck; its graph step reads "not found"
#     and its two-GPU step is skipped on one GPU.
set -u
R=results/${NAME:-final2}; mkdir -p $R
OUT_TGZ=$OUT
if [ "${PART:-table}" = table ]; then
OUT=$R/table ITERS=10 REPEAT=3 GPUMALLOC_BIN=.gpu timeout 330 scripts/issue15-table.sh; echo "table rc=$?"
timeout 200 .gpu/test-graph_gpu --include-ignored --test-threads=1 --nocapture > $R/graph.log 2>&1; echo "graph rc=$?"
tar czf $OUT_TGZ/final-table.tgz $R
else
GPUMALLOC_BIN=.gpu QUICK=1 BENCH=single OUT=$R/suite timeout 560 scripts/gpu-suite.sh > $R/suite-console.log 2>&1; echo "suite rc=$?"
grep -E "^==|FAILED|skipped|SUMMARY" $R/suite-console.log | tail -30
tar czf $OUT_TGZ/final-suite.tgz --exclude="*.o" --exclude="*.ptx" --exclude="03_alloc_check*" $R
fi
