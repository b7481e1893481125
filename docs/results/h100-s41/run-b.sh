#!/usr/bin/env bash
# run-b.sh: 32 KiB as a slice class, the new default (.gpu-var/final, from
# scripts/stage-gpu.sh) against the default before (.gpu-var/auto/gpumalloc,
# main at b66252f): kernel alone and default timing, five processes per
# build interleaved; spans; the heap-whole tests (demand + 3%) and the
# sanitizers on the new build.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-results/s41b}
mkdir -p "$OUT"
chmod +x .gpu-var/*/* 2>/dev/null
# shellcheck source=docs/results/h100-s41/step.sh
source docs/results/h100-s41/step.sh
mkdir -p .gpu-var/new && cp .gpu-var/final/gpumalloc .gpu-var/new/
for phase in ${PHASES:-compare-queued compare frag}; do
  step "regs-$phase" 300 env VARIANTS="auto new" ROUNDS=5 ITERS=5 OUT="$OUT/$phase" \
    docs/results/next-gpu/regs.sh "$phase"
done
[ -n "${ONLY_COMPARE:-}" ] && { cat "$OUT/steps.txt"; exit 0; }
step memcheck 250 env BUILD=final OUT="$OUT/mc" docs/results/next-gpu/regs.sh memcheck
step sync 150 env GPUMALLOC_TEST_THREADS=4096 compute-sanitizer --tool synccheck --error-exitcode 9 \
  .gpu-var/final/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes mixed_class
step heap-whole 170 .gpu-var/final/test-gpu_heap_whole --include-ignored --test-threads=1 --nocapture
cat "$OUT/steps.txt"
