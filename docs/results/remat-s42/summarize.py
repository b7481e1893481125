#!/usr/bin/env python3
"""One line per variant folder of sweep CSVs (`remat --sweep` output):
per model, Coop's ratios at or below DTR's and DTE's overhead (and those it
loses), its largest mean fragmentation (%), its bisected and steady minimum
with the margin below DTR's. Usage: summarize.py FOLDER...  (standard library)"""
import csv, sys
from pathlib import Path

def line(folder):
    cells = []
    for m in ["gpt2", "bert", "resnet50", "swin_t"]:
        rows = list(csv.DictReader(open(Path(folder) / f"{m}.sweep.csv")))
        by = {(r["ratio"], r["policy"]): r for r in rows}
        ratios = sorted({r["ratio"] for r in rows}, key=float, reverse=True)
        get = lambda p, k: next(r[k] for r in rows if r["policy"] == p)
        wins = total = 0
        lost, frags = [], []
        for ra in ratios:
            me = by[(ra, "Coop")]
            mine = me["finished"] == "true"
            if mine:
                frags.append(float(me["fragmentation_mean"]))
            won, any_finished = True, mine
            for base in ["DTR", "DTE"]:
                b = by[(ra, base)]
                theirs = b["finished"] == "true"
                any_finished |= theirs
                if theirs and (not mine or float(me["overhead"]) > float(b["overhead"]) + 1e-9):
                    won = False
            if any_finished:
                total += 1
                wins += won
                if not won:
                    lost.append(ra[:4])
        bis, st = float(get("Coop", "min_ratio")), float(get("Coop", "steady_min_ratio"))
        bd, sd = float(get("DTR", "min_ratio")), float(get("DTR", "steady_min_ratio"))
        lost_s = "" if not lost else " -" + ",".join(lost)
        cells.append(f"{m}: {wins}/{total}{lost_s} frag {100 * max(frags):.1f} "
                     f"min {bis:.3f}({100 * (1 - bis / bd):.0f}%) st {st:.3f}({100 * (1 - st / sd):.0f}%)")
    return f"{Path(folder).name:24s} | " + " | ".join(cells)

for f in sys.argv[1:]:
    print(line(f))
