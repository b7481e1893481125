#!/usr/bin/env python3
"""install-clock-rounds.py LOG...: the last round of each `bench frag` size in
logs of an install-clock build (`GPUMALLOC_INSTALL_CLOCK`, variants iclock*).

The build's counters accumulate over a process's rounds, and `bench frag`
prints their running totals and means after each round; this takes the
difference between a size's last two lines: installs (claiming ones), cycles
an install, team waits, cycles a wait, and the waits' cycles in thousands.
"""
import re
import sys

LINE = re.compile(
    r"install clock, frag (\S+) B: (\d+) installs \((\d+) without a spare\), "
    r"(\d+) cycles each.*?; (\d+) team waits, (\d+) cycles each"
)


def last_rounds(path):
    prev, last = {}, {}
    for line in open(path):
        m = LINE.match(line)
        if not m:
            continue
        size = m.group(1)
        now = tuple(map(int, m.groups()[1:]))
        if size in prev:
            (pi, pc_, pcy, pw, pwc), (i, c_, cy, w, wc) = prev[size], now
            di, dw = i - pi, w - pw
            wait_cycles = w * wc - pw * pwc
            last[size] = (
                di,
                c_ - pc_,
                round((i * cy - pi * pcy) / di) if di else 0,
                dw,
                round(wait_cycles / dw) if dw else 0,
                round(wait_cycles / 1e3),
            )
        prev[size] = now
    return last


for path in sys.argv[1:]:
    for size, v in last_rounds(path).items():
        print(
            f"{path:40s} {size:>10s} installs {v[0]:5d} claim {v[1]:4d} "
            f"cyc/inst {v[2]:6d} waits {v[3]:7d} cyc/wait {v[4]:6d} waitKcyc {v[5]}"
        )
