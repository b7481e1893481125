#!/usr/bin/env bash
# The session's final allocator (after the review fold: a closed stripe
# reopens; stripe length capped): the GPU tests (exhaustion included), the
# heap-whole workloads, memcheck over both sanitizer sets, and frag and
# single kernel alone once.
set -u
R=results/final-b; mkdir -p $R
S=.gpu-var/final
timeout 200 $S/test-gpu --include-ignored --test-threads=1 --nocapture > $R/tests.log 2>&1; echo "tests rc=$?"
timeout 100 $S/test-gpu_heap_whole --include-ignored --test-threads=1 --nocapture > $R/heap-whole.log 2>&1; echo "heap-whole rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $S/test-gpu --include-ignored --test-threads=1 selftest every_class mixed_sizes bad_frees a_launch_with > $R/memcheck.log 2>&1; echo "memcheck rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $S/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests > $R/memcheck-hw.log 2>&1; echo "memcheck hw rc=$?"
timeout 60 $S/gpumalloc bench frag --iters 10 --allocators ours,bump-bound --out $R/frag > $R/frag.log 2>&1; echo "frag rc=$?"
timeout 60 $S/gpumalloc bench single --queued --iters 5 --allocators ours,bump-bound --out $R/single > $R/single.log 2>&1; echo "single rc=$?"
tar czf $OUT/final-b.tgz $R
