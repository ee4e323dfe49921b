#!/usr/bin/env python3
"""Median busbw (GB/s) and time (us) per library and size from rows.csv, with
Shoal's ratio to the best peer at each size. Prints a Markdown table."""
import csv
import statistics
import sys
from collections import defaultdict

rows = defaultdict(lambda: defaultdict(list))
times = defaultdict(lambda: defaultdict(list))
with open(sys.argv[1]) as f:
    for r in csv.DictReader(f):
        rows[r["library"]][int(r["bytes"])].append(float(r["busbw"]))
        times[r["library"]][int(r["bytes"])].append(float(r["time_us"]))

libs = sorted(rows, key=lambda n: (not n.startswith("shoal"), n))
sizes = sorted({s for lib in rows.values() for s in lib})


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024


print("| size | " + " | ".join(f"{l} busbw" for l in libs) + " | " +
      " | ".join(f"{l} us" for l in libs) + " | Shoal speed vs best peer (>1: faster) |")
print("|---:" * (2 * len(libs) + 2) + "|")
for s in sizes:
    bw = [statistics.median(rows[l][s]) if rows[l][s] else None for l in libs]
    us = [statistics.median(times[l][s]) if times[l][s] else None for l in libs]
    shoal = [u for l, u in zip(libs, us) if l.startswith("shoal") and u]
    peers = [u for l, u in zip(libs, us) if not l.startswith("shoal") and u]
    ratio = f"{min(peers) / shoal[0]:.2f}x" if shoal and peers else ""
    fmt = lambda v, p: "" if v is None else f"{v:.{p}f}"
    print(f"| {human(s)} | " + " | ".join(fmt(v, 3) for v in bw) + " | " +
          " | ".join(fmt(v, 1) for v in us) + f" | {ratio} |")
