#!/usr/bin/env python3
"""Reads an nccl-tests-style table on stdin; prints CSV rows: library,bytes,time_us,busbw.

Works for Shoal's bench/perf (out-of-place columns) and the peers' benchmarks
(same leading columns: size count type redop root time algbw busbw)."""
import sys

name = sys.argv[1]
for line in sys.stdin:
    parts = line.split()
    if not parts or line.lstrip().startswith("#"):
        continue
    try:
        size = int(parts[0])
        time_us = float(parts[5])
        busbw = float(parts[7])
    except (ValueError, IndexError):
        continue
    print(f"{name},{size},{time_us},{busbw}")
