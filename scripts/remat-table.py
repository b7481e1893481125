#!/usr/bin/env python3
"""Issue 16's done-when, checked from the sweep CSVs that
`cargo run -p remat --release --example remat -- TRACE --sweep --out DIR` writes.

    python3 scripts/remat-table.py [DIR]      # docs/results/remat by default

Prints a Markdown table per criterion (the ones in docs/remat.md), for Coop
and Coop-G against DTR and DTE, at every ratio of each sweep (0.9 down to the
lowest minimum). Standard library only.
"""
import csv
import statistics
import sys
from pathlib import Path

MODELS = ["gpt2", "bert", "resnet50", "swin_t"]
TRANSFORMERS = {"gpt2", "bert", "swin_t"}
COOPS = ["Coop", "Coop-G"]


def load(path):
    rows = {}
    mins = {}
    steady = {}
    for r in csv.DictReader(open(path)):
        ratio = float(r["ratio"])
        rows[(ratio, r["policy"])] = r
        mins[r["policy"]] = float(r["min_ratio"]) if r["min_ratio"] else None
        # Sweeps written before the steady minimum existed have no column.
        steady[r["policy"]] = float(r["steady_min_ratio"]) if r.get("steady_min_ratio") else None
    ratios = sorted({k[0] for k in rows}, reverse=True)
    return rows, mins, ratios, steady


def versus_dtr(m, mins):
    """Each Coop's minimum against DTR's, marked against the 20% criterion
    on the transformer models."""
    rel = []
    for p in COOPS:
        if mins[p] and mins["DTR"]:
            d = 1 - mins[p] / mins["DTR"]
            ok = "✓" if d >= 0.2 - 1e-9 else "✗"
            word = "lower" if d >= 0 else "higher"
            rel.append(f"{100 * abs(d):.0f}% {word} {ok if m in TRANSFORMERS else ''}".strip())
        else:
            rel.append("—")
    return rel


def pct(x):
    return f"{100 * x:.1f}%"


def main():
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/remat")
    data = {m: load(folder / f"{m}.sweep.csv") for m in MODELS if (folder / f"{m}.sweep.csv").exists()}

    print("### Minimum budget ratio (bisection; lowest ratio of the sweep that finished)\n")
    print("| model | DTR | DTE | Coop | Coop-G | Coop vs DTR | Coop-G vs DTR |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m, (rows, mins, ratios, _) in data.items():
        def lowest(p):
            done = [r for r in ratios if rows.get((r, p), {}).get("finished") == "true"]
            return min(done) if done else None
        cells = []
        for p in ["DTR", "DTE", "Coop", "Coop-G"]:
            cells.append(f"{mins[p]:.3f} ({lowest(p):.3f})" if mins[p] else "—")
        print(f"| {m} | " + " | ".join(cells + versus_dtr(m, mins)) + " |")

    if all(any(steady.values()) for (_, _, _, steady) in data.values()):
        print("\n### Steady minimum budget ratio (finishes at every 0.005 from 1.0 down to it)\n")
        print("| model | DTR | DTE | Coop | Coop-G | Coop vs DTR | Coop-G vs DTR |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for m, (_, _, _, steady) in data.items():
            cells = [f"{steady[p]:.3f}" if steady[p] else "—" for p in ["DTR", "DTE", "Coop", "Coop-G"]]
            print(f"| {m} | " + " | ".join(cells + versus_dtr(m, steady)) + " |")

    print("\n### Compute overhead (recomputation / step) at a few ratios; ✗: fails\n")
    print("| model | ratio | DTR | DTE | Coop | Coop-G |")
    print("| --- | --- | --- | --- | --- | --- |")
    for m, (rows, mins, ratios, _) in data.items():
        picks = [r for r in ratios if r in (0.9, 0.7, 0.6, 0.5)] + [ratios[-1]]
        for r in sorted(set(picks), reverse=True):
            cells = []
            for p in ["DTR", "DTE", "Coop", "Coop-G"]:
                row = rows.get((r, p))
                cells.append(pct(float(row["overhead"])) if row and row["finished"] == "true" else "✗")
            print(f"| {m} | {r:.3f} | " + " | ".join(cells) + " |")

    print("\n### Done-when per model, over every ratio of the sweep (0.9 down to the lowest minimum)\n")
    print("| model | policy | overhead ≤ DTR and DTE | mean fragmentation (max over ratios) | DTR's search time / its, per evicting allocation: median (range) |")
    print("| --- | --- | --- | --- | --- |")
    for m, (rows, mins, ratios, _) in data.items():
        for p in COOPS:
            wins, total, losses = 0, 0, []
            frags, speedups = [], []
            for r in ratios:
                me = rows.get((r, p))
                if me is None:
                    continue
                mine = me["finished"] == "true"
                if mine:
                    frags.append(float(me["fragmentation_mean"]))
                won = True
                for base in ["DTR", "DTE"]:
                    b = rows[(r, base)]
                    theirs = b["finished"] == "true"
                    if not theirs and not mine:
                        continue
                    if theirs and (not mine or float(me["overhead"]) > float(b["overhead"]) + 1e-9):
                        won = False
                    if mine and theirs:
                        ours = float(me["search_us_per_evicting_alloc"])
                        dtr = float(rows[(r, "DTR")]["search_us_per_evicting_alloc"])
                        if base == "DTR" and ours > 0:
                            speedups.append(dtr / ours)
                if any(rows[(r, x)]["finished"] == "true" for x in ["DTR", "DTE", p]):
                    total += 1
                    wins += won
                    if not won:
                        losses.append(f"{r:g}")
            frag = f"{pct(max(frags))} {'✓' if max(frags) < 0.05 else '✗'}" if frags else "—"
            sp = (f"{statistics.median(speedups):.1f}× ({min(speedups):.1f}–{max(speedups):.1f}×) "
                  f"{'✓' if min(speedups) >= 10 else '✗'}") if speedups else "—"
            lost = f" (not at {', '.join(losses)})" if losses else ""
            print(f"| {m} | {p} | {wins}/{total} ratios {'✓' if wins == total else '✗'}{lost} | {frag} | {sp} |")


if __name__ == "__main__":
    main()
