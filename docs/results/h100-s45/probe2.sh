#!/usr/bin/env bash
# Stripes: correctness of stripe3 (GPU tests, memcheck, exhaustion), then
# main against stripe1/2/3 interleaved (single, mixed kernel alone; frag).
set -u
R=results/probe2; mkdir -p $R
B=.gpu-var
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
S=$B/stripe3
timeout 240 $S/test-gpu --include-ignored --test-threads=1 --nocapture > $R/s3-tests.log 2>&1; echo "s3 tests rc=$?"
timeout 180 $S/test-gpu_heap_whole --include-ignored --test-threads=1 --nocapture > $R/s3-heap-whole.log 2>&1; echo "s3 heap-whole rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $S/test-gpu --include-ignored --test-threads=1 selftest every_class mixed_sizes bad_frees a_launch_with > $R/s3-memcheck.log 2>&1; echo "s3 memcheck rc=$?"
GPUMALLOC_TEST_THREADS=4096 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $S/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests > $R/s3-memcheck-hw.log 2>&1; echo "s3 memcheck hw rc=$?"
for round in 1 2; do
  for v in main stripe1 stripe2 stripe3; do
    timeout 90 $B/$v/gpumalloc bench single --queued --iters 10 --allocators ours,bump-bound --out $R/$v-single-$round > $R/$v-single-$round.log 2>&1; echo "$v single $round rc=$?"
    timeout 60 $B/$v/gpumalloc bench mixed --queued --iters 10 --allocators ours,bump-bound --out $R/$v-mixed-$round > $R/$v-mixed-$round.log 2>&1; echo "$v mixed $round rc=$?"
  done
done
for v in main stripe1 stripe2 stripe3; do
  timeout 60 $B/$v/gpumalloc bench frag --iters 5 --allocators ours --out $R/$v-frag > $R/$v-frag.log 2>&1; echo "$v frag rc=$?"
done
tar czf $OUT/probe2.tgz $R
