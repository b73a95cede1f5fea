#!/usr/bin/env python3
"""Tiny pre-quantized Hugging Face checkpoints in the published layouts, for the InferX loader tests.

Source: tests/golden/fixtures/llama-tiny (random-weight LlamaForCausalLM), cut to its first layer.
For each layout it writes <out>/<name>/config.json (with the layout's quantization_config),
model.safetensors (the layout's tensors) and dequant_reference.safetensors: the exact weights each
checkpoint represents (F32 [out, in] per linear layer), computed here from the codes, scales and zero
points before packing, so the C++ test checks the unpacking independently.

Layouts (written from their published descriptions, numpy only):
  fp8-tensor, fp8-channel  compressed-tensors "float-quantized": weight F8_E4M3 [N, K], weight_scale F32
                           [1] (strategy tensor) or [N, 1] (strategy channel); scale = amax / 448,
                           codes = round-to-nearest-even E4M3 of w / scale (saturating).
  awq                      AutoAWQ GEMM (version "gemm"), zero point asymmetric, group 32:
                           qweight I32 [K, N/8] packing 8 output columns per word in the order
                           (0, 2, 4, 6, 1, 3, 5, 7) (nibble i holds column 8j + order[i]); qzeros I32
                           [K/G, N/8] packed the same way; scales F16 [K/G, N].
  gptq                     AutoGPTQ "gptq" format, sym, desc_act false, group 32: qweight I32 [K/8, N]
                           (nibble i of word r = input row 8r + i), qzeros I32 [K/G, N/8] holding zero - 1
                           (8 output columns per word, in order), scales F16 [K/G, N], g_idx I32 [K].
  gptq-actorder            the same with desc_act true, asymmetric: input rows are quantized in a
                           permuted order, g_idx[row] = position of the row in that order // G.

The "-tp" variants (awq-tp, gptq-tp, fp8-channel-tp) have an MLP of 128 columns (random weights, seeded, of
the original MLP's spread) instead of llama-tiny's 96, so that two tensor-parallel ranks each get whole
groups of 32 of down's input (96 / 2 = 48 would cut one).

Usage: python3 tools/make_quantized_fixtures.py [--out tests/unit/model/fixtures]
"""
import argparse
import json
import os
import struct

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "golden", "fixtures", "llama-tiny")
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
GROUP = 32
DT = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "U8": np.uint8, "F8_E4M3": np.uint8}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[b:end], dtype=DT[e["dtype"]]).reshape(e["shape"])
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, numpy array). Header keys sorted, data 8-byte aligned."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


# ---- FP8 E4M3 (OCP OFP8 rev 1.0): value table and nearest-even encoder -----------------------------
def e4m3_values():
    v = np.zeros(256, dtype=np.float64)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        mag = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        v[c] = -mag if s else mag
    v[0x7F] = v[0xFF] = np.nan
    return v


E4M3 = e4m3_values()


def to_e4m3(x):
    mags = E4M3[:0x7F]  # codes 0..0x7E, increasing
    a = np.minimum(np.abs(x.astype(np.float64)), 448.0)
    hi = np.clip(np.searchsorted(mags, a), 1, 0x7E)
    lo = hi - 1
    dlo, dhi = a - mags[lo], mags[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    code = np.where(a == 0, 0, code).astype(np.uint8)
    return code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)


def fp8(w, channel):
    amax = np.abs(w).max(axis=1, keepdims=True) if channel else np.abs(w).max().reshape(1, 1)
    scale = np.where(amax > 0, amax / 448.0, 1.0).astype(np.float32)
    codes = to_e4m3(w / scale)
    deq = (E4M3[codes] * scale).astype(np.float32)
    return codes, (scale.reshape(-1, 1) if channel else scale.reshape(1)), deq


# ---- INT4 groups --------------------------------------------------------------------------------
def group_quant(w, sym):
    """w [N, K] -> codes [N, K] (0..15), scales f16 [N, K/G], zeros [N, K/G]; dequant uses f16 scales."""
    n, k = w.shape
    g = w.reshape(n, k // GROUP, GROUP).astype(np.float32)
    if sym:  # GPTQ sym: scale = 2 max|w| / 15, zero (maxq + 1) / 2 = 8
        xmax = np.abs(g).max(axis=2)
        scale = np.where(xmax > 0, 2 * xmax / 15, 1.0)
        zero = np.full(scale.shape, 8.0)
    else:  # AWQ / GPTQ asym: scale = (max - min) / 15, zero = round(-min / scale)
        mx, mn = g.max(axis=2), g.min(axis=2)
        scale = np.maximum(mx - mn, 1e-5) / 15
        zero = np.clip(np.round(-mn / scale), 0, 15)
    scale16 = scale.astype(np.float16)
    q = np.clip(np.round(g / scale16.astype(np.float32)[..., None]) + zero[..., None], 0, 15).astype(np.int64)
    deq = (scale16.astype(np.float32)[..., None] * (q - zero[..., None])).reshape(n, k).astype(np.float32)
    return q.reshape(n, k), scale16, zero.astype(np.int64), deq


def pack_cols(vals, order):
    """vals [R, C] (0..15) -> int32 [R, C/8]; nibble i of word j holds column 8j + order[i]."""
    r, c = vals.shape
    out = np.zeros((r, c // 8), dtype=np.uint32)
    for i, col in enumerate(order):
        out |= (vals[:, col::8].astype(np.uint32) & 15) << (4 * i)
    return out.view(np.int32)


def pack_rows(vals):
    """vals [R, C] -> int32 [R/8, C]; nibble i of word r holds row 8r + i (GPTQ qweight)."""
    r, c = vals.shape
    out = np.zeros((r // 8, c), dtype=np.uint32)
    for i in range(8):
        out |= (vals[i::8, :].astype(np.uint32) & 15) << (4 * i)
    return out.view(np.int32)


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq(w):
    q, s, z, deq = group_quant(w, sym=False)        # [N, K], [N, K/G]
    return {"qweight": ("I32", pack_cols(q.T, AWQ_ORDER)), "qzeros": ("I32", pack_cols(z.T, AWQ_ORDER)),
            "scales": ("F16", np.ascontiguousarray(s.T))}, deq


def gptq(w, act_order, rng):
    n, k = w.shape
    perm = rng.permutation(k) if act_order else np.arange(k)
    q_p, s, z, deq_p = group_quant(w[:, perm], sym=not act_order)   # groups over the permuted rows
    q = np.empty_like(q_p)
    q[:, perm] = q_p
    deq = np.empty_like(deq_p)
    deq[:, perm] = deq_p
    g_idx = np.empty(k, dtype=np.int32)
    g_idx[perm] = np.arange(k) // GROUP
    return {"qweight": ("I32", pack_rows(q.T)), "qzeros": ("I32", pack_cols(z.T - 1, range(8))),
            "scales": ("F16", np.ascontiguousarray(s.T)), "g_idx": ("I32", g_idx)}, deq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "unit", "model", "fixtures"))
    args = ap.parse_args()
    src = read_safetensors(os.path.join(SRC, "model.safetensors"))
    config = json.load(open(os.path.join(SRC, "config.json")))
    config["num_hidden_layers"] = 1
    base = {}
    for name, arr in src.items():
        if name.startswith("model.layers.") and not name.startswith("model.layers.0."):
            continue
        if name.startswith("model.layers.0.") and any(l in name for l in LINEARS):
            continue
        base[name] = ("F16", arr.astype(np.float16)) if arr.ndim == 2 else ("F32", arr)
    rng = np.random.default_rng(1234)
    ct = lambda strategy: {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 8, "type": "float", "strategy": strategy,
                                                  "symmetric": True, "dynamic": False},
                                      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                                            "symmetric": True, "dynamic": True}}},
        "ignore": ["lm_head"]}
    layouts = {
        "fp8-tensor": ct("tensor"),
        "fp8-channel": ct("channel"),
        "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"},
        "gptq": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": True,
                 "checkpoint_format": "gptq"},
        "gptq-actorder": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": True, "sym": False,
                          "checkpoint_format": "gptq"},
    }
    layouts["awq-tp"] = layouts["awq"]
    layouts["gptq-tp"] = layouts["gptq"]
    layouts["fp8-channel-tp"] = layouts["fp8-channel"]
    mlp_rng = np.random.default_rng(4321)
    wide = {}  # the -tp variants' MLP: 128 columns
    for lin, shape in (("mlp.gate_proj", (128, 64)), ("mlp.up_proj", (128, 64)), ("mlp.down_proj", (64, 128))):
        spread = float(src["model.layers.0." + lin + ".weight"].astype(np.float32).std())
        wide["model.layers.0." + lin + ".weight"] = (mlp_rng.standard_normal(shape) * spread).astype(np.float32)
    for name, qc in layouts.items():
        tensors, ref = dict(base), {}
        for lin in LINEARS:
            p = "model.layers.0." + lin
            w = src[p + ".weight"].astype(np.float32)
            if name.endswith("-tp") and p + ".weight" in wide:
                w = wide[p + ".weight"]
            if name.startswith("fp8"):
                codes, scale, deq = fp8(w, name == "fp8-channel")
                tensors[p + ".weight"] = ("F8_E4M3", codes)
                tensors[p + ".weight_scale"] = ("F32", scale)
            else:
                parts, deq = awq(w) if name.startswith("awq") else gptq(w, name == "gptq-actorder", rng)
                for k, v in parts.items():
                    tensors[p + "." + k] = v
            ref[p + ".weight"] = ("F32", deq)
        d = os.path.join(args.out, name + "-tiny")
        os.makedirs(d, exist_ok=True)
        cfg = dict(config)
        if name.endswith("-tp"):
            cfg["intermediate_size"] = 128
        cfg["quantization_config"] = qc
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        if not name.endswith("-tp"):  # the -tp variants are checked against each other, not against llama-tiny
            write_safetensors(os.path.join(d, "dequant_reference.safetensors"), ref)
        print("wrote", d)


if __name__ == "__main__":
    main()
