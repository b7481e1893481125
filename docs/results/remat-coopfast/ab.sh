#!/bin/bash
# usage: ab.sh OUT ROUNDS BIN...   (interleaved harness runs)
out=$1; rounds=$2; shift 2
mkdir -p $out
cd /work/wt-coopfast
for ((k=1;k<=rounds;k++)); do
  for b in "$@"; do
    n=$(basename $b)
    $b docs/results/remat/resnet50.remat.gz docs/results/remat/swin_t.remat.gz --reps 5 > $out/$n.$k.txt
  done
done
