#!/usr/bin/env python3
"""ncu-hot.py SOURCE_CSV: the SASS lines of an Nsight Compute source page
(`ncu -i R --page source --csv --print-source sass`) with the most warp stall
samples, and the samples summed per opcode. Prints the header instead when it
finds no stall-sampling column, so a changed ncu format shows itself."""
import csv
import sys
from collections import Counter


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(path, top=40):
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        print("no CSV rows in", path)
        return 1
    # ncu prints a line naming the kernel before the table's header.
    start = next((i for i, r in enumerate(rows) if "Source" in r), 0)
    header, body = rows[start], rows[start + 1 :]
    stall = next((i for i, h in enumerate(header) if h.startswith("Warp Stall Sampling (All")), None)
    source = next((i for i, h in enumerate(header) if h == "Source"), None)
    address = next((i for i, h in enumerate(header) if h == "Address"), 0)
    if stall is None or source is None:
        print("columns:", header)
        return 1
    total = sum(number(r[stall]) for r in body if len(r) > stall) or 1.0
    by_op = Counter()
    for r in body:
        if len(r) > stall:
            op = r[source].split()[0] if r[source].split() else "?"
            if op.startswith("@"):
                op = r[source].split()[1] if len(r[source].split()) > 1 else op
            by_op[op.split(".")[0]] += number(r[stall])
    print(f"{int(total)} stall samples; by opcode:")
    for op, n in by_op.most_common(15):
        print(f"  {op:10} {100 * n / total:5.1f}%")
    print(f"top {top} lines:")
    hot = sorted(body, key=lambda r: -number(r[stall]) if len(r) > stall else 0)[:top]
    for r in hot:
        print(f"  {r[address]:>8} {100 * number(r[stall]) / total:5.1f}%  {r[source]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
