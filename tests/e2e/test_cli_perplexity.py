"""`inferx perplexity`: the base run writes a KL file, a quantized run compares against it, --decode-steps
scores the same positions through one-token steps, and bad input gets a clear message (not a crash)."""
import re
import subprocess

from conftest import REPO, STORIES, inferx_bin

TEXT = REPO / "tests" / "unit" / "model" / "fixtures" / "stories_eval.txt"


def perplexity(*args, timeout=120):
    return subprocess.run([str(inferx_bin()), "perplexity", "-m", str(STORIES), "-f", str(TEXT), "--threads", "1",
                           *args], capture_output=True, text=True, timeout=timeout)


def figure(pattern, text):
    m = re.search(pattern, text)
    assert m, text
    return float(m.group(1))


def test_base_then_kl_in_both_modes(tmp_path):
    base = tmp_path / "base.kl"
    r = perplexity("--ctx", "128", "--kl-divergence-base", str(base))
    assert r.returncode == 0, r.stderr
    ppl = figure(r"perplexity: ([0-9.]+) over 819 tokens \(13 chunks of 128\)", r.stdout)
    assert 3.8 < ppl < 4.2  # 3.9758 (docs/benchmarks.md)
    assert base.stat().st_size > 0
    # The unquantized model against itself, one prefill per chunk and one step per scored position: the
    # same distributions (F32 on the CPU), so KL ~ 0 and every argmax agrees.
    for mode in ([], ["--decode-steps"]):
        r = perplexity("--ctx", "128", "--kl-divergence-base", str(base), "--kl-divergence", *mode)
        assert r.returncode == 0, r.stderr
        assert abs(figure(r"^perplexity: ([0-9.]+)", r.stdout) / ppl - 1) < 1e-4
        assert figure(r"mean KL divergence: ([0-9.e-]+) nats", r.stdout) < 1e-6
        assert figure(r"top-1 agreement: ([0-9.]+)%", r.stdout) == 100.0
    # FP8 weights move the distributions a little (KL 0.011 measured), through the decode steps too.
    r = perplexity("--ctx", "128", "--kl-divergence-base", str(base), "--kl-divergence", "--decode-steps",
                   "--quantize", "fp8")
    assert r.returncode == 0, r.stderr
    assert 1e-4 < figure(r"mean KL divergence: ([0-9.e-]+) nats", r.stdout) < 0.05


def test_errors_name_the_problem(tmp_path):
    r = perplexity("--kv-cache-dtype", "fp8")
    assert r.returncode != 0 and "CPU backend keeps an F32 KV cache" in r.stderr
    r = perplexity("--ctx", "4096")
    assert r.returncode != 0 and "fewer than one chunk" in r.stderr
    r = perplexity("--kl-divergence")
    assert r.returncode != 0 and "--kl-divergence-base" in r.stderr
    other = tmp_path / "other.kl"
    assert perplexity("--ctx", "64", "--kl-divergence-base", str(other)).returncode == 0
    r = perplexity("--ctx", "128", "--kl-divergence-base", str(other), "--kl-divergence")
    assert r.returncode != 0 and "written for other text or --ctx" in r.stderr
    r = subprocess.run([str(inferx_bin()), "perplexity", "-m", str(STORIES), "-f", str(tmp_path / "missing.txt")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "missing.txt" in r.stderr
    r = subprocess.run([str(inferx_bin()), "perplexity", "-m", str(STORIES), "-f", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and f"{tmp_path}: the text file is a directory" in r.stderr, r.stderr
