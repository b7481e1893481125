#!/usr/bin/env bash
# Where a warm round's span goes: `bench frag` on main with each round's
# occupancy map (GPUMALLOC_FRAG_MAP=1, one character per MiB), twice.
set -u
R=results/${MAP:-map1}; mkdir -p $R
for i in 1 2; do
GPUMALLOC_FRAG_MAP=1 timeout 120 .gpu-var/auto/gpumalloc bench frag --iters 10 --allocators ours --out $R/frag-$i > $R/frag-$i.log 2>&1; echo "frag $i rc=$?"
done
tar czf $OUT/${MAP:-map1}.tgz $R
