"""Medians over the rounds of Coop's and DTR's search time per evicting
allocation, per trace and ratio, before against after (two folders of
`search-time --reps 5` outputs, round*.txt). Usage: compare.py BEFORE AFTER"""
import re, sys, statistics, glob
def load(d):
    out = {}
    for f in sorted(glob.glob(d + "/round*.txt")):
        model = None
        for line in open(f):
            if line.startswith("docs/"): model = line.strip().split("/")[-1].split(".")[0]
            m = re.match(r"\| (\d\.\d\d) \| ([\d.]+) \| ([\d.]+) \|", line)
            if m: out.setdefault((model, m.group(1)), []).append((float(m.group(2)), float(m.group(3))))
    return out
b, a = load(sys.argv[1]), load(sys.argv[2])
for k in b:
    cb = statistics.median(x[0] for x in b[k]); ca = statistics.median(x[0] for x in a[k])
    db = statistics.median(x[1] for x in b[k]); da = statistics.median(x[1] for x in a[k])
    print(f"{k[0]:9} {k[1]} Coop {cb:6.2f} -> {ca:6.2f} ({100*(ca/cb-1):+5.1f}%)  DTR {db:7.1f} -> {da:7.1f} ({100*(da/db-1):+5.1f}%)")
