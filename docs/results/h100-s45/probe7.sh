#!/usr/bin/env bash
# The waiting stripe on every slice class (stripe3): the GPU tests, the
# heap-whole workloads, memcheck over both sanitizer sets, synccheck over
# the heap-whole ones.
set -u
R=results/probe7; mkdir -p $R
S=.gpu-var/stripe3
timeout 240 $S/test-gpu --include-ignored --test-threads=1 --nocapture > $R/s3-tests.log 2>&1; echo "s3 tests rc=$?"
timeout 120 $S/test-gpu_heap_whole --include-ignored --test-threads=1 --nocapture > $R/s3-heap-whole.log 2>&1; echo "s3 heap-whole rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $S/test-gpu --include-ignored --test-threads=1 selftest every_class mixed_sizes bad_frees a_launch_with > $R/s3-memcheck.log 2>&1; echo "s3 memcheck rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $S/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests > $R/s3-memcheck-hw.log 2>&1; echo "s3 memcheck hw rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 120 compute-sanitizer --tool synccheck --error-exitcode 9 $S/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests > $R/s3-synccheck-hw.log 2>&1; echo "s3 synccheck hw rc=$?"
tar czf $OUT/probe7.tgz $R
