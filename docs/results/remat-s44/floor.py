"""What Coop's search would take at best with the same decisions
(docs/PERF.md, "What a Coop search is made of"): reads the three probe
outputs here and the DTR column of the eighteenth session's latency A/B,
and prints, per trace and ratio, Coop's cold search now, the floor with
(a) the sweep at the dense loop's warm cost and (b) only the prices that
lower-bound pruning would still compute, and DTR / each."""
import re, sys, statistics
from pathlib import Path

HERE = Path(__file__).parent
AB = HERE.parent / "remat-s43" / "latency-ab-index" / "after"

def blocks(path):
    out, model = {}, None
    for line in open(path):
        if line.startswith("/") or line.startswith("docs/"):
            model = Path(line.strip()).name.split(".")[0]
            out[model] = {}
        elif model and re.match(r"^\d\.\d\d", line):
            out[model][line[:4]] = line
    return out

def num(pattern, line):
    return float(re.search(pattern, line).group(1))

cold, warm, lazy = (blocks(HERE / f) for f in
                    ("search-parts-cold.txt", "search-parts-warm.txt", "search-parts-lazy-bound.txt"))
dtr = {}
for f in sorted(AB.glob("round*.txt")):
    model = None
    for line in open(f):
        if line.startswith("docs/"):
            model = Path(line.strip()).name.split(".")[0]
        m = re.match(r"\| (\d\.\d\d) \| [\d.]+ \| ([\d.]+) \|", line)
        if m and model:
            dtr.setdefault(model, {}).setdefault(m.group(1), []).append(float(m.group(2)))

print("| trace | ratio | Coop now µs | of it scoring / sweep+rest / pre-pass | prices computed (tensors), pruning needs | cost of one computed tensor, ns (fit) | floor µs | DTR µs | DTR / now | DTR / floor |")
print("|---|---|---|---|---|---|---|---|---|---|")
for model in cold:
    rows = []
    for r, line in cold[model].items():
        items = num(r"items (\d+)", line)
        scoring = num(r"scoring ([\d.]+)", line)
        missing = num(r"missing ([\d.]+)", lazy[model][r])
        rows.append((r, items, scoring, missing))
    # scoring = a * items + b * missing, least squares over the ratios
    n = len(rows)
    sxx = sum(i * i for _, i, _, _ in rows); sxy = sum(i * m for _, i, _, m in rows); syy = sum(m * m for _, _, _, m in rows)
    sxz = sum(i * s for _, i, s, _ in rows); syz = sum(m * s for _, _, s, m in rows)
    det = sxx * syy - sxy * sxy
    a = (sxz * syy - syz * sxy) / det; b = (syz * sxx - sxz * sxy) / det
    for r, items, scoring, missing in rows:
        line = cold[model][r]
        now = num(r"search ([\d.]+) us", line)
        rest = num(r"sweep\+rest ([\d.]+)", line)
        pre = num(r"pre-pass ([\d.]+)", line)
        w = warm[model][r]
        sweep_warm, dense = num(r"sweep ([\d.]+)", w), num(r"dense ([\d.]+)", w)
        lo = num(r"needed (\d+\.\d)", lazy[model][r])
        floor = now - items * (sweep_warm - dense) / 1e3 - (missing - lo) * b
        d = statistics.median(dtr.get(model, {}).get(r, [float("nan")]))
        print(f"| {model} | {r} | {now:.2f} | {scoring:.2f} / {rest:.2f} / {pre:.2f} | {missing:.0f}, {lo:.0f} | {b*1e3:.0f} | {floor:.2f} | {d:.1f} | {d/now:.1f}× | {d/floor:.1f}× |")
