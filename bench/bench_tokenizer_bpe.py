"""Encode throughput (MB/s, one thread) of InferX vs Hugging Face tokenizers on the same text, same run.

Usage: build/venv-bpe/bin/python bench/bench_tokenizer_bpe.py [--bench BIN] [--mb 4]
BIN is bench_tokenizer_bpe (default build/bpe/bench/bench_tokenizer_bpe). The text is English prose
(the GPL-3 licence text), C++ source of this repository and the multilingual conformance corpus,
repeated to about --mb megabytes. Both sides encode the whole text in one call without special tokens;
Hugging Face runs with RAYON_NUM_THREADS=1 (a single encode() does not use its thread pool anyway).
Tokenizers: the testdata files, with GPT-2 and Llama 3.2 made into tokenizer.json by tokenizers itself
(as in tests/python/test_tokenizer_conformance.py).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
import test_tokenizer_conformance as conf  # noqa: E402  (reuses its tokenizer builders)
from tokenizers import Tokenizer  # noqa: E402


def make_text(mb):
    parts = [Path("/usr/share/common-licenses/GPL-3").read_text()]
    for p in sorted((ROOT / "src/text").glob("*.cpp")):
        parts.append(p.read_text())
    parts.append("\n".join(conf.CORPUS).replace("{S0}", "").replace("{S1}", ""))
    text = "\n".join(parts)
    return (text * (int(mb * 1e6) // len(text.encode()) + 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=str(ROOT / "build/bpe/bench/bench_tokenizer_bpe"))
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    class Factory:  # pytest's tmp_path_factory, enough for the conformance builders
        def mktemp(self, name):
            return Path(tempfile.mkdtemp(prefix=name))

    toks = conf.tokenizers_under_test.__wrapped__(Factory())
    text = make_text(args.mb)
    nbytes = len(text.encode())
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
        text_path = f.name
    lines = text.split("\n")
    for mode in ("whole", "lines"):
        what = "the whole text in one call" if mode == "whole" else f"{len(lines)} lines, one call each (HF: encode_batch)"
        print(f"\n{mode}: {nbytes / 1e6:.2f} MB, {what}; one thread; best of {args.repeats}\n")
        print("| tokenizer | tokens | InferX MB/s | HF tokenizers MB/s | ratio |")
        print("|---|---|---|---|---|")
        for name in ["gpt2", "llama3.2", "gpt-neox-20b", "qwen2-style", "deepseek-coder-style", "tinyllama"]:
            path, hf = toks[name]
            best = 1e30
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                if mode == "whole":
                    n = len(hf.encode(text, add_special_tokens=False).ids)
                else:
                    n = sum(len(e.ids) for e in hf.encode_batch(lines, add_special_tokens=False))
                best = min(best, time.perf_counter() - t0)
            hf_mbs = nbytes / 1e6 / best
            res = subprocess.run([args.bench, str(path), text_path, str(args.repeats), mode], capture_output=True,
                                 text=True)
            if res.returncode != 0:
                print(name, res.stderr, file=sys.stderr)
                continue
            ours = json.loads(res.stdout)
            assert ours["tokens"] == n, (name, mode, ours["tokens"], n)
            print(f"| {name} | {n} | {ours['mb_per_s']:.2f} | {hf_mbs:.2f} | {ours['mb_per_s'] / hf_mbs:.2f}x |",
                  flush=True)
    os.unlink(text_path)


if __name__ == "__main__":
    main()
