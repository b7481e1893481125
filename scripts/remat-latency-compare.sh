#!/usr/bin/env bash
# Search latency of two built `remat` example binaries, interleaved: runs
# the four models' sweeps with binary A, then B, ROUNDS times (alternating,
# so that a noisy stretch of the machine hits both), each step under a
# timeout, then summarises each binary's runs with scripts/remat-latency.py
# and prints, per model, the median over the ratios of DTR's search time
# over Coop's and the ratios at 10x or more, side by side, and whether the
# two binaries' sweeps agree on every column but the search times.
#
# Needs Python 3 and coreutils' timeout, not Rust. Run from the repository
# root (it reads docs/results/remat/MODEL.remat.gz):
#
#   BIN_A=path/to/remat BIN_B=path/to/other/remat \
#     scripts/remat-latency-compare.sh ROUNDS OUTDIR
#
# Env: BIN_A, BIN_B (required); NAME_A, NAME_B (labels, default A and B);
# TRACES (default docs/results/remat); STEP_TIMEOUT (seconds per sweep,
# default 300); MODELS (default "gpt2 bert resnet50 swin_t").
# Output: OUTDIR/{A,B}/run-K/MODEL.sweep.{csv,txt} for each round K,
# OUTDIR/{A,B}.latency.md (remat-latency.py's table) and OUTDIR/summary.md.
set -euo pipefail

rounds=${1:?usage: BIN_A=... BIN_B=... $0 ROUNDS OUTDIR}
out=${2:?usage: BIN_A=... BIN_B=... $0 ROUNDS OUTDIR}
: "${BIN_A:?set BIN_A to the first remat binary}"
: "${BIN_B:?set BIN_B to the second remat binary}"
name_a=${NAME_A:-A}
name_b=${NAME_B:-B}
traces=${TRACES:-docs/results/remat}
step_timeout=${STEP_TIMEOUT:-300}
models=${MODELS:-gpt2 bert resnet50 swin_t}
here=$(cd "$(dirname "$0")" && pwd)

for bin in "$BIN_A" "$BIN_B"; do
    [[ -x $bin ]] || { echo "not an executable: $bin" >&2; exit 1; }
done
mkdir -p "$out/A" "$out/B"

# One sweep of one model with one binary; a failure or timeout is reported
# and leaves that run out of the summary (its CSV is removed).
sweep() {
    local bin=$1 model=$2 dir=$3
    mkdir -p "$dir"
    if ! timeout "$step_timeout" "$bin" "$traces/$model.remat.gz" --sweep --out "$dir" \
        > "$dir/$model.log" 2>&1; then
        echo "  $model with $bin failed or timed out (see $dir/$model.log)" >&2
        rm -f "$dir/$model.sweep.csv"
    fi
}

for ((k = 1; k <= rounds; k++)); do
    echo "round $k of $rounds" >&2
    for model in $models; do
        # Alternate which binary goes first from round to round.
        if ((k % 2)); then order="A B"; else order="B A"; fi
        for side in $order; do
            if [[ $side == A ]]; then bin=$BIN_A; else bin=$BIN_B; fi
            sweep "$bin" "$model" "$out/$side/run-$k"
        done
    done
done

for side in A B; do
    python3 "$here/remat-latency.py" "$out/$side"/run-* > "$out/$side.latency.md"
done

# Side by side: Coop's row of each table (median and ratios at >= 10x).
python3 - "$out" "$name_a" "$name_b" "$models" <<'EOF' | tee "$out/summary.md"
import csv
import sys
from pathlib import Path

out, name_a, name_b, models = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4].split()


def coop_rows(side):
    rows = {}
    for line in (out / f"{side}.latency.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[1] == "Coop":
            rows[cells[0]] = (cells[2], cells[3])
    return rows


def decisions(side, model):
    """Every column but the search times of the first run that finished."""
    for run in sorted((out / side).glob("run-*")):
        path = run / f"{model}.sweep.csv"
        if path.exists():
            rows = list(csv.DictReader(open(path)))
            return [{k: v for k, v in r.items() if not k.startswith("search")} for r in rows]
    return None


a, b = coop_rows("A"), coop_rows("B")
print(f"| model | {name_a}: DTR / Coop, median (range) | {name_a}: ratios >= 10x "
      f"| {name_b}: DTR / Coop, median (range) | {name_b}: ratios >= 10x | other columns |")
print("| --- | --- | --- | --- | --- | --- |")
for m in models:
    ra, rb = a.get(m, ("-", "-")), b.get(m, ("-", "-"))
    da, db = decisions("A", m), decisions("B", m)
    same = "-" if da is None or db is None else ("same" if da == db else "DIFFER")
    print(f"| {m} | {ra[0]} | {ra[1]} | {rb[0]} | {rb[1]} | {same} |")
EOF
