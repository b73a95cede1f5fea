"""bench/gpu/timeline_summary.py on a synthetic kernel timeline whose answer is known: the layer period must
be found from names and launch shapes together (two products of one kernel template differ only by grid),
the replays of the most frequent graph must be the ones summarised (an eager kernel and another graph are
ignored), and what each kernel adds must sum to the replay's span."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu" / "timeline_summary.py"

HEADER = "start_ns,end_ns,graph_id,graph_node_id,correlation_id,stream,grid,block,dynamic_smem,registers,name\n"
# (name, grid, duration ns, how long before the previous kernel's end it starts: less than that kernel's
# duration, as under PDL, so the start order is the launch order)
EMBED = ("_Z12embed_kernelv", "16x1x1", 2000, 0)
# By names alone this layer repeats every 2 kernels; with the launch shapes every 4.
LAYER = [
    ("_Z4normv", "1x1x1", 5000, 1000),
    ("_Z4gemvILi2EEvv", "528x1x1", 20000, 3000),  # q/k/v
    ("_Z4normv", "1x1x1", 4000, 2000),
    ("_Z4gemvILi2EEvv", "512x1x1", 15000, 3500),  # o: the same template, another grid
]
TAIL = [("_Z4normv", "1x1x1", 5000, 1000), ("_Z4gemvILi2EEvv", "528x1x1", 300000, 3000)]
LAYERS = 6
REPLAYS = 12


def replay_kernels():
    return [EMBED] + LAYER * LAYERS + TAIL


def write_timeline(path):
    rows = []
    t = 1_000_000
    rows.append(f"{t},{t + 500},0,0,1,7,1x1x1,32x1x1,0,16,_Z5eagerv\n")  # eager: not a replay
    t += 10_000
    for rep in range(REPLAYS):
        prev_end = t
        first = True
        for node, (name, grid, dur, early) in enumerate(replay_kernels()):
            start = t if first else prev_end - early
            first = False
            end = start + dur
            rows.append(f"{start},{end},5,{node},{100 + rep},7,{grid},128x1x1,0,64,{name}\n")
            prev_end = end
        t = prev_end + 25_000
    # One replay of another graph (a warm-up capture): fewer replays, so not the one summarised.
    rows.append(f"{t},{t + 9000},9,0,999,7,4x1x1,64x1x1,0,32,_Z6samplev\n")
    path.write_text(HEADER + "".join(rows))


def expected_span_ns():
    kernels = replay_kernels()
    end = kernels[0][2]
    for name, grid, dur, early in kernels[1:]:
        end = end - early + dur
    return end


def run_summary(csv, *args):
    out = subprocess.run([sys.executable, str(SCRIPT), str(csv), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_finds_the_layer_period_and_the_adds_sum_to_the_span(tmp_path):
    csv = tmp_path / "timeline.csv"
    write_timeline(csv)
    text = run_summary(csv, "--skip", "2")
    span_us = expected_span_ns() / 1e3
    head = re.search(r"graph 5: (\d+) replays of (\d+) kernels .*span p50 ([\d.]+) us", text)
    assert head, text
    assert int(head.group(1)) == REPLAYS - 2
    assert int(head.group(2)) == len(replay_kernels())
    assert abs(float(head.group(3)) - span_us) < 0.05
    period = re.search(r"period (\d+) kernels per layer, (\d+) layers from kernel (\d+)", text)
    assert period, text
    assert (int(period.group(1)), int(period.group(2)), int(period.group(3))) == (len(LAYER), LAYERS, 1)
    sums = [float(x) for x in re.findall(r"sum of adds\s+([\d.]+)", text)]
    assert len(sums) == 3  # the layer, before the layers, after them
    per_layer, before, after = sums
    assert abs(per_layer * LAYERS + before + after - span_us) < 0.05
    # A kernel's adds: its end minus the latest end before it (its duration less its early start here).
    assert abs(per_layer - sum(dur - early for _, _, dur, early in LAYER) / 1e3) < 0.01


def test_the_two_products_of_one_template_stay_apart(tmp_path):
    csv = tmp_path / "timeline.csv"
    write_timeline(csv)
    text = run_summary(csv)
    # The per-layer table: one row per position, in launch order, with each product's own grid.
    section = text.split("per layer (mean over")[1].split("sum of adds")[0]
    rows = [line.split() for line in section.splitlines()[2:] if line.strip()]
    assert [(r[0], r[1]) for r in rows] == [("norm", "1x1x1"), ("gemv<2>", "528x1x1"), ("norm", "1x1x1"),
                                            ("gemv<2>", "512x1x1")], text
    # Each row's duration is its own product's, not a mean over both.
    assert [float(r[3]) for r in rows] == [dur / 1e3 for _, _, dur, _ in LAYER]
