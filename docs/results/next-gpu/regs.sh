#!/usr/bin/env bash
# regs.sh PHASE: the GPU runs for branch `regs` (issue 15: heap_alloc's
# registers; docs/PERF.md, "heap_alloc's registers: where the 162 come
# from"), and since the sixth session of 2026-11-23 for any build
# variant against main (VARIANTS, BUILD below; results of that session in
# docs/results/h100-s31/, of the eighth in docs/results/h100-s33/, where
# `split` became the default and `unsplit` names the shape before).
# Run from the repository root on the GPU machine, with carried:
#   .gpu-var/main/      gpumalloc of main's code shape (the default build)
#   .gpu-var/split/     GPUMALLOC_SPLIT_COLD=1: gpumalloc and everything
#                       scripts/gpu-suite.sh runs (scripts/stage-gpu.sh's set)
#   .gpu-var/split-b3/  GPUMALLOC_SPLIT_COLD=1 GPUMALLOC_ALLOC_BLOCKS_PER_SM=3:
#                       gpumalloc only (80 registers, spills on the fast path)
# (.gpu/gpumalloc, main's own stage, stands in for .gpu-var/main if that
# is missing.) Each phase fits one device call (under 10 minutes); every
# step runs under `timeout`. Results go to $OUT (default results/regs):
# one tarball per phase plus a short summary, so at most a few files come
# back.
#   docs/results/next-gpu/regs.sh compare          # default timing, ~8 min
#   docs/results/next-gpu/regs.sh compare-queued   # kernel alone (--queued)
#   docs/results/next-gpu/regs.sh suite            # GPU suite on split
#   docs/results/next-gpu/regs.sh memcheck         # memcheck on split
#   docs/results/next-gpu/regs.sh frag             # bench frag, 2 per variant
#   BUILD=sadd VARIANTS="main sadd" ...            # another build (sadd:
#                                                  # "16 B's fixed cost")
set -uo pipefail
cd "$(dirname "$0")/../../.."
phase=${1:?phase: compare, compare-queued, frag, suite or memcheck}
OUT=${OUT:-results/regs}
mkdir -p "$OUT"
work=$(mktemp -d /tmp/regs-$phase.XXXX)
VARIANTS=${VARIANTS:-"main split split-b3"}
# The build the suite and memcheck phases run (a folder of .gpu-var/
# staged whole by scripts/stage-gpu.sh).
BUILD=${BUILD:-split}
if [ ! -x .gpu-var/main/gpumalloc ] && [ -x .gpu/gpumalloc ]; then
  mkdir -p .gpu-var/main && cp .gpu/gpumalloc .gpu-var/main/
fi
chmod +x .gpu-var/*/* 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$work/gpu.txt" 2>&1
rc=0
case $phase in
  compare | compare-queued)
    extra=""; [ "$phase" = compare-queued ] && extra="--queued"
    # bench-compare's own budget ends its bench steps by 330 s; the outer
    # timeout only catches a hang.
    OUT=$work/cmp ROUNDS=${ROUNDS:-4} ITERS=${ITERS:-5} VARIANTS="$VARIANTS" EXTRA="$extra" \
      timeout 540 scripts/bench-compare.sh > "$work/log.txt" 2>&1 || rc=$?
    cp "$work/cmp/table.txt" "$OUT/$phase-table.txt" 2>/dev/null
    ;;
  frag)
    # `bench frag` (spans and where they go) twice per variant, in turn.
    for r in 1 2; do
      for v in $VARIANTS; do
        bin=.gpu-var/$v/gpumalloc; [ -x "$bin" ] || continue
        timeout 120 "$bin" bench frag --iters 3 --allocators ours > "$work/frag-$v-$r.log" 2>&1 || rc=$?
      done
    done
    for v in $VARIANTS; do
      for r in 1 2; do
        f=$work/frag-$v-$r.log; [ -f "$f" ] || continue
        echo "== $v round $r"
        awk '/frag — (span|spares|slot_unissued|idle_blocks)_over_requested/{p=1} p&&NF==0{p=0} p' "$f"
      done
    done > "$OUT/$phase-table.txt"
    ;;
  suite)
    # The allocator's GPU tests, examples and one quick `single` bench on
    # the split build; sanitizers in their own phase.
    GPUMALLOC_BIN=.gpu-var/$BUILD OUT=$work/suite SKIP_SANITIZER=1 QUICK=1 BENCH=single \
      STEP_TIMEOUT=240 timeout 560 scripts/gpu-suite.sh > "$work/log.txt" 2>&1 || rc=$?
    ;;
  memcheck)
    bin=.gpu-var/$BUILD
    GPUMALLOC_TEST_THREADS=4096 timeout 270 compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$bin/test-gpu" --include-ignored --test-threads=1 selftest every_class mixed_sizes bad_frees a_launch_with \
      > "$work/memcheck-gpu.log" 2>&1 || rc=$?
    GPUMALLOC_TEST_THREADS=4096 timeout 270 compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$bin/test-gpu_heap_whole" --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests \
      > "$work/memcheck-heap-whole.log" 2>&1 || rc=$(( rc ? rc : $? ))
    ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
{
  echo "phase $phase rc=$rc"; cat "$work/gpu.txt"
  grep -hE "ERROR SUMMARY|test result|FAILED|budget|^== " "$work"/*.log "$work"/*/*.log 2>/dev/null | head -60
  [ -f "$OUT/$phase-table.txt" ] && cat "$OUT/$phase-table.txt"
} > "$OUT/$phase-summary.txt"
tar czf "$OUT/regs-$phase.tgz" -C "$work" .
cat "$OUT/$phase-summary.txt"
exit $rc
