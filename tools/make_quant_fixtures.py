#!/usr/bin/env python3
"""Writes the GGUF block fixtures of tests/unit/quant/gguf_blocks_test.cpp from gguf-py, the reference
numpy implementation of the formats (pip install gguf numpy; gguf/quants.py).

For each of Q8_0, Q4_0, Q4_K, Q6_K:
  <type>_blocks.bin   random blocks (random bytes, with sane random f16 scales patched in)
  <type>_dequant.bin  gguf-py's dequantization of them, little-endian float32
For Q8_0 and Q4_0 (the types gguf-py can quantize):
  <type>_quant_in.bin   float32 input rows (random normal, an all-zero block, an outlier block)
  <type>_quant_out.bin  gguf-py's quantized bytes of them

Run from the repository root:  python3 tools/make_quant_fixtures.py
The output is deterministic (fixed seed); the files are committed, so the C++ build needs no Python.
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "unit", "quant", "fixtures")


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_blocks(rng, qtype, n_blocks):
    block_elems, block_bytes = quants.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    # Scales: positive and negative, a few magnitudes, never inf/nan/subnormal-only noise.
    scale = lambda: rng.choice([-1.0, 1.0], n_blocks) * 10.0 ** rng.uniform(-4, -0.5, n_blocks)
    if qtype in (T.Q8_0, T.Q4_0):
        raw[:, 0:2] = f16_bytes(scale())
    elif qtype == T.Q4_K:
        raw[:, 0:2] = f16_bytes(np.abs(scale()))  # d
        raw[:, 2:4] = f16_bytes(np.abs(scale()))  # dmin
    elif qtype == T.Q6_K:
        raw[:, 208:210] = f16_bytes(scale())
    else:
        raise ValueError(qtype)
    return raw


def quant_input(rng, n_blocks, block):
    x = rng.standard_normal((n_blocks, block)).astype(np.float32)
    x[1] = 0.0  # all-zero block: d = 0 path
    x[2] *= 0.01
    x[2, 5] = 7.5  # one outlier dominates the scale
    x[3] = -x[3]
    return x.reshape(-1)


def main():
    rng = np.random.default_rng(20240601)
    os.makedirs(OUT, exist_ok=True)
    counts = {T.Q8_0: 8, T.Q4_0: 8, T.Q4_K: 4, T.Q6_K: 4}
    for qtype, n in counts.items():
        name = qtype.name.lower()
        blocks = random_blocks(rng, qtype, n)
        deq = quants.dequantize(blocks, qtype).astype("<f4").reshape(-1)
        assert np.all(np.isfinite(deq)), name
        blocks.tofile(os.path.join(OUT, f"{name}_blocks.bin"))
        deq.tofile(os.path.join(OUT, f"{name}_dequant.bin"))
    for qtype in (T.Q8_0, T.Q4_0):
        name = qtype.name.lower()
        x = quant_input(rng, 16, 32)
        q = quants.quantize(x.reshape(1, -1), qtype).reshape(-1)
        x.astype("<f4").tofile(os.path.join(OUT, f"{name}_quant_in.bin"))
        q.tofile(os.path.join(OUT, f"{name}_quant_out.bin"))
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote fixtures to {os.path.normpath(OUT)} ({total} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
