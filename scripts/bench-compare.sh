#!/usr/bin/env bash
# bench-compare.sh: `gpumalloc bench single` and `mixed` for several builds
# in one GPU run, interleaved, so that builds are compared on the same
# machine in the same lease (issue 12's speed criterion is against be7ddc7).
#
# Builds: .gpu-base/gpumalloc (label "base", be7ddc7) and every
# .gpu-var/<variant>/gpumalloc (label <variant>), each a release build with
# the PTX embedded. Each process runs all sizes with --iters ITERS (median
# of ITERS rounds after a warm-up round); ROUNDS processes per build and
# test, in a rotated order each round. The table shows, per size and build,
# the median over rounds of the per-process medians (ms), and the alloc time
# relative to base.
#
#   OUT=/tmp/cmp scripts/bench-compare.sh          # defaults: 3 rounds, 7 iters
#   ROUNDS=2 ITERS=5 VARIANTS="main claim" scripts/bench-compare.sh
#   HEAP_WHOLE=1 ...  also runs .gpu-var/<v>/test-gpu_heap_whole where present
#   EXTRA="--threads 4096" ...  extra arguments for every `gpumalloc bench`
#   TESTS="single mixed frag" ...  the tests each round runs (default
#       "single mixed"); frag's spans and where they sit are tabled too, and
#       FRAG_MAP=1 prints its per-round maps and class breakdown in its logs
#   ROUNDS=0 OUT=dir ...  only prints the table of an earlier run in dir
#
# Every step runs under `timeout` (STEP_S, 60 s); no bench step starts after
# BUDGET_S (330 s) and no heap_whole step runs past HEAP_WHOLE_END_S (450 s),
# so the whole run ends in under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/bench-compare}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-7}
BUDGET_S=${BUDGET_S:-330}
STEP_S=${STEP_S:-60}
HEAP_WHOLE_END_S=${HEAP_WHOLE_END_S:-450}
mkdir -p "$OUT"
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

builds=()
paths=()
if [ -x .gpu-base/gpumalloc ]; then builds+=(base); paths+=(.gpu-base/gpumalloc); fi
for v in ${VARIANTS:-$(ls .gpu-var 2>/dev/null)}; do
  if [ -x ".gpu-var/$v/gpumalloc" ]; then builds+=("$v"); paths+=(".gpu-var/$v/gpumalloc"); fi
done
n=${#builds[@]}
if [ "$n" -eq 0 ]; then echo "no builds in .gpu-base or .gpu-var"; exit 1; fi
echo "builds: ${builds[*]}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

for ((r = 0; r < ROUNDS; r++)); do
  for test in ${TESTS:-single mixed}; do
    for ((k = 0; k < n; k++)); do
      if [ "$(elapsed)" -ge "$BUDGET_S" ]; then
        echo "budget of ${BUDGET_S}s spent: no more bench steps"; break 3
      fi
      i=$(( (k + r) % n ))
      b=${builds[$i]}
      dir="$OUT/$b/$test-$r"
      mkdir -p "$dir"
      echo "[$(elapsed)s] round $r $test $b"
      # shellcheck disable=SC2086 # EXTRA holds several arguments
      GPUMALLOC_FRAG_MAP=${FRAG_MAP:-${GPUMALLOC_FRAG_MAP:-0}} timeout "$STEP_S" "${paths[$i]}" bench "$test" --allocators ours --iters "$ITERS" \
        --out "$dir" ${EXTRA:-} > "$dir/log" 2>&1
      rc=$?
      if [ $rc -ne 0 ]; then echo "  FAILED ($rc): tail of $dir/log"; tail -n 5 "$dir/log"; fi
    done
  done
done

if [ -n "${HEAP_WHOLE:-}" ]; then
  for b in "${builds[@]}"; do
    t=.gpu-var/$b/test-gpu_heap_whole
    [ "$b" = base ] || [ ! -x "$t" ] && continue
    left=$(( HEAP_WHOLE_END_S - $(elapsed) ))
    if [ "$left" -lt 20 ]; then echo "no time left for heap_whole"; break; fi
    echo "[$(elapsed)s] heap_whole $b"
    timeout $(( left < 45 ? left : 45 )) "$t" --include-ignored --test-threads=1 --nocapture random_sizes_until_first_null \
      one_random_size_each > "$OUT/$b/heap-whole.log" 2>&1
    grep -E "issue12:|test result|FAILED" "$OUT/$b/heap-whole.log"
  done
fi

echo "[$(elapsed)s] done"
python3 - "$OUT" "${builds[@]}" <<'EOF' | tee "$OUT/table.txt"
import csv, statistics, sys, pathlib
out, builds = pathlib.Path(sys.argv[1]), sys.argv[2:]
# (test, size label, metric, build) -> per-process medians
vals = {}
order = {}
for b in builds:
    for f in sorted((out / b).glob("*-*/*.csv")):
        for row in csv.DictReader(l for l in f.open() if not l.startswith("#")):
            if not row["allocator"].startswith("ours"):
                continue
            if row["valid"] != "true":
                print(f"note: {f}: {row['test']} {row['size_label']} {row['metric']} not valid")
            key = (row["test"], row["size_label"], row["metric"])
            order.setdefault((row["test"], row["size_label"]), float(row["size"] or 0))
            vals.setdefault(key + (b,), []).append(float(row["median"]))
def med(k):
    v = vals.get(k)
    return statistics.median(v) if v else None
counts = sorted({len(v) for v in vals.values()})
frag = ("span_over_requested", "held_over_requested", "rounding_over_requested",
        "slot_unissued_over_requested", "spares_over_requested", "idle_blocks_over_requested",
        "dead_slices_over_requested")
for metric in ("alloc_ms", "free_ms") + frag:
    if not any(k[2] == metric for k in vals):
        continue
    print(f"\n{metric}: median over {counts} processes per cell of each process's median;"
          f" % vs {builds[0]}")
    head = f"{'test':7}{'size':>10}" + "".join(f"{b:>16}" for b in builds)
    print(head)
    for (test, label), _ in sorted(order.items(), key=lambda kv: (kv[0][0] != "single", kv[1])):
        if not any((test, label, metric, b) in vals for b in builds):
            continue
        base = med((test, label, metric, builds[0]))
        line = f"{test:7}{label:>10}"
        for b in builds:
            m = med((test, label, metric, b))
            if m is None:
                line += f"{'-':>16}"
            elif b == builds[0] or not base:
                line += f"{m:>16.4f}"
            else:
                line += f"{m:>9.4f} {100 * (m / base - 1):+5.0f}%"
        print(line)
EOF
