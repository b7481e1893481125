#!/usr/bin/env bash
# The closing read's refactor (one reservation step for the class-tree
# claims and the held-segment stripe claim; no intended behaviour change,
# but the claim paths' PTX block order moved): the GPU tests and memcheck
# over both sets on `auto` (this tree), then scripts/bench-compare.sh,
# `before` (the commit before the refactor) against `auto`, kernel alone.
set -u
R=results/refactor-check; mkdir -p $R
V=.gpu-var/auto
timeout 200 $V/test-gpu --include-ignored --test-threads=1 --nocapture > $R/tests.log 2>&1; echo "tests rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $V/test-gpu --include-ignored --test-threads=1 selftest every_class mixed_sizes bad_frees a_launch_with > $R/memcheck.log 2>&1; echo "memcheck rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $V/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests > $R/memcheck-hw.log 2>&1; echo "memcheck hw rc=$?"
OUT=$R/compare VARIANTS="before auto" ROUNDS=3 ITERS=5 EXTRA="--queued" HEAP_WHOLE=1 BUDGET_S=200 HEAP_WHOLE_END_S=260 timeout 300 scripts/bench-compare.sh > $R/compare.log 2>&1; echo "compare rc=$?"
tail -60 $R/compare.log
tar czf $OUT/refactor-check.tgz $R
