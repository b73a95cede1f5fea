"""Cross-checks the numpy reference (and so the committed expected logits) against Hugging Face
transformers on every fixture of tests/golden/fixtures/.

    pip install torch transformers safetensors gguf numpy
    python3 tools/reference/check_against_transformers.py [--fixtures DIR]

For each HF folder: AutoModelForCausalLM.from_pretrained(folder) in float64 with eager attention, run
on expected.json's input_ids, and report the metric of the C++ golden test (max over rows of
max|a - b| / max|b|) between transformers' logits and expected_logits.bin. With --gguf, also loads the
two GGUF exports through transformers' GGUF reader (which undoes llama.cpp's q/k permutation) and
compares them with the same expected logits. Exits non-zero when any error exceeds --tol.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ROOT = os.path.join(HERE, "..", "..", "tests", "golden", "fixtures")
FOLDERS = ["llama-tiny", "llama3-tiny", "mistral-tiny", "qwen2-tiny", "qwen3-tiny"]
GGUFS = {"llama-tiny.gguf": "llama-tiny", "qwen2-tiny.gguf": "qwen2-tiny"}


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b).max(-1) / np.maximum(np.abs(b).max(-1), 1e-6)))


def expected(root: str, name: str) -> tuple[list, np.ndarray]:
    with open(os.path.join(root, name, "expected.json")) as f:
        e = json.load(f)
    return e["input_ids"], np.fromfile(os.path.join(root, name, e["logits_file"]), "<f4").reshape(
        e["shape"])


def hf_logits(path: str, ids: list, gguf_file: str | None = None) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": "eager"}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:  # transformers >= 4.56 calls it dtype; older versions torch_dtype
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, **kwargs)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float64, **kwargs)
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].double().cpu().numpy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", default=DEFAULT_ROOT)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--gguf", action="store_true", help="also check the GGUF exports")
    a = ap.parse_args()
    root = os.path.abspath(a.fixtures)
    sys.path.insert(0, HERE)
    import transformer_ref

    import torch
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")
    worst = 0.0
    for name in FOLDERS:
        ids, ref = expected(root, name)
        folder = os.path.join(root, name)
        hf = hf_logits(folder, ids)
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)
        ours = transformer_ref.forward(
            cfg, transformer_ref.load_safetensors_fp64(os.path.join(folder, "model.safetensors")), ids)
        e_file, e_ref = rel_err(hf, ref), rel_err(hf, ours)
        argmax_ok = bool((hf.argmax(-1) == ref.argmax(-1)).all())
        print(f"{name:16s} transformers vs expected_logits.bin {e_file:.3e}  vs numpy fp64 {e_ref:.3e}"
              f"  argmax {'agree' if argmax_ok else 'DIFFER'}")
        worst = max(worst, e_file, 0.0 if argmax_ok else 1.0)
    if a.gguf:
        for gname, hf_name in GGUFS.items():
            ids, ref = expected(root, hf_name)
            try:
                hf = hf_logits(root, ids, gguf_file=gname)
            except Exception as ex:  # GGUF support depends on the transformers version
                print(f"{gname:16s} not loadable by transformers: {type(ex).__name__}: {ex}")
                continue
            e = rel_err(hf, ref)
            print(f"{gname:16s} transformers(GGUF) vs expected_logits.bin {e:.3e}")
            worst = max(worst, e)
    print(f"worst {worst:.3e} (tolerance {a.tol:g})")
    return 0 if worst <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
