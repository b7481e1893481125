#!/usr/bin/env bash
# Every GPU check and benchmark, in one command, on a machine with an NVIDIA
# GPU. Binaries come from $GPUMALLOC_BIN (default: build them with cargo).
# Logs and results go to $OUT (default results/gpu).
#   scripts/gpu-suite.sh                      # everything
#   QUICK=1 BENCH=single scripts/gpu-suite.sh # one benchmark, 3 rounds
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${GPUMALLOC_BIN:-}" ]; then scripts/stage-gpu.sh; GPUMALLOC_BIN=.gpu; fi
BIN=$GPUMALLOC_BIN
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
status=0
# step LOG CMD...: runs CMD into LOG (killed after $STEP_TIMEOUT seconds, so one
# hang cannot eat the run), shows its tail, records failure.
step() {
  local log=$1; shift
  echo "== $*"
  timeout "${STEP_TIMEOUT:-600}" "$@" > "$log" 2>&1
  local rc=$?
  tail -n "${TAIL:-25}" "$log"
  if [ $rc -ne 0 ]; then echo "FAILED ($rc): $*"; status=1; fi
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
step "$OUT/selftest.log" "$BIN/gpumalloc" selftest
step "$OUT/tests.log" "$BIN/test-gpu" --include-ignored --test-threads=1 --nocapture
step "$OUT/heap-whole.log" "$BIN/test-gpu_heap_whole" --include-ignored --test-threads=1 --nocapture
step "$OUT/lake.log" "$BIN/test-lake_gpu" --include-ignored --test-threads=1 --nocapture
step "$OUT/vmm-heap.log" "$BIN/test-gpu_vmm_heap" --include-ignored --test-threads=1 --nocapture
# Two GPUs (peer access): the test fails on one, so it runs only on two.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${gpus:-0}" -ge 2 ]; then
  step "$OUT/vmm-peers.log" "$BIN/test-gpu_vmm_peers" --include-ignored --test-threads=1 --nocapture
else
  echo "skipped: ${gpus:-0} GPU, test-gpu_vmm_peers needs 2" | tee "$OUT/vmm-peers.log"
fi
step "$OUT/call-cost.log" "$BIN/test-call_cost" --include-ignored --test-threads=1 --nocapture
step "$OUT/graph.log" "$BIN/test-graph_gpu" --include-ignored --test-threads=1 --nocapture
step "$OUT/example-01.log" "$BIN/01_first_alloc"
step "$OUT/example-02.log" "$BIN/02_linked_list"
if command -v "${NVCC:-nvcc}" >/dev/null; then
  step "$OUT/example-03.log" env GPU_DIR="$BIN" scripts/build-cpp-example.sh
else
  echo "== C++ example skipped: no nvcc"
fi
step "$OUT/example-04.log" "$BIN/04_growing_heap"
if [ -z "${SKIP_SANITIZER:-}" ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    TAIL=6 GPUMALLOC_TEST_THREADS=${SANITIZER_THREADS:-4096} step "$OUT/sanitizer-$tool.log" \
      compute-sanitizer --tool $tool --error-exitcode 9 \
      "$BIN/test-gpu" --include-ignored --test-threads=1 selftest every_class mixed_sizes bad_frees a_launch_with
  done
  # Issue 12's workloads on unchecked heaps (and the bad frees, both kinds).
  for tool in memcheck synccheck; do
    TAIL=6 GPUMALLOC_TEST_THREADS=${SANITIZER_THREADS:-4096} step "$OUT/sanitizer-heap-whole-$tool.log" \
      compute-sanitizer --tool $tool --error-exitcode 9 \
      "$BIN/test-gpu_heap_whole" --include-ignored --test-threads=1 random_sizes one_random_size bad_frees mixed_class large_requests
  done
fi
iters=10; [ -n "${QUICK:-}" ] && iters=3
for b in ${BENCH:-all}; do
  step "$OUT/bench-$b.log" "$BIN/gpumalloc" bench "$b" --iters $iters --out "$OUT/bench"
done
exit $status
