#!/usr/bin/env python3
"""Train a small Llama with 128-wide heads on the teacher's stories (teacher_text.py) and write it as a GGUF
that InferX loads (tokenizer and vocabulary copied from stories260K.gguf).

Why: stories260K's heads are 8 wide, which the CUDA decode attention kernel does not take (64 / 128), so its
perplexity never goes through the kernels that serve generated tokens. This student has Llama-3's head
width (128), grouped-query attention (2 query heads per KV head) and attention patterns learned from text,
so `inferx perplexity --decode-steps` measures what an FP8 KV cache or the decode kernel's rounding does.

    python3 scripts/tiny_model/train.py --text /tmp/teacher.txt --teacher ../shared/testdata/stories260K.gguf \
        --inferx build/cuda/src/cli/inferx --out tests/unit/model/fixtures/stories-hd128.gguf

Needs jax (CPU) and gguf from PyPI; a few minutes on 2 cores. The RoPE is llama.cpp's "normal" layout
(adjacent pairs), which InferX applies to GGUF llama models.
"""
import argparse
import json
import math
import os
import subprocess
import tempfile
import time

import gguf
import jax
import jax.numpy as jnp
import numpy as np

DIM, LAYERS, HEADS, KV_HEADS, HEAD_DIM, HIDDEN, VOCAB, CTX = 256, 2, 2, 1, 128, 384, 512, 512
EPS, THETA, BOS, EOS = 1e-5, 10000.0, 1, 2


def tokenize(inferx, teacher, text_path):
    stories = [s.strip() for s in open(text_path).read().split("\n\n") if s.strip()]
    jsonl = os.path.join(tempfile.mkdtemp(), "stories.jsonl")
    with open(jsonl, "w") as f:
        for s in stories:
            f.write(json.dumps(s) + "\n")
    out = subprocess.run([inferx, "tokenize", "-m", teacher, "--jsonl", jsonl], check=True, capture_output=True,
                         text=True).stdout
    ids = []
    for line in out.splitlines():
        toks = [int(t) for t in line.replace(",", " ").split()]
        if toks and toks[0] != BOS:
            toks = [BOS] + toks
        ids.extend(toks + [EOS])
    return np.array(ids, dtype=np.int32)


def init(key):
    def normal(k, shape, std):
        return jax.random.normal(k, shape, jnp.float32) * std

    keys = iter(jax.random.split(key, 8 * LAYERS + 2))
    resid = 0.02 / math.sqrt(2 * LAYERS)
    p = {"emb": normal(next(keys), (VOCAB, DIM), 0.02), "norm": jnp.ones(DIM), "layers": []}
    for _ in range(LAYERS):
        p["layers"].append({
            "attn_norm": jnp.ones(DIM), "ffn_norm": jnp.ones(DIM),
            "q": normal(next(keys), (HEADS * HEAD_DIM, DIM), 0.02),
            "k": normal(next(keys), (KV_HEADS * HEAD_DIM, DIM), 0.02),
            "v": normal(next(keys), (KV_HEADS * HEAD_DIM, DIM), 0.02),
            "o": normal(next(keys), (DIM, HEADS * HEAD_DIM), resid),
            "gate": normal(next(keys), (HIDDEN, DIM), 0.02),
            "up": normal(next(keys), (HIDDEN, DIM), 0.02),
            "down": normal(next(keys), (DIM, HIDDEN), resid)})
    return p


def rmsnorm(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def rope(x, pos):  # x [B, T, H, D]; adjacent pairs (2i, 2i + 1) rotate by pos * theta^(-2i / D)
    inv = THETA ** (-jnp.arange(0, HEAD_DIM, 2, dtype=jnp.float32) / HEAD_DIM)
    ang = pos[:, None].astype(jnp.float32) * inv[None, :]  # [T, D/2]
    c, s = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return jnp.stack([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1).reshape(x.shape)


def forward(p, tokens):  # tokens [B, T] -> logits [B, T, V]
    B, T = tokens.shape
    pos = jnp.arange(T)
    x = p["emb"][tokens]
    mask = jnp.tril(jnp.ones((T, T), bool))
    for l in p["layers"]:
        h = rmsnorm(x, l["attn_norm"])
        q = rope((h @ l["q"].T).reshape(B, T, HEADS, HEAD_DIM), pos)
        k = rope((h @ l["k"].T).reshape(B, T, KV_HEADS, HEAD_DIM), pos)
        v = (h @ l["v"].T).reshape(B, T, KV_HEADS, HEAD_DIM)
        k = jnp.repeat(k, HEADS // KV_HEADS, axis=2)
        v = jnp.repeat(v, HEADS // KV_HEADS, axis=2)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HEAD_DIM)
        s = jnp.where(mask[None, None], s, -1e30)
        a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v).reshape(B, T, HEADS * HEAD_DIM)
        x = x + a @ l["o"].T
        h = rmsnorm(x, l["ffn_norm"])
        x = x + (jax.nn.silu(h @ l["gate"].T) * (h @ l["up"].T)) @ l["down"].T
    return rmsnorm(x, p["norm"]) @ p["emb"].T


def loss_fn(p, batch):
    logits = forward(p, batch[:, :-1])
    lp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(lp, batch[:, 1:, None], axis=-1))


@jax.jit
def train_step(p, m, v, batch, lr, t):
    loss, g = jax.value_and_grad(loss_fn)(p, batch)
    gnorm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g)))
    g = jax.tree_util.tree_map(lambda x: x * jnp.minimum(1.0, 1.0 / (gnorm + 1e-6)), g)  # clip at 1
    b1, b2 = 0.9, 0.95
    m = jax.tree_util.tree_map(lambda a, b: b1 * a + (1 - b1) * b, m, g)
    v = jax.tree_util.tree_map(lambda a, b: b2 * a + (1 - b2) * b * b, v, g)
    def upd(w, mm, vv):
        step = lr * (mm / (1 - b1 ** t)) / (jnp.sqrt(vv / (1 - b2 ** t)) + 1e-8)
        return w - step - lr * 0.1 * w * (w.ndim == 2)  # AdamW, decay on matrices only
    p = jax.tree_util.tree_map(upd, p, m, v)
    return p, m, v, loss


def chunk_perplexity(p, ids, ctx=128):
    """inferx perplexity's rule: chunks of ctx, first token BOS, the second half scored."""
    f = jax.jit(forward)
    nll, n = 0.0, 0
    for c in range(len(ids) // ctx):
        chunk = np.array(ids[c * ctx:(c + 1) * ctx])
        chunk[0] = BOS
        lp = jax.nn.log_softmax(f(p, jnp.array(chunk[None]))[0], axis=-1)
        for j in range(ctx // 2, ctx - 1):
            nll -= float(lp[j, chunk[j + 1]])
            n += 1
    return math.exp(nll / n)


def write_gguf(p, teacher_path, out):
    t = gguf.GGUFReader(teacher_path)
    w = gguf.GGUFWriter(out, "llama")
    w.add_name("stories-hd128 (student of stories260K, InferX test fixture)")
    w.add_context_length(CTX)
    w.add_embedding_length(DIM)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(EPS)
    field = lambda name: t.fields[name]
    w.add_tokenizer_model("llama")
    tokens = field("tokenizer.ggml.tokens")
    w.add_token_list([bytes(tokens.parts[i]) for i in tokens.data])
    scores = field("tokenizer.ggml.scores")
    w.add_token_scores([float(scores.parts[i][0]) for i in scores.data])
    types = field("tokenizer.ggml.token_type")
    w.add_token_types([int(types.parts[i][0]) for i in types.data])
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_unk_token_id(0)
    f16 = lambda x: np.asarray(x, np.float32).astype(np.float16)
    w.add_tensor("token_embd.weight", f16(p["emb"]))
    w.add_tensor("output_norm.weight", np.asarray(p["norm"], np.float32))
    for i, l in enumerate(p["layers"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.asarray(l["attn_norm"], np.float32))
        w.add_tensor(b + "ffn_norm.weight", np.asarray(l["ffn_norm"], np.float32))
        for name, key in (("attn_q", "q"), ("attn_k", "k"), ("attn_v", "v"), ("attn_output", "o"),
                          ("ffn_gate", "gate"), ("ffn_up", "up"), ("ffn_down", "down")):
            w.add_tensor(b + name + ".weight", f16(l[key]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True)
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--inferx", required=True)
    ap.add_argument("--eval", default="tests/unit/model/fixtures/stories_eval.txt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    ids = tokenize(a.inferx, a.teacher, a.text)
    print(f"{len(ids)} training tokens", flush=True)
    n_seq = (len(ids) - 1) // a.seq
    rng = np.random.default_rng(a.seed)
    p = init(jax.random.PRNGKey(a.seed))
    m = jax.tree_util.tree_map(jnp.zeros_like, p)
    v = jax.tree_util.tree_map(jnp.zeros_like, p)
    t0 = time.time()
    for step in range(1, a.steps + 1):
        starts = rng.integers(0, n_seq, a.batch) * a.seq
        batch = jnp.array(np.stack([ids[s:s + a.seq + 1] for s in starts]))
        warm = min(1.0, step / 100)
        lr = a.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        p, m, v, loss = train_step(p, m, v, batch, lr, step)
        if step % 100 == 0 or step == 1:
            print(f"step {step} loss {float(loss):.4f} {time.time() - t0:.0f} s", flush=True)
    # The eval text as inferx perplexity tokenizes it (the whole file, one BOS), not story by story.
    out = subprocess.run([a.inferx, "tokenize", "-m", a.teacher, "-f", a.eval, "--ids"], check=True,
                         capture_output=True, text=True).stdout
    ev = [int(x) for x in out.replace(",", " ").split()]
    print(f"eval perplexity (JAX, F32 weights): {chunk_perplexity(p, ev):.4f}", flush=True)
    # The same with the F16 weights the GGUF stores, for comparison with inferx perplexity.
    p16 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float16).astype(jnp.float32) if x.ndim == 2 else x, p)
    print(f"eval perplexity (JAX, F16 weights): {chunk_perplexity(p16, ev):.4f}", flush=True)
    write_gguf(p, a.teacher, a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
