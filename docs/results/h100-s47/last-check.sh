#!/usr/bin/env bash
# The review fold of the 64 / 128 KiB slice classes (the bitmap sized for
# the class with the most blocks to a segment, the every-class GPU test
# with a block class again), staged with HEAP_WHOLE=1
# scripts/stage-variants.sh auto: the GPU tests, the heap-whole workloads
# and memcheck over both sets.
set -u
R=results/last-check; mkdir -p $R
V=.gpu-var/auto
timeout 200 $V/test-gpu --include-ignored --test-threads=1 --nocapture > $R/tests.log 2>&1; echo "tests rc=$?"
timeout 100 $V/test-gpu_heap_whole --include-ignored --test-threads=1 --nocapture > $R/heap-whole.log 2>&1; echo "heap-whole rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $V/test-gpu --include-ignored --test-threads=1 selftest every_class mixed_sizes bad_frees a_launch_with > $R/memcheck.log 2>&1; echo "memcheck rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $V/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests > $R/memcheck-hw.log 2>&1; echo "memcheck hw rc=$?"
tar czf $OUT/last-check.tgz $R
