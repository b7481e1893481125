#!/usr/bin/env bash
# issue15-table.sh: the runs behind README's "Where issue 15 stands" table,
# on a GPU machine from the repository root with `.gpu` carried (built by
# scripts/stage-gpu.sh): `gpumalloc bench single`, `mixed` and `frag` with
# ours and the bump bound, once with the default timing and once with the
# kernel alone (`--queued`), then the exhaustion test REPEAT times (the test
# that caught an intermittent loss of blocks in an earlier claim change).
# Every step runs under `timeout`; logs and CSV go to $OUT (default
# results/issue15), a summary of exit codes to $OUT/summary.txt.
#   OUT=/tmp/i15 ITERS=10 REPEAT=6 scripts/issue15-table.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/issue15}
ITERS=${ITERS:-10}
REPEAT=${REPEAT:-6}
BIN=${GPUMALLOC_BIN:-.gpu}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
for t in single mixed frag; do
  for timing in "" --queued; do
    name=i15${timing:+q}-$t
    timeout 60 "$BIN/gpumalloc" bench "$t" --iters "$ITERS" $timing \
      --allocators ours,bump-bound --out "$OUT/$name" > "$OUT/$name.log" 2>&1
    echo "$name rc=$?" >> "$OUT/summary.txt"
  done
done
for ((i = 0; i < REPEAT; i++)); do
  timeout 60 "$BIN/test-gpu" --include-ignored --test-threads=1 --nocapture \
    exhaustion_returns_null_and_recovers > "$OUT/exhaustion-$i.log" 2>&1
  echo "exhaustion $i rc=$?" >> "$OUT/summary.txt"
done
cat "$OUT/summary.txt"
