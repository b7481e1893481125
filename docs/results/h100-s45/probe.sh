#!/usr/bin/env bash
# Probe: spares/runs off (ours-nospares) against the default, speed and span.
set -u
R=results/probe; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
B=.gpu-var
for round in 1 2; do
  timeout 120 $B/main/gpumalloc bench single --queued --iters 10 --allocators ours,ours-nospares,bump-bound --out $R/single-q-$round > $R/single-q-$round.log 2>&1; echo "single-q-$round rc=$?"
  timeout 120 $B/main/gpumalloc bench mixed --queued --iters 10 --allocators ours,ours-nospares,bump-bound --out $R/mixed-q-$round > $R/mixed-q-$round.log 2>&1; echo "mixed-q-$round rc=$?"
done
timeout 120 $B/main/gpumalloc bench frag --iters 5 --allocators ours,ours-nospares,bump-bound --out $R/frag > $R/frag.log 2>&1; echo "frag rc=$?"
timeout 120 $B/iclock2/gpumalloc bench frag --iters 3 --allocators ours,ours-nospares --out $R/frag-iclock2 > $R/frag-iclock2.log 2>&1; echo "frag-iclock2 rc=$?"
tar czf $OUT/probe.tgz $R
