#!/usr/bin/env python3
"""Search latency of the remat policies over repeated sweeps, with less noise
than one sweep gives: DTR's search time over Coop's (and Coop-G's), per
evicting allocation, from several runs of the same sweeps.

    python3 scripts/remat-latency.py DIR [DIR ...]

Each DIR holds the `MODEL.sweep.csv` files of one run of
`cargo run -p remat --release --example remat -- TRACE --sweep --out DIR`.
Everything but the search times is deterministic, so the runs must agree on
every other column (checked). Per model, ratio and policy the search time is
the median over the runs, which drops a replay whose few searches were
preempted on a shared machine; then, as in `remat-table.py`, the ratio of
DTR's time to Coop's at every ratio where both finish: median (range).
Standard library only.
"""
import csv
import statistics
import sys
from pathlib import Path

MODELS = ["gpt2", "bert", "resnet50", "swin_t"]
COOPS = ["Coop", "Coop-G"]
TIME = "search_us_per_evicting_alloc"


def main():
    dirs = [Path(d) for d in sys.argv[1:]] or [Path("docs/results/remat")]
    print(f"| model | policy | DTR's search time / its, per evicting allocation, median of {len(dirs)} run(s) per ratio: median (range) | ratios at 10× or more |")
    print("| --- | --- | --- | --- |")
    for m in MODELS:
        runs = [list(csv.DictReader(open(d / f"{m}.sweep.csv"))) for d in dirs if (d / f"{m}.sweep.csv").exists()]
        if not runs:
            continue
        fixed = [k for k in runs[0][0] if not k.startswith("search")]
        for other in runs[1:]:
            if [[r[k] for k in fixed] for r in other] != [[r[k] for k in fixed] for r in runs[0]]:
                sys.exit(f"{m}: the runs disagree on something other than search time")
        time = {}
        for k, row in enumerate(runs[0]):
            key = (row["ratio"], row["policy"])
            time[key] = (statistics.median(float(run[k][TIME]) for run in runs), row["finished"] == "true")
        for p in COOPS:
            speedups = []
            for (ratio, policy), (ours, done) in time.items():
                if policy != p or not done or ours <= 0:
                    continue
                dtr, dtr_done = time[(ratio, "DTR")]
                if dtr_done:
                    speedups.append(dtr / ours)
            if not speedups:
                continue
            at_ten = sum(s >= 10 for s in speedups)
            print(f"| {m} | {p} | {statistics.median(speedups):.1f}× "
                  f"({min(speedups):.1f}–{max(speedups):.1f}×) | {at_ten}/{len(speedups)} |")


if __name__ == "__main__":
    main()
