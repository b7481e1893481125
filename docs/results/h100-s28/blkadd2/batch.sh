#!/bin/bash
# Batch 3 (s28): blk-add2 (bk2) and block classes formatted without the lock at half a segment (bh1) against main (s14).
set -u
R=/tmp/b3; mkdir -p $R/rep
ROUNDS=3 ITERS=5 BUDGET_S=200 STEP_S=40 HEAP_WHOLE=1 HEAP_WHOLE_END_S=260 VARIANTS="s14 bk2 bh1" OUT=$R/cmp scripts/bench-compare.sh > $R/cmp.log 2>&1
for i in $(seq 1 8); do
  timeout 40 .gpu-var/bk2/test-gpu --include-ignored --test-threads=1 --nocapture exhaustion > $R/rep/bk2-exh-$i.log 2>&1; echo "bk2 exh $i rc=$?" >> $R/rep/summary.txt
  if [ $i -le 3 ]; then
    timeout 40 .gpu-var/s14/test-gpu --include-ignored --test-threads=1 --nocapture exhaustion > $R/rep/s14-exh-$i.log 2>&1; echo "s14 exh $i rc=$?" >> $R/rep/summary.txt
    timeout 60 compute-sanitizer --tool memcheck .gpu-var/bk2/test-gpu_heap_whole --include-ignored --test-threads=1 --nocapture random_sizes > $R/rep/bk2-randmc-$i.log 2>&1; echo "bk2 randmc $i rc=$?" >> $R/rep/summary.txt
  fi
done
grep -h "pass 1\|round [0-9]:\|after recovery" $R/rep/*.log > $R/rep/lines.txt
cd /tmp && tar czf $1/b3.tgz b3
