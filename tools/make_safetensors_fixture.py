#!/usr/bin/env python3
"""Writes tests/unit/formats/fixtures/py_written.safetensors with the reference `safetensors` library
(pip install safetensors numpy), so the C++ reader is checked against files the real writer produces.

Contents (values are arange so the test can recompute them independently):
  "a.f32"  F32  [2, 3]     arange(6) * 0.5
  "b.f16"  F16  [4]        arange(4) - 1.5
  "c.i32"  I32  [3, 1]     arange(3) * -7
  "d.i8"   I8   [5]        arange(5) - 2
  "e.bf16" BF16 [2, 2]     bf16 bit patterns of [1.0, -2.0, 0.5, 3.0] stored as uint16 then relabelled
  metadata {"format": "pt", "source": "make_safetensors_fixture.py"}
"""
import json
import os
import struct

import numpy as np
from safetensors.numpy import save

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "unit", "formats", "fixtures", "py_written.safetensors")


def main():
    tensors = {
        "a.f32": (np.arange(6, dtype=np.float32) * 0.5).reshape(2, 3),
        "b.f16": np.arange(4, dtype=np.float16) - np.float16(1.5),
        "c.i32": (np.arange(3, dtype=np.int32) * -7).reshape(3, 1),
        "d.i8": np.arange(5, dtype=np.int8) - np.int8(2),
        # numpy has no bfloat16: write the top 16 bits of the float32 values as uint16 ...
        "e.bf16": (np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32).view(np.uint32) >> 16)
        .astype(np.uint16)
        .reshape(2, 2),
    }
    data = save(tensors, metadata={"format": "pt", "source": "make_safetensors_fixture.py"})
    # ... and relabel that tensor's dtype U16 -> BF16 (same element size, so the data offsets stay
    # valid); the header is re-padded with spaces to a multiple of 8 as the library does.
    n = struct.unpack("<Q", data[:8])[0]
    header = data[8 : 8 + n].decode()
    assert header.count('"U16"') == 1
    header = header.replace('"U16"', '"BF16"').rstrip(" ")
    header += " " * (-len(header) % 8)
    json.loads(header)  # still valid JSON
    data = struct.pack("<Q", len(header)) + header.encode() + data[8 + n :]
    with open(OUT, "wb") as f:
        f.write(data)
    print(f"wrote {OUT} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
