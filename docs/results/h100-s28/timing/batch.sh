#!/bin/bash
# Batch 1 (s28): where the Launch timing's extra time goes; blk-add's intermittent failures repeated.
set -u
R=/tmp/b1; mkdir -p $R/rep
G=.gpu-var/diag/gpumalloc
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
for p in 1 2; do
  timeout 120 $G bench single --iters 5 --allocators ours,bump-bound --out $R/launch-$p > $R/launch-$p.log 2>&1
  timeout 120 $G bench single --iters 5 --queued --allocators ours,bump-bound --out $R/q200-$p > $R/q200-$p.log 2>&1
  GPUMALLOC_QUEUED_HOLD_US=0 timeout 120 $G bench single --iters 5 --queued --allocators ours,bump-bound --out $R/q0-$p > $R/q0-$p.log 2>&1
  GPUMALLOC_QUEUED_HOLD_US=20 timeout 120 $G bench single --iters 5 --queued --allocators ours,bump-bound --out $R/q20-$p > $R/q20-$p.log 2>&1
done
CUDA_MODULE_LOADING=EAGER timeout 120 $G bench single --iters 5 --allocators ours,bump-bound --out $R/eager > $R/eager.log 2>&1
for i in $(seq 1 8); do
  for b in blk main; do
    if [ $b = blk ]; then d=.gpu-var/blktest; else d=.gpu; fi
    timeout 60 $d/test-gpu --include-ignored --test-threads=1 --nocapture exhaustion > $R/rep/$b-exh-$i.log 2>&1; echo "$b exh $i rc=$?" >> $R/rep/summary.txt
  done
done
for i in 1 2 3; do
  for b in blk main; do
    if [ $b = blk ]; then d=.gpu-var/blktest; else d=.gpu; fi
    timeout 90 compute-sanitizer --tool memcheck $d/test-gpu_heap_whole --include-ignored --test-threads=1 --nocapture random_sizes > $R/rep/$b-randmc-$i.log 2>&1; echo "$b randmc $i rc=$?" >> $R/rep/summary.txt
  done
done
grep -h "pass 1\|round [0-9]:\|after recovery" $R/rep/*.log > $R/rep/lines.txt
cd /tmp && tar czf $1/b1.tgz b1
