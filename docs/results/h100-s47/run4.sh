#!/usr/bin/env bash
# 64 KiB (s16), and 64 and 128 KiB (s17), as slice classes against the
# default (auto): the s17 build's GPU tests, heap-whole workloads and
# memcheck over both first; then two interleaved rounds of single (kernel
# alone and default timing), mixed kernel alone, and one frag each.
set -u
R=results/run4; mkdir -p $R/d
V=.gpu-var/s17
timeout 150 $V/test-gpu --include-ignored --test-threads=1 --nocapture > $R/s17-tests.log 2>&1; echo "s17 tests rc=$?"
timeout 100 $V/test-gpu_heap_whole --include-ignored --test-threads=1 --nocapture > $R/s17-heap-whole.log 2>&1; echo "s17 heap-whole rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $V/test-gpu --include-ignored --test-threads=1 selftest every_class mixed_sizes bad_frees a_launch_with > $R/s17-memcheck.log 2>&1; echo "s17 memcheck rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $V/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests > $R/s17-memcheck-hw.log 2>&1; echo "s17 memcheck hw rc=$?"
for round in 1 2; do
for v in auto s16 s17; do
timeout 60 .gpu-var/$v/gpumalloc bench single --queued --iters 5 --allocators ours,bump-bound --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single rc=$?"
timeout 60 .gpu-var/$v/gpumalloc bench single --iters 5 --allocators ours,bump-bound --out $R/d/$v-single-$round > $R/$v-dsingle-$round.log 2>&1; echo "$v dsingle rc=$?"
timeout 40 .gpu-var/$v/gpumalloc bench mixed --queued --iters 10 --allocators ours,bump-bound --out $R/$v-mixed-$round > $R/$v-mixed-$round.log 2>&1; echo "$v mixed rc=$?"
done
done
for v in auto s17; do
timeout 60 .gpu-var/$v/gpumalloc bench frag --iters 10 --allocators ours --out $R/$v-frag > $R/$v-frag.log 2>&1; echo "$v frag rc=$?"
done
tar czf $OUT/run4.tgz $R
