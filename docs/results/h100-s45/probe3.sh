#!/usr/bin/env bash
set -u
R=results/probe3; mkdir -p $R
B=.gpu-var
timeout 100 $B/stripe3+iclock2/gpumalloc bench frag --iters 3 --allocators ours --out $R/frag > $R/frag.log 2>&1; echo "frag rc=$?"
for s in 256 512 4096; do
timeout 60 $B/stripe3+iclock2/gpumalloc bench frag --iters 3 --lo $s --hi $s --allocators ours --out $R/frag-$s > $R/frag-$s.log 2>&1; echo "frag $s rc=$?"
done
tar czf $OUT/probe3.tgz $R
