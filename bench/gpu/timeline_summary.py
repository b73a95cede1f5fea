#!/usr/bin/env python3
"""Summarises a kernel timeline (bench/gpu/kernel_timeline.cpp's CSV) of CUDA graph replays.

Takes the replays of the most frequent graph (a batch-1 decode run replays one graph per token), drops the
first --skip of them, and prints:
  - the replay's span on the GPU clock (first kernel start to last kernel end) and the gap between replays;
  - per position in a layer (the kernel sequence's period, found from the names), averaged over layers and
    replays: the kernel, its duration, its start relative to the previous kernel's end (negative: it started
    early, under PDL), and what it adds to the replay's span (its end minus the latest end before it), which
    sums to the span over all kernels - the figure that says where a step's time goes;
  - the kernels before the first layer and after the last one, the same way.
Usage: timeline_summary.py kernels.csv [--skip N] [--period P] [--bytes NAME=MB,...]
"""
import argparse
import collections
import csv
import re
import shutil
import statistics
import subprocess
import sys


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return {n: (out[i] if i < len(out) and out[i] else n) for i, n in enumerate(names)}


def short(name):
    """The kernel's function name with its template arguments, without namespaces and parameters."""
    name = name.replace("(anonymous namespace)::", "")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list starts at the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    s = name[:cut]
    if s.startswith("void "):  # a function template's demangled name carries its return type
        s = s[5:]
    s = re.sub(r"\b(?:inferx::|cuda::|gemv::)", "", s)
    s = s.replace("std::integral_constant<int, ", "ic<").replace("(bool)", "")
    return s if len(s) <= 90 else s[:87] + "..."


def period_of(names):
    """The smallest P for which the middle of the sequence repeats with period P (the layer's kernels)."""
    n = len(names)
    lo, hi = n // 8, n - n // 8
    for p in range(2, max(3, n // 2)):
        same = sum(names[i] == names[i + p] for i in range(lo, hi - p))
        if same >= 0.97 * (hi - p - lo):
            return p
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--skip", type=int, default=3, help="replays to drop first (warm-up)")
    ap.add_argument("--period", type=int, default=0, help="kernels per layer (default: found)")
    args = ap.parse_args()

    rows = []
    with open(args.csv) as f:
        for r in csv.DictReader(f):
            rows.append(r)
    graphs = collections.Counter(r["graph_id"] for r in rows if r["graph_id"] != "0")
    if not graphs:
        sys.exit("no graph replays in the timeline")
    gid = graphs.most_common(1)[0][0]
    replays = collections.defaultdict(list)
    for r in rows:
        if r["graph_id"] == gid:
            replays[r["correlation_id"]].append(
                (int(r["start_ns"]), int(r["end_ns"]), r["name"], r["grid"], r["dynamic_smem"]))
    order = sorted(replays.values(), key=lambda ks: min(k[0] for k in ks))
    sizes = collections.Counter(len(ks) for ks in order)
    size = sizes.most_common(1)[0][0]
    order = [sorted(ks) for ks in order if len(ks) == size][args.skip:]
    if not order:
        sys.exit("no replays left after --skip")
    names = demangle(sorted({k[2] for k in order[0]}))
    seq = [short(names[k[2]]) for k in order[0]]
    # Kernels of one template differ by launch shape (q/k/v vs o vs down): the period is found on both.
    p = args.period or period_of([(s, k[3], k[4]) for s, k in zip(seq, order[0])])
    spans = [ks[-1][1] - ks[0][0] for ks in order]
    between = [b[0][0] - a[-1][1] for a, b in zip(order, order[1:])]
    print(f"graph {gid}: {len(order)} replays of {size} kernels (after skipping {args.skip}); span p50 "
          f"{statistics.median(spans) / 1e3:.1f} us (min {min(spans) / 1e3:.1f}), gap between replays p50 "
          f"{statistics.median(between) / 1e3 if between else 0:.1f} us")

    # Per kernel of the replay: duration, start - previous kernel's end, added span.
    per = [[] for _ in range(size)]
    for ks in order:
        latest = ks[0][0]
        prev_end = ks[0][0]
        for i, (s, e, _, _, _) in enumerate(ks):
            per[i].append((e - s, s - prev_end, max(0, e - latest)))
            prev_end = e
            latest = max(latest, e)
    avg = [tuple(statistics.mean(v[j] for v in per[i]) / 1e3 for j in range(3)) for i in range(size)]

    def table(title, idx_groups):
        print(f"\n{title}")
        print(f"{'kernel':92s} {'grid':>10s} {'smem':>6s} {'dur us':>7s} {'start-prev':>10s} {'adds us':>8s}")
        total = 0.0
        for idxs in idx_groups:
            i0 = idxs[0]
            d, g, a = (statistics.mean(avg[i][j] for i in idxs) for j in range(3))
            total += a
            k = order[0][i0]
            print(f"{seq[i0]:92s} {k[3]:>10s} {k[4]:>6s} {d:7.2f} {g:10.2f} {a:8.2f}")
        print(f"{'sum of adds':92s} {'':>10s} {'':>6s} {'':>7s} {'':>10s} {total:8.2f}")

    key = [(s, k[3], k[4]) for s, k in zip(seq, order[0])]
    # The first full layer: the first index from which the sequence repeats with period p (none: no layers).
    start = next((i for i in range(size) if all(key[j] == key[j + p] for j in range(i, min(i + p, size - p)))),
                 None) if p else None
    if start is not None:
        layers = (size - start) // p
        while layers > 0 and any(key[start + (layers - 1) * p + j] != key[start + j] for j in range(p)):
            layers -= 1
        end = start + layers * p
        print(f"period {p} kernels per layer, {layers} layers from kernel {start}")
        table(f"per layer (mean over {layers} layers), us", [[start + l * p + j for l in range(layers)]
                                                             for j in range(p)])
        layer_adds = sum(statistics.mean(avg[start + l * p + j][2] for l in range(layers)) for j in range(p))
        print(f"layers: {layer_adds:.2f} us per layer x {layers} = {layer_adds * layers:.1f} us")
        table("before the layers", [[i] for i in range(start)])
        table("after the layers", [[i] for i in range(end, size)])
    else:
        table("every kernel", [[i] for i in range(size)])


if __name__ == "__main__":
    main()
