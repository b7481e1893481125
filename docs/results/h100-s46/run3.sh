#!/usr/bin/env bash
# `lowest` (the lowered stripe refilled from the lowest free id, with the
# frag bench printing each round's span) against stripes of 48 and 32
# blocks on it (`sb48`, `sb32`) and main: the GPU tests, heap-whole
# workloads and memcheck on `lowest`; two interleaved rounds of frag and of
# single and mixed kernel alone.
set -u
R=results/run3; mkdir -p $R
S=.gpu-var/lowest
timeout 200 $S/test-gpu --include-ignored --test-threads=1 --nocapture > $R/tests.log 2>&1; echo "tests rc=$?"
timeout 100 $S/test-gpu_heap_whole --include-ignored --test-threads=1 --nocapture > $R/heap-whole.log 2>&1; echo "heap-whole rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $S/test-gpu --include-ignored --test-threads=1 selftest every_class mixed_sizes bad_frees a_launch_with > $R/memcheck.log 2>&1; echo "memcheck rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $S/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests > $R/memcheck-hw.log 2>&1; echo "memcheck hw rc=$?"
for round in 1 2; do
for v in main lowest sb48 sb32; do
timeout 60 .gpu-var/$v/gpumalloc bench frag --iters 10 --allocators ours,bump-bound --out $R/$v-frag-$round > $R/$v-frag-$round.log 2>&1; echo "$v frag rc=$?"
timeout 60 .gpu-var/$v/gpumalloc bench single --queued --iters 5 --allocators ours,bump-bound --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single rc=$?"
timeout 40 .gpu-var/$v/gpumalloc bench mixed --queued --iters 10 --allocators ours,bump-bound --out $R/$v-mixed-$round > $R/$v-mixed-$round.log 2>&1; echo "$v mixed rc=$?"
done
done
tar czf $OUT/run3.tgz $R
