#!/usr/bin/env bash
# ncu-alloc.sh: where `heap_alloc`'s time goes, per size (issue 15). On a GPU
# machine from the repository root with `.gpu` carried (scripts/stage-gpu.sh):
# Nsight Compute profiles the timed round's `heap_alloc` of `gpumalloc bench
# single` at the sizes in SIZES (16 B … 4 KiB, 2^20 threads) and of `bench
# mixed`, with the full section set and SASS-level source counters, and
# writes for each: the report (NAME.ncu-rep), its details page
# (NAME.details.txt) and the SASS lines with the most warp stall samples
# (NAME.hot.txt, by scripts/ncu-hot.py from the SASS page NAME.source.csv). $OUT defaults
# to results/ncu-alloc.
#   OUT=/tmp/ncu SIZES="16 128 1024" scripts/ncu-alloc.sh
# KERNEL=heap_free profiles the free kernel of the same rounds instead (each
# round launches one heap_alloc and one heap_free, so the skips are the same).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/ncu-alloc}
SIZES=${SIZES:-"16 128 256 1024 4096"}
BIN=${GPUMALLOC_BIN:-.gpu}
KERNEL=${KERNEL:-heap_alloc}
mkdir -p "$OUT"
command -v ncu > /dev/null || PATH=$PATH:/usr/local/cuda/bin
# bench single runs the sizes 16 B, 32 B, … in order, one warm-up and
# --iters 1 timed round each: the timed round of size 2^k is heap_alloc's
# launch 2(k-4)+1.
profile() { # NAME SKIP ARGS...
  local name=$1 skip=$2; shift 2
  timeout 240 ncu --kernel-name "$KERNEL" --launch-skip "$skip" --launch-count 1 \
    --set full --import-source no -f -o "$OUT/$name" \
    "$BIN/gpumalloc" bench "$@" --iters 1 --allocators ours --out "$OUT/bench-$name" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$?" >> "$OUT/summary.txt"
  timeout 60 ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/$name.details.txt" 2>&1
  timeout 60 ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/$name.source.csv" 2>&1
  python3 scripts/ncu-hot.py "$OUT/$name.source.csv" > "$OUT/$name.hot.txt" 2>&1
}
for size in $SIZES; do
  k=0; while (( (1 << (k + 4)) < size )); do k=$((k + 1)); done
  profile "single-$size" $((2 * k + 1)) single
done
profile mixed 1 mixed
cat "$OUT/summary.txt"
