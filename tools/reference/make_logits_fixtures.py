"""Writes the small random-weight model fixtures of tests/golden/fixtures/ and their reference logits.

Each fixture is a Hugging Face style folder: config.json (fields as in real configs of the family),
model.safetensors (fp32, written with the `safetensors` package), expected.json
({"input_ids": [...], "shape": [seq, vocab], ...}) and expected_logits.bin (float32 little-endian,
row-major [seq, vocab]) computed by the fp64 numpy reference tools/reference/transformer_ref.py.
Three GGUF exports of the same weights (gguf_export.py: llama-tiny.gguf, qwen2-tiny.gguf and
llama3-tiny.gguf, the last with llama.cpp's rope_freqs.weight) share the HF folders' expected logits.

    pip install numpy safetensors gguf
    python3 tools/reference/make_logits_fixtures.py            # writes tests/golden/fixtures/

Deterministic: weights come from numpy.random.default_rng(SEED + index), token ids from a second
generator; ids are re-drawn until every position's top-1 logit beats the top-2 by a clear margin, so
the argmax check of the C++ test cannot flip on rounding.
"""

from __future__ import annotations

import json
import os
import sys

import gguf
import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_export  # noqa: E402
import transformer_ref  # noqa: E402

SEED = 20240601
# Minimum (top1 - top2) / max|row| over all positions. The C++ test allows a max-abs error of 1e-4 of
# max|row|, so an argmax can only flip when the gap is below 2e-4; we demand ten times that.
MIN_TOP2_GAP = 2e-3
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden",
                                    "fixtures"))

# Common fields of Llama-family configs (as transformers >= 4.45 writes them for LlamaForCausalLM).
_LLAMA_COMMON = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "mlp_bias": False,
    "model_type": "llama",
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "torch_dtype": "float32",
    "transformers_version": "4.45.0",
    "use_cache": True,
}

FIXTURES = [
    {   # Llama 2 style: GQA 4/2, plain RoPE, untied lm_head. Also exported as llama-tiny.gguf.
        "name": "llama-tiny", "seq": 16,
        "config": {**_LLAMA_COMMON, "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 64,
                   "intermediate_size": 96, "max_position_embeddings": 256, "num_attention_heads": 4,
                   "num_hidden_layers": 2, "num_key_value_heads": 2, "rope_scaling": None,
                   "rope_theta": 10000.0, "tie_word_embeddings": False, "vocab_size": 256},
    },
    {   # Llama 3.x style: llama3 rope scaling, theta 500000, tied embeddings, explicit head_dim 16.
        # head_dim 16, theta 5e5: wavelengths 6.3 (< 64/4 = 16: kept), 32.5 (16..64: smoothed),
        # 167 and up (> 64/1: divided by 8), so every band of the scaling is exercised.
        "name": "llama3-tiny", "seq": 16,
        "config": {**_LLAMA_COMMON, "bos_token_id": 1, "eos_token_id": [2, 3], "head_dim": 16,
                   "hidden_size": 64, "intermediate_size": 96, "max_position_embeddings": 512,
                   "num_attention_heads": 8, "num_hidden_layers": 2, "num_key_value_heads": 2,
                   "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                    "original_max_position_embeddings": 64, "rope_type": "llama3"},
                   "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128},
    },
    {   # Mistral: sliding window 8 over 24 tokens (keys with q - k < 8 are visible).
        "name": "mistral-tiny", "seq": 24,
        "config": {"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0,
                   "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 64,
                   "initializer_range": 0.02, "intermediate_size": 64,
                   "max_position_embeddings": 512, "model_type": "mistral",
                   "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
                   "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 8,
                   "tie_word_embeddings": False, "torch_dtype": "float32",
                   "transformers_version": "4.45.0", "use_cache": True, "vocab_size": 128},
    },
    {   # Qwen2: q/k/v biases, no o bias. sliding_window is set (8 < seq) but use_sliding_window is
        # false, as in real Qwen2 configs: the window must be ignored. Also exported as qwen2-tiny.gguf.
        "name": "qwen2-tiny", "seq": 16,
        "config": {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
                   "bos_token_id": 127, "eos_token_id": 127, "hidden_act": "silu",
                   "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96,
                   "max_position_embeddings": 512, "max_window_layers": 2, "model_type": "qwen2",
                   "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
                   "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 8,
                   "tie_word_embeddings": False, "torch_dtype": "float32",
                   "transformers_version": "4.45.0", "use_cache": True, "use_mrope": False,
                   "use_sliding_window": False, "vocab_size": 128},
    },
    {   # Qwen3: per-head q/k RMSNorm, explicit head_dim 32 != 64 / 4, tied embeddings.
        "name": "qwen3-tiny", "seq": 16,
        "config": {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
                   "attention_dropout": 0.0, "bos_token_id": 126, "eos_token_id": 127,
                   "head_dim": 32, "hidden_act": "silu", "hidden_size": 64,
                   "initializer_range": 0.02, "intermediate_size": 64,
                   "max_position_embeddings": 512, "max_window_layers": 2, "model_type": "qwen3",
                   "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
                   "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
                   "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "float32",
                   "transformers_version": "4.51.0", "use_cache": True,
                   "use_sliding_window": False, "vocab_size": 128},
    },
]


def make_weights(cfg: dict, rng: np.random.Generator) -> dict:
    """HF tensor names -> fp32 arrays. Linear weights ~ N(0, 0.1^2), embeddings ~ N(0, 0.5^2), norm
    weights 1 + N(0, 0.1^2) (not all ones, so a missing or misplaced norm shows), biases ~ N(0, 0.1^2)."""
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = transformer_ref.head_dim_of(cfg)
    qkv_bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
    qk_norm = cfg["model_type"] == "qwen3"

    def lin(out_f, in_f):
        return (0.1 * rng.standard_normal((out_f, in_f))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    W = {"model.embed_tokens.weight": (0.5 * rng.standard_normal((V, D))).astype(np.float32)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        W[p + "input_layernorm.weight"] = norm(D)
        W[p + "self_attn.q_proj.weight"] = lin(nh * hd, D)
        W[p + "self_attn.k_proj.weight"] = lin(nkv * hd, D)
        W[p + "self_attn.v_proj.weight"] = lin(nkv * hd, D)
        W[p + "self_attn.o_proj.weight"] = lin(D, nh * hd)
        if qkv_bias:
            for n, size in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                W[p + f"self_attn.{n}_proj.bias"] = (0.1 * rng.standard_normal(size)).astype(
                    np.float32)
        if qk_norm:
            W[p + "self_attn.q_norm.weight"] = norm(hd)
            W[p + "self_attn.k_norm.weight"] = norm(hd)
        W[p + "post_attention_layernorm.weight"] = norm(D)
        W[p + "mlp.gate_proj.weight"] = lin(F, D)
        W[p + "mlp.up_proj.weight"] = lin(F, D)
        W[p + "mlp.down_proj.weight"] = lin(D, F)
    W["model.norm.weight"] = norm(D)
    if not cfg["tie_word_embeddings"]:
        W["lm_head.weight"] = lin(V, D)
    return W


def top2_gap(logits: np.ndarray) -> float:
    """min over rows of (top1 - top2) / max|row|."""
    s = np.sort(logits, axis=-1)
    return float(np.min((s[:, -1] - s[:, -2]) / np.abs(logits).max(axis=-1)))


def make_fixture(index: int, spec: dict) -> dict:
    cfg = spec["config"]
    folder = os.path.join(ROOT, spec["name"])
    os.makedirs(folder, exist_ok=True)
    W = make_weights(cfg, np.random.default_rng(SEED + index))
    W64 = {k: v.astype(np.float64) for k, v in W.items()}  # the reference sees the exact fp32 values
    id_rng = np.random.default_rng(SEED + 1000 + index)
    for attempt in range(1000):
        ids = id_rng.integers(0, cfg["vocab_size"], size=spec["seq"]).tolist()
        logits = transformer_ref.forward(cfg, W64, ids)
        if top2_gap(logits) >= MIN_TOP2_GAP:
            break
    else:
        raise RuntimeError(f"{spec['name']}: no id sequence with a clear argmax margin")

    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file(W, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    logits.astype("<f4").tofile(os.path.join(folder, "expected_logits.bin"))
    expected = {
        "input_ids": ids,
        "shape": list(logits.shape),
        "logits_file": "expected_logits.bin",
        "logits_dtype": "float32 little-endian, row-major [seq, vocab]",
        "reference": "tools/reference/transformer_ref.py (numpy float64)",
        "argmax": logits.argmax(-1).tolist(),
        "min_top2_gap_relative": round(top2_gap(logits), 6),
        "id_draws": attempt + 1,
    }
    with open(os.path.join(folder, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    return {"folder": folder, "weights": W, "config": cfg}


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """The C++ test's metric: max over rows of max|a - b| / max(max|b|, 1e-6)."""
    return float(np.max(np.abs(a - b).max(-1) / np.maximum(np.abs(b).max(-1), 1e-6)))


def expected_logits(name: str) -> tuple[list, np.ndarray]:
    with open(os.path.join(ROOT, name, "expected.json")) as f:
        e = json.load(f)
    return e["input_ids"], np.fromfile(os.path.join(ROOT, name, e["logits_file"]), "<f4").reshape(
        e["shape"])


def read_gguf_as_hf(path: str) -> dict:
    """GGUF tensors (read back with gguf.GGUFReader) under their HF names, rows left as stored. Tensors
    with no HF counterpart (rope_freqs.weight) keep their GGUF name."""
    back = {gguf_export.gguf_name(k): k for k in (
        [f"model.layers.0.{n}" for n in gguf_export._LAYER_NAMES] +
        [f"model.layers.1.{n}" for n in gguf_export._LAYER_NAMES] + list(gguf_export._GLOBAL_NAMES))}
    reader = gguf.GGUFReader(path)
    return {back.get(t.name, t.name): np.array(t.data, dtype=np.float64) for t in reader.tensors}


def verify(made: dict) -> dict:
    """Checks the exports and that each fixture's special feature changes the logits (so a test that
    ignores it fails). Returns {name: {check: relative error}}."""
    out = {}
    # GGUF llama: interleaved RoPE on the permuted rows must reproduce the HF logits; NeoX must not.
    ids, ref = expected_logits("llama-tiny")
    cfg = made["llama-tiny"]["config"]
    Wg = read_gguf_as_hf(os.path.join(ROOT, "llama-tiny.gguf"))
    out["llama-tiny.gguf"] = {
        "interleaved_rope_on_gguf": rel_err(transformer_ref.forward(
            {**cfg, "_rope_interleaved": True}, Wg, ids), ref),
        "neox_rope_on_gguf (must be large)": rel_err(transformer_ref.forward(cfg, Wg, ids), ref),
    }
    ids, ref = expected_logits("qwen2-tiny")
    Wg = read_gguf_as_hf(os.path.join(ROOT, "qwen2-tiny.gguf"))
    out["qwen2-tiny.gguf"] = {"neox_rope_on_gguf": rel_err(
        transformer_ref.forward(made["qwen2-tiny"]["config"], Wg, ids), ref)}
    assert out["llama-tiny.gguf"]["interleaved_rope_on_gguf"] < 1e-6, out
    assert out["qwen2-tiny.gguf"]["neox_rope_on_gguf"] < 1e-6, out

    # GGUF llama3: llama.cpp runs it as plain RoPE (no scaling keys) with the frequencies divided by
    # the file's rope_freqs.weight; that must reproduce the HF llama3-scaled logits. Ignoring the
    # tensor, or computing it with the converter's top-level original_max_position_embeddings lookup
    # (default 8192 instead of the config's 64), must not.
    ids, ref = expected_logits("llama3-tiny")
    cfg3 = made["llama3-tiny"]["config"]
    Wg = read_gguf_as_hf(os.path.join(ROOT, "llama3-tiny.gguf"))
    factors = Wg.pop("rope_freqs.weight")
    gcfg = {**cfg3, "rope_scaling": None, "_rope_interleaved": True}
    out["llama3-tiny.gguf"] = {
        "rope_freqs": [round(float(x), 6) for x in factors],
        "interleaved_rope_with_rope_freqs": rel_err(transformer_ref.forward(
            {**gcfg, "_rope_freq_factors": factors}, Wg, ids), ref),
        "rope_freqs ignored (must be large)": rel_err(transformer_ref.forward(gcfg, Wg, ids), ref),
        "rope_freqs with converter's original context 8192 (must be large)": rel_err(
            transformer_ref.forward({**gcfg, "_rope_freq_factors": gguf_export.llama3_rope_freqs(
                cfg3, converter_original_context=True)}, Wg, ids), ref),
    }
    g3 = out["llama3-tiny.gguf"]
    assert g3["interleaved_rope_with_rope_freqs"] < 1e-6, out
    assert g3["rope_freqs ignored (must be large)"] > 1e-2, out
    assert g3["rope_freqs with converter's original context 8192 (must be large)"] > 1e-2, out
    # Every band of the llama3 rule is present: kept (1), smoothed (strictly between), divided (factor).
    f = float(cfg3["rope_scaling"]["factor"])
    assert factors[0] == 1.0 and 1.0 < factors[1] < f and np.all(factors[2:] == f), factors

    def without(name: str, cfg_change: dict, drop=lambda k: False) -> float:
        ids, ref = expected_logits(name)
        m = made[name]
        W = {k: v.astype(np.float64) for k, v in m["weights"].items() if not drop(k)}
        return rel_err(transformer_ref.forward({**m["config"], **cfg_change}, W, ids), ref)

    out["sensitivity (must be large)"] = {
        "llama-tiny with interleaved rope": without("llama-tiny", {"_rope_interleaved": True}),
        "llama3-tiny without llama3 scaling": without("llama3-tiny", {"rope_scaling": None}),
        "mistral-tiny without sliding window": without("mistral-tiny", {"sliding_window": None}),
        # model_type mistral applies config.sliding_window (8) that use_sliding_window=false disables.
        "qwen2-tiny with its disabled window applied": without("qwen2-tiny", {"model_type": "mistral"}),
        "qwen2-tiny without qkv bias": without("qwen2-tiny", {}, lambda k: k.endswith(".bias")),
        "qwen3-tiny without q/k norm": without("qwen3-tiny", {}, lambda k: "_norm." in k and "self_attn" in k),
    }
    assert min(out["sensitivity (must be large)"].values()) > 1e-2, out
    # The window only changes positions >= window: the first `window` rows must agree exactly.
    ids, ref = expected_logits("mistral-tiny")
    m = made["mistral-tiny"]
    full = transformer_ref.forward({**m["config"], "sliding_window": None},
                                   {k: v.astype(np.float64) for k, v in m["weights"].items()}, ids)
    w = m["config"]["sliding_window"]
    assert rel_err(full[:w], ref[:w]) < 1e-6 and rel_err(full[w:w + 1], ref[w:w + 1]) > 1e-3
    return out


def folder_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


def main() -> None:
    made = {spec["name"]: make_fixture(i, spec) for i, spec in enumerate(FIXTURES)}
    gguf_export.export_llama(made["llama-tiny"]["config"], made["llama-tiny"]["weights"],
                             os.path.join(ROOT, "llama-tiny.gguf"))
    gguf_export.export_qwen2(made["qwen2-tiny"]["config"], made["qwen2-tiny"]["weights"],
                             os.path.join(ROOT, "qwen2-tiny.gguf"))
    gguf_export.export_llama(made["llama3-tiny"]["config"], made["llama3-tiny"]["weights"],
                             os.path.join(ROOT, "llama3-tiny.gguf"), name="llama3-tiny")
    print(json.dumps(verify(made), indent=1))
    total = 0
    for name in [s["name"] for s in FIXTURES] + ["llama-tiny.gguf", "qwen2-tiny.gguf",
                                                 "llama3-tiny.gguf"]:
        size = folder_bytes(os.path.join(ROOT, name))
        total += size
        print(f"{name:18s} {size:9,d} bytes")
    print(f"{'total':18s} {total:9,d} bytes  (numpy {np.__version__}, seed {SEED})")


if __name__ == "__main__":
    main()
