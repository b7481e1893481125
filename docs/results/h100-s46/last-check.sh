#!/usr/bin/env bash
# The last commit's build (a no-behaviour simplification of release_blocks):
# the GPU tests, the heap-whole workloads and memcheck over both sets.
set -u
R=results/last-check; mkdir -p $R
timeout 200 .gpu/test-gpu --include-ignored --test-threads=1 --nocapture > $R/tests.log 2>&1; echo "tests rc=$?"
timeout 100 .gpu/test-gpu_heap_whole --include-ignored --test-threads=1 --nocapture > $R/heap-whole.log 2>&1; echo "heap-whole rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 .gpu/test-gpu --include-ignored --test-threads=1 selftest every_class mixed_sizes bad_frees a_launch_with > $R/memcheck.log 2>&1; echo "memcheck rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 .gpu/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests > $R/memcheck-hw.log 2>&1; echo "memcheck hw rc=$?"
tar czf $OUT/last-check.tgz $R
