#!/usr/bin/env python3
"""PyTorch baselines for the served-throughput figure of issue 5, run in the same device call as InferX.

Both load random bf16 weights of a Llama shape (default: Llama-3-8B) straight on the GPU and generate
`--output-len` tokens (greedy, no early stop) for `--num-requests` random prompts of `--input-len` tokens,
`--concurrency` requests at a time (static batching in waves: each wave prefills, then decodes together).

  --impl hf      transformers' LlamaForCausalLM.generate with the static KV cache (eager: torch.compile
                 off, so the figure does not include minutes of compilation).
  --impl manual  a hand-written decoder: fused QKV and gate/up weights, RoPE, a preallocated contiguous KV
                 cache per wave, scaled_dot_product_attention with GQA (flash/efficient kernels), greedy.

Prints one JSON line: output tokens/s over the whole run (prefill included, as the served figure counts it).
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

SHAPES = {
    # hidden, layers, heads, kv heads, ffn, vocab, rope theta
    "llama-3-8b": (4096, 32, 32, 8, 14336, 128256, 500000.0),
    "tiny": (256, 2, 4, 2, 512, 1000, 10000.0),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", choices=["hf", "manual"], default="manual")
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-3-8b")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--prefill-batch", type=int, default=8, help="manual: prompts per prefill forward")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def run_hf(args, shape):
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv_heads, ffn, vocab, theta = shape
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=max(8192, args.input_len + args.output_len), rope_theta=theta,
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    gen = torch.Generator(device="cuda").manual_seed(args.seed)

    def wave(batch, out_len):
        ids = torch.randint(0, vocab, (batch, args.input_len), device="cuda", generator=gen)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out_len,
                             min_new_tokens=out_len, do_sample=False, cache_implementation="static",
                             disable_compile=True, pad_token_id=0)
        return out.shape[1] - args.input_len

    return model, wave


class Manual:
    def __init__(self, args, shape):
        hidden, layers, heads, kv_heads, ffn, vocab, theta = shape
        self.h, self.nl, self.nh, self.nkv, self.ffn, self.vocab = hidden, layers, heads, kv_heads, ffn, vocab
        self.hd = hidden // heads
        self.args = args
        dev, dt = "cuda", torch.bfloat16
        std = 0.02

        def w(*s):
            return torch.randn(*s, device=dev, dtype=dt) * std

        self.embed = w(vocab, hidden)
        self.lm_head = w(vocab, hidden)
        self.final_norm = torch.ones(hidden, device=dev, dtype=dt)
        qkv_out = (heads + 2 * kv_heads) * self.hd
        self.layers = [dict(attn_norm=torch.ones(hidden, device=dev, dtype=dt), wqkv=w(qkv_out, hidden),
                            wo=w(hidden, heads * self.hd), ffn_norm=torch.ones(hidden, device=dev, dtype=dt),
                            wgu=w(2 * ffn, hidden), wdown=w(hidden, ffn)) for _ in range(layers)]
        max_len = args.input_len + args.output_len
        inv = 1.0 / (theta ** (torch.arange(0, self.hd, 2, device=dev, dtype=torch.float32) / self.hd))
        ang = torch.outer(torch.arange(max_len, device=dev, dtype=torch.float32), inv)
        self.cos = torch.cat([ang.cos(), ang.cos()], -1).to(dt)  # [L, hd] (NeoX halves)
        self.sin = torch.cat([ang.sin(), ang.sin()], -1).to(dt)
        self.max_len = max_len

    @staticmethod
    def rmsnorm(x, w, eps=1e-5):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def rope(self, x, pos0, t):
        # x [B, H, T, hd]
        cos, sin = self.cos[pos0:pos0 + t], self.sin[pos0:pos0 + t]
        x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2:]
        rot = torch.cat([-x2, x1], -1)
        return x * cos + rot * sin

    def forward(self, tokens, pos0, ks, vs):
        b, t = tokens.shape
        x = self.embed[tokens]
        for li, L in enumerate(self.layers):
            h = self.rmsnorm(x, L["attn_norm"])
            qkv = h @ L["wqkv"].T
            q, k, v = qkv.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
            q = self.rope(q.view(b, t, self.nh, self.hd).transpose(1, 2), pos0, t)
            k = self.rope(k.view(b, t, self.nkv, self.hd).transpose(1, 2), pos0, t)
            v = v.view(b, t, self.nkv, self.hd).transpose(1, 2)
            ks[li][:, :, pos0:pos0 + t] = k
            vs[li][:, :, pos0:pos0 + t] = v
            kk, vv = ks[li][:, :, : pos0 + t], vs[li][:, :, : pos0 + t]
            a = F.scaled_dot_product_attention(q, kk, vv, is_causal=(t > 1 and pos0 == 0), enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(b, t, self.nh * self.hd) @ L["wo"].T
            h = self.rmsnorm(x, L["ffn_norm"])
            g, u = (h @ L["wgu"].T).chunk(2, -1)
            x = x + (F.silu(g) * u) @ L["wdown"].T
        last = self.rmsnorm(x[:, -1], self.final_norm)
        return (last @ self.lm_head.T).argmax(-1)

    def wave(self, batch, out_len, gen):
        a = self.args
        shape = (batch, self.nkv, self.max_len, self.hd)
        ks = [torch.empty(shape, device="cuda", dtype=torch.bfloat16) for _ in range(self.nl)]
        vs = [torch.empty(shape, device="cuda", dtype=torch.bfloat16) for _ in range(self.nl)]
        prompts = torch.randint(0, self.vocab, (batch, a.input_len), device="cuda", generator=gen)
        nxt = torch.empty(batch, dtype=torch.long, device="cuda")
        for b0 in range(0, batch, a.prefill_batch):
            b1 = min(batch, b0 + a.prefill_batch)
            nxt[b0:b1] = self.forward(prompts[b0:b1], 0, [k[b0:b1] for k in ks], [v[b0:b1] for v in vs])
        produced = 1
        for step in range(1, out_len):
            nxt = self.forward(nxt[:, None], a.input_len + step - 1, ks, vs)
            produced += 1
        return produced


def main():
    args = parse_args()
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    t_load = time.perf_counter()
    with torch.inference_mode():
        if args.impl == "hf":
            _, wave = run_hf(args, shape)
        else:
            m = Manual(args, shape)
            gen = torch.Generator(device="cuda").manual_seed(args.seed)

            def wave(batch, out_len):
                return m.wave(batch, out_len, gen)

        torch.cuda.synchronize()
        load_s = time.perf_counter() - t_load
        # Warm-up (kernel selection, allocator) on a small wave, not counted.
        wave(min(2, args.concurrency), min(8, args.output_len))
        torch.cuda.synchronize()
        done, produced = 0, 0
        t0 = time.perf_counter()
        while done < args.num_requests:
            batch = min(args.concurrency, args.num_requests - done)
            per_request = wave(batch, args.output_len)
            produced += per_request * batch
            done += batch
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
    print(json.dumps({"impl": args.impl, "shape": args.shape, "requests": args.num_requests,
                      "input_len": args.input_len, "output_len": args.output_len,
                      "concurrency": args.concurrency, "output_tokens": produced, "seconds": round(secs, 3),
                      "output_tok_per_s": round(produced / secs, 1),
                      "total_tok_per_s": round((produced + args.num_requests * args.input_len) / secs, 1),
                      "load_seconds": round(load_s, 1),
                      "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)}), flush=True)


if __name__ == "__main__":
    main()
