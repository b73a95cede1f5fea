#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (--metrics gpu__time_duration.sum --csv --print-units base) per kernel name and
grid, largest first: where the GPU time of the profiled launches went. Usage: ncu_summary.py FILE [TOP]."""
import collections
import csv
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    rows = list(csv.reader(line for line in open(path, errors="replace") if line.startswith('"')))
    if len(rows) < 2:
        print(f"{path}: no kernel rows")
        return
    head = rows[0]
    ki, vi = head.index("Kernel Name"), head.index("Metric Value")
    gi = head.index("Grid Size") if "Grid Size" in head else None
    total = collections.defaultdict(float)
    count = collections.Counter()
    for r in rows[1:]:
        name = r[ki].split("(")[0].replace("inferx::<unnamed>::", "").replace("void ", "")[:70]
        if gi is not None:
            name += " " + r[gi]
        total[name] += float(r[vi].replace(",", ""))
        count[name] += 1
    all_ns = sum(total.values())
    n = len(rows) - 1
    print(f"{n} kernels, {all_ns / 1e3:.1f} us of kernel time ({all_ns / 1e3 / n:.2f} us avg)")
    for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{v / 1e3:10.1f} us {100 * v / all_ns:5.1f}% {count[k]:5d} x {v / 1e3 / count[k]:8.2f} us  {k}")


if __name__ == "__main__":
    main()
