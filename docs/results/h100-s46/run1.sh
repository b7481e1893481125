#!/usr/bin/env bash
# A stripe lowered after the frees below it (`lower`, 14e7baf) against main
# (5cd9d2f): the GPU tests, the heap-whole workloads and memcheck on
# `lower`; then two interleaved rounds of single and mixed kernel alone and
# frag, and one default-timed single each.
set -u
R=results/run1; mkdir -p $R/d
S=.gpu-var/lower
timeout 200 $S/test-gpu --include-ignored --test-threads=1 --nocapture > $R/tests.log 2>&1; echo "tests rc=$?"
timeout 100 $S/test-gpu_heap_whole --include-ignored --test-threads=1 --nocapture > $R/heap-whole.log 2>&1; echo "heap-whole rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $S/test-gpu --include-ignored --test-threads=1 selftest every_class mixed_sizes bad_frees a_launch_with > $R/memcheck.log 2>&1; echo "memcheck rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $S/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests > $R/memcheck-hw.log 2>&1; echo "memcheck hw rc=$?"
for round in 1 2; do
for v in main lower; do
timeout 60 .gpu-var/$v/gpumalloc bench frag --iters 10 --allocators ours,bump-bound --out $R/$v-frag-$round > $R/$v-frag-$round.log 2>&1; echo "$v frag rc=$?"
timeout 60 .gpu-var/$v/gpumalloc bench single --queued --iters 5 --allocators ours,bump-bound --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single rc=$?"
timeout 40 .gpu-var/$v/gpumalloc bench mixed --queued --iters 10 --allocators ours,bump-bound --out $R/$v-mixed-$round > $R/$v-mixed-$round.log 2>&1; echo "$v mixed rc=$?"
done
done
for v in main lower; do
timeout 60 .gpu-var/$v/gpumalloc bench single --iters 5 --allocators ours,bump-bound --out $R/d/$v-single-1 > $R/$v-dsingle-1.log 2>&1; echo "$v dsingle rc=$?"
done
tar czf $OUT/run1.tgz $R
