"""Independent fp64 numpy forward pass of the decoder-only transformers InferX supports.

Written from the Hugging Face `transformers` modeling semantics of LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM (modeling_llama.py, modeling_mistral.py,
modeling_qwen2.py, modeling_qwen3.py, masking_utils.py, modeling_rope_utils.py), not from InferX code,
so the golden tests compare two independent implementations.

Everything is computed in float64: the reference error is far below the fp32 tolerance of the tests.

    config  = json.load(open("folder/config.json"))
    weights = load_safetensors_fp64("folder/model.safetensors")
    logits  = forward(config, weights, input_ids)   # [len(input_ids), vocab]
"""

from __future__ import annotations

import math

import numpy as np


# ----------------------------------------------------------------------------------------- config --
def head_dim_of(cfg: dict) -> int:
    """config.head_dim when present (Qwen3, Llama 3.2 configs), else hidden_size // num_attention_heads."""
    hd = cfg.get("head_dim")
    return int(hd) if hd else cfg["hidden_size"] // cfg["num_attention_heads"]


def sliding_window_of(cfg: dict) -> int | None:
    """The attention window, or None for full attention.

    Mistral uses config.sliding_window when set. Qwen2 only when use_sliding_window is true (and then
    only for layers >= max_window_layers; our fixtures keep it off, so we reject the partial case).
    Llama and Qwen3 fixtures have no window.
    """
    mt = cfg["model_type"]
    w = cfg.get("sliding_window")
    if mt == "mistral":
        return int(w) if w else None
    if mt in ("qwen2", "qwen3"):
        if cfg.get("use_sliding_window", False):
            raise NotImplementedError("use_sliding_window=true is not modelled by this reference")
        return None
    return None


def rope_inv_freq(cfg: dict) -> np.ndarray:
    """inv_freq[i] = theta^(-2i/d) for i < d/2, with optional Llama 3.1 scaling.

    Llama 3 scaling re-implements transformers modeling_rope_utils._compute_llama3_parameters:
    wavelen = 2*pi/inv_freq; wavelengths above original_max/low_freq_factor are divided by `factor`,
    those below original_max/high_freq_factor are kept, and the band in between interpolates with
    smooth = (original_max/wavelen - low) / (high - low):
        inv = (1 - smooth) * inv / factor + smooth * inv.
    """
    d = head_dim_of(cfg)
    theta = float(cfg.get("rope_theta", 10000.0))
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if cfg.get("_rope_freq_factors") is not None:
        # GGUF "rope_freqs.weight" (llama.cpp's form of llama3 scaling): per-frequency divisors. Only
        # used to check GGUF exports; such a config must not also carry rope_scaling.
        if cfg.get("rope_scaling"):
            raise ValueError("_rope_freq_factors and rope_scaling together would scale twice")
        factors = np.asarray(cfg["_rope_freq_factors"], dtype=np.float64)
        if factors.shape != inv_freq.shape:
            raise ValueError(f"_rope_freq_factors has shape {factors.shape}, want {inv_freq.shape}")
        return inv_freq / factors
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(rs["factor"])
    if kind != "llama3":
        raise NotImplementedError(f"rope_scaling type {kind!r}")
    factor = float(rs["factor"])
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_ctx = float(rs["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled)


# ---------------------------------------------------------------------------------------- kernels --
def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """HF LlamaRMSNorm: x * rsqrt(mean(x^2, -1) + eps) * w (over the last axis)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate_half(x: np.ndarray) -> np.ndarray:
    """HF rotate_half: [x1, x2] -> [-x2, x1] over the last axis (NeoX layout: pairs (i, i + d/2))."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """x: [heads, T, d]. HF apply_rotary_pos_emb with emb = cat(freqs, freqs)."""
    freqs = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [T, d/2]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [T, d]
    return x * np.cos(emb)[None] + rotate_half(x) * np.sin(emb)[None]


def apply_rope_interleaved(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Meta/llama.cpp "normal" RoPE: pairs (2i, 2i+1) rotate by positions * inv_freq[i]. Only used to
    check GGUF llama exports, whose q/k rows convert_hf_to_gguf permutes for this layout."""
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [T, d/2]
    cos, sin = np.cos(ang)[None], np.sin(ang)[None]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """torch.nn.Linear: y = x @ W^T + b with W [out, in]."""
    y = x @ w.T
    return y + b if b is not None else y


def causal_mask(T: int, window: int | None) -> np.ndarray:
    """allowed[q, k]: transformers masking_utils causal_mask_function (k <= q) and, with a window,
    sliding_window_overlay (k > q - window), i.e. the last `window` positions including q itself."""
    q = np.arange(T)[:, None]
    k = np.arange(T)[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= k > q - window
    return allowed


# ---------------------------------------------------------------------------------------- forward --
def attention(cfg: dict, W: dict, i: int, x: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """One self-attention block on normed x [T, D]; returns the o_proj output [T, D]."""
    T = x.shape[0]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg)
    p = f"model.layers.{i}.self_attn."
    q = linear(x, W[p + "q_proj.weight"], W.get(p + "q_proj.bias"))
    k = linear(x, W[p + "k_proj.weight"], W.get(p + "k_proj.bias"))
    v = linear(x, W[p + "v_proj.weight"], W.get(p + "v_proj.bias"))
    q = q.reshape(T, nh, hd)
    k = k.reshape(T, nkv, hd)
    v = v.reshape(T, nkv, hd)
    if p + "q_norm.weight" in W:  # Qwen3: RMSNorm over each head's head_dim, before RoPE
        eps = cfg["rms_norm_eps"]
        q = rmsnorm(q, W[p + "q_norm.weight"], eps)
        k = rmsnorm(k, W[p + "k_norm.weight"], eps)
    q, k, v = (a.transpose(1, 0, 2) for a in (q, k, v))  # [heads, T, hd]
    pos = np.arange(T)
    rope = apply_rope_interleaved if cfg.get("_rope_interleaved") else apply_rope
    q = rope(q, pos, inv_freq)
    k = rope(k, pos, inv_freq)
    # GQA (HF repeat_kv): query head h reads kv head h // (nh / nkv).
    group = nh // nkv
    k = np.repeat(k, group, axis=0)
    v = np.repeat(v, group, axis=0)
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd)  # scaling = head_dim ** -0.5
    allowed = causal_mask(T, sliding_window_of(cfg))
    scores = np.where(allowed[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = (probs @ v).transpose(1, 0, 2).reshape(T, nh * hd)
    return linear(out, W[p + "o_proj.weight"], W.get(p + "o_proj.bias"))


def mlp(W: dict, i: int, x: np.ndarray) -> np.ndarray:
    """SwiGLU: down(silu(gate(x)) * up(x)) (hidden_act "silu")."""
    p = f"model.layers.{i}.mlp."
    return linear(silu(linear(x, W[p + "gate_proj.weight"])) * linear(x, W[p + "up_proj.weight"]),
                  W[p + "down_proj.weight"])


def forward(cfg: dict, W: dict, input_ids) -> np.ndarray:
    """Logits [T, vocab] (float64) for every position of one sequence starting at position 0."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act {cfg['hidden_act']!r}")
    ids = np.asarray(input_ids, dtype=np.int64)
    eps = cfg["rms_norm_eps"]
    inv_freq = rope_inv_freq(cfg)
    h = W["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        h = h + attention(cfg, W, i, rmsnorm(h, W[f"model.layers.{i}.input_layernorm.weight"], eps),
                          inv_freq)
        h = h + mlp(W, i, rmsnorm(h, W[f"model.layers.{i}.post_attention_layernorm.weight"], eps))
    h = rmsnorm(h, W["model.norm.weight"], eps)
    if cfg.get("tie_word_embeddings", False):
        lm_head = W["model.embed_tokens.weight"]
    else:
        lm_head = W["lm_head.weight"]
    return h @ lm_head.T


def load_safetensors_fp64(path: str) -> dict:
    """All tensors of a .safetensors file as float64 numpy arrays."""
    from safetensors.numpy import load_file

    return {k: v.astype(np.float64) for k, v in load_file(path).items()}


if __name__ == "__main__":
    import argparse
    import json
    import os

    ap = argparse.ArgumentParser(description="Print reference logits' argmax for a HF fixture folder")
    ap.add_argument("folder")
    ap.add_argument("ids", nargs="+", type=int)
    a = ap.parse_args()
    with open(os.path.join(a.folder, "config.json")) as f:
        config = json.load(f)
    logits = forward(config, load_safetensors_fp64(os.path.join(a.folder, "model.safetensors")), a.ids)
    print("argmax per position:", logits.argmax(-1).tolist())
