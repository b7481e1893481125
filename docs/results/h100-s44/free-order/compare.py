"""Old against new build of `bench single` / `mixed` (default timing),
three interleaved processes each: per size and metric, the median over
the processes of each process's median, with their range."""
import csv, glob, statistics, sys
root = sys.argv[1]
def load(b, t):
    out = {}
    for f in sorted(glob.glob(f"{root}/{b}-{t}-*/{t}.csv")):
        rows = csv.DictReader(line for line in open(f) if not line.startswith("#"))
        for row in rows:
            if row["allocator"] != "ours": continue
            out.setdefault((row["size_label"], row["metric"]), []).append(float(row["median"]))
    return out
for t in ("single", "mixed"):
    o, n = load("old", t), load("new", t)
    for k in o:
        mo, mn = statistics.median(o[k]), statistics.median(n[k])
        print(f"{t:6} {k[0]:>9} {k[1]:8} old {mo:.4f} ({min(o[k]):.4f}-{max(o[k]):.4f})  new {mn:.4f} ({min(n[k]):.4f}-{max(n[k]):.4f})  {100*(mn/mo-1):+.0f}%")
