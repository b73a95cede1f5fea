"""Exports fixture weights to GGUF with the PyPI `gguf` package (llama.cpp's gguf-py GGUFWriter), the
way llama.cpp's convert_hf_to_gguf.py does for these architectures, so the GGUF path of InferX is
tested against files that do not come from our own writer.

- llama: tensors renamed to token_embd / blk.N.attn_q ... / output_norm / output, and the rows of
  attn_q and attn_k PERMUTED as convert_hf_to_gguf.py LlamaModel.permute does:
      w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
  with n_head = num_attention_heads for q and num_key_value_heads for k. HF stores each head as
  [first halves | second halves] (rotate_half pairs i and i + d/2); the permutation interleaves them so
  llama.cpp's "normal" RoPE (pairs 2i, 2i+1) computes the same thing. The attention scores and therefore
  the logits are unchanged.
- qwen2: same names, NOT permuted (llama.cpp runs qwen2 with NeoX RoPE), plus attn_q/k/v.bias.
- llama with rope_scaling rope_type "llama3" (Llama 3.1 and later): no rope scaling keys at all; instead
  an extra F32 tensor "rope_freqs.weight" of head_dim / 2 per-frequency DIVISORS of theta^(-2i/d)
  (convert_hf_to_gguf.py LlamaModel.generate_extra_tensors; llama.cpp passes it to ggml_rope_ext as
  freq_factors). An explicit config head_dim also gives attention.key_length / value_length
  (TextModel.set_gguf_parameters). Tied embeddings: the checkpoint has no lm_head.weight, so no
  output.weight is written and llama.cpp (and InferX) fall back to token_embd.

All tensors are written as F32, so expected logits equal those of the HF folder.
"""

from __future__ import annotations

import math

import numpy as np
import gguf

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute (rows of q/k weights or biases)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def gguf_name(hf_name: str) -> str:
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    parts = hf_name.split(".")  # model.layers.{i}.<rest>
    if parts[:2] != ["model", "layers"]:
        raise KeyError(hf_name)
    return f"blk.{parts[2]}.{_LAYER_NAMES['.'.join(parts[3:])]}"


def _hparams(w: gguf.GGUFWriter, cfg: dict, name: str) -> None:
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])


def _write(w: gguf.GGUFWriter, tensors: list[tuple[str, np.ndarray]]) -> None:
    for name, t in tensors:
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama3_rope_freqs(cfg: dict, converter_original_context: bool = False) -> np.ndarray:
    """The "rope_freqs.weight" tensor for rope_scaling rope_type "llama3": one divisor per frequency i,
    written from the llama3 rule (Llama 3.1 report section 3.3; transformers
    _compute_llama3_parameters), in float32 like convert_hf_to_gguf.py, which computes it in torch
    float32:
        inv_i   = 1 / theta^(2i/d)                   wavelen_i = 2 pi / inv_i
        wavelen_i < original / high_freq_factor   -> 1          (high frequencies kept)
        wavelen_i > original / low_freq_factor    -> factor     (low frequencies slowed down)
        otherwise                                  -> 1 / ((1 - s) / factor + s),
                                                      s = (original / wavelen_i - low) / (high - low)
    so that inv_i / divisor_i equals the HF scaled frequency in every band.

    `original` (original_max_position_embeddings): transformers reads it from rope_scaling, and so do
    we. convert_hf_to_gguf.py's LlamaModel instead reads the TOP-LEVEL config key and defaults to 8192;
    real Llama 3.x checkpoints keep 8192 inside rope_scaling, so both agree for them, but for a config
    whose value differs (our fixture: 64) the converter's tensor would not match the HF model.
    converter_original_context=True reproduces that lookup (only to show it matters)."""
    rs = cfg["rope_scaling"]
    if rs.get("rope_type", rs.get("type")) != "llama3":
        raise ValueError(f"rope_scaling {rs} is not llama3")
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    theta = np.float32(cfg.get("rope_theta", 10000.0))
    factor = float(rs.get("factor", 8.0))
    low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
    if converter_original_context:
        original = cfg.get("original_max_position_embeddings", 8192)
    else:
        original = rs.get("original_max_position_embeddings",
                          cfg.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = original / low, original / high
    inv = np.float32(1.0) / theta ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
    out = []
    for f in inv:  # np.float32 scalars: every step below stays in float32, as in the converter
        wavelen = np.float32(2 * math.pi) / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            s = (np.float32(original) / wavelen - np.float32(low)) / np.float32(high - low)
            out.append(np.float32(1.0) / ((np.float32(1.0) - s) / np.float32(factor) + s))
    return np.array(out, dtype=np.float32)


def export_llama(cfg: dict, weights: dict, path: str, name: str = "llama-tiny") -> None:
    """llama arch, SentencePiece-style ("llama") vocabulary: <unk>, <s>, </s>, then printable pieces.
    With rope_scaling llama3: rope_freqs.weight (first tensor, as the converter yields extra tensors
    before the checkpoint's); with an explicit head_dim: attention.key_length / value_length."""
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(path, "llama")
    _hparams(w, cfg, name)
    head_dim = cfg.get("head_dim")
    w.add_rope_dimension_count(head_dim or cfg["hidden_size"] // nh)
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    V = cfg["vocab_size"]
    pieces = ["<unk>", "<s>", "</s>"]
    chars = [chr(c) for c in range(0x21, 0x7F)]  # '!'..'~'
    pieces += ["\u2581"] + chars  # "▁" is the SentencePiece space
    pieces += ["\u2581" + c for c in chars]
    pieces += [f"<extra_{i}>" for i in range(V - len(pieces))]
    pieces = pieces[:V]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.NORMAL] * (V - 3)
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores([0.0, 0.0, 0.0] + [-float(i) for i in range(V - 3)])
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(cfg["bos_token_id"])
    eos = cfg["eos_token_id"]  # Llama 3 configs list several; the GGUF key holds one id
    w.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    tensors = []
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) == "llama3":
        tensors.append(("rope_freqs.weight", llama3_rope_freqs(cfg)))
    for k, t in weights.items():
        if k.endswith("self_attn.q_proj.weight"):
            t = permute(t, nh)
        elif k.endswith("self_attn.k_proj.weight"):
            t = permute(t, nkv)
        tensors.append((gguf_name(k), t))
    _write(w, tensors)


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's bytes_to_unicode order: printable bytes map to themselves, the rest to U+0100 + n."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def export_qwen2(cfg: dict, weights: dict, path: str) -> None:
    """qwen2 arch (NeoX RoPE, q/k/v biases), byte-level BPE ("gpt2") vocabulary: the first V - 2 byte
    symbols, the merged token "!!" (its one merge "! !", since llama.cpp requires a merges array) and
    <|endoftext|> last."""
    w = gguf.GGUFWriter(path, "qwen2")
    _hparams(w, cfg, "qwen2-tiny")
    V = cfg["vocab_size"]
    tokens = _gpt2_byte_chars()[: V - 2] + ["!!", "<|endoftext|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (V - 1) + [gguf.TokenType.CONTROL])
    w.add_token_merges(["! !"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(False)
    _write(w, [(gguf_name(k), t) for k, t in weights.items()])
