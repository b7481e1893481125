#!/usr/bin/env bash
# run-a.sh: the first GPU call of 2026-11-24's sixteenth session (issue 15).
# Synccheck on the default build (not run on the fifteenth session's final
# build), then the s15 variant (32 KiB a slice class) under memcheck, its
# heap-whole tests (demand + 3% among them) and `bench frag` beside auto.
# Carry .gpu-var/{auto,s15,s15+ws4} from scripts/stage-variants.sh (HEAP_WHOLE=1).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-results/s41a}
mkdir -p "$OUT"
chmod +x .gpu-var/*/* 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
# shellcheck source=docs/results/h100-s41/step.sh
source docs/results/h100-s41/step.sh
export GPUMALLOC_TEST_THREADS=4096
step sync-auto 200 compute-sanitizer --tool synccheck --error-exitcode 9 \
  .gpu-var/auto/test-gpu_heap_whole --include-ignored --test-threads=1 random_sizes mixed_class
step memcheck-s15 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
  .gpu-var/s15/test-gpu_heap_whole --include-ignored --test-threads=1 \
  random_sizes one_random_size bad_frees mixed_class large_requests
unset GPUMALLOC_TEST_THREADS
for v in s15 auto; do
  step "heap-whole-$v" 170 ".gpu-var/$v/test-gpu_heap_whole" --include-ignored --test-threads=1 --nocapture
done
for v in auto s15 s15+ws4; do
  step "frag-$v" 90 ".gpu-var/$v/gpumalloc" bench frag --iters 3 --allocators ours
done
grep -hE "ERROR SUMMARY|test result|FAILED|panicked" "$OUT"/*.log > "$OUT/summary.txt" 2>/dev/null
cat "$OUT/steps.txt" "$OUT/summary.txt"
