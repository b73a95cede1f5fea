#!/usr/bin/env python3
"""PyTorch baselines for the served-throughput figure of issue 5, run in the same device call as InferX.

Both load random bf16 weights of a Llama shape (default: Llama-3-8B) straight on the device and generate
`--output-len` tokens (greedy, no early stop) for `--num-requests` random prompts of `--input-len` tokens,
`--concurrency` requests at a time (static batching in waves: each wave prefills, then decodes together).

  --impl hf      transformers' LlamaForCausalLM.generate with the static KV cache, SDPA attention, eager
                 (torch.compile off unless --compile, so the figure does not include minutes of compilation).
                 The model is built from a LlamaConfig on the device (no download, no CPU init of the weights),
                 then every weight is redrawn from one seeded generator (matrices N(0, 0.02), norms 1).
                 Works with transformers 4.4x, 4.5x and 5.x: --hf-cache auto uses
                 generate(cache_implementation="static") and falls back to a StaticCache object built for the
                 installed signature; the summary's "hf_path" says which ran.
  --impl manual  a hand-written decoder: fused QKV and gate/up weights, RoPE, a preallocated contiguous KV
                 cache per wave, scaled_dot_product_attention with GQA (flash/efficient kernels), greedy.
  --check        builds the transformers model, copies its weights into the hand-written decoder and checks
                 that both generate the same greedy tokens (float32 by default; a correctness test of both
                 baselines, e.g. `--check --device cpu --shape tiny`).

Prints one JSON line after every wave, each a complete summary of the waves done so far ("final": false), and
a last one with "final": true, so the last line always holds the best figure available, even when the run
is stopped: SIGTERM/SIGINT (e.g. from `timeout`) end the run at once and print the summary, with the cut
wave's prefill time, decode ms/step and the figure a whole wave would have reached ("partial_wave");
--time-budget starts no wave that would not end in time. Output tokens/s counts the whole run, prefill
included, as the served figure does; "wave_tok_per_s", "wave_prefill_s" and "wave_decode_step_ms" list each
wave (the manual decoder's decode steps are timed as launched, the transformers ones as generate syncs).

CPU test (seconds): --device cpu --shape tiny [--check | --impl hf | --impl manual] --input-len 64 --output-len 16
"""
import argparse
import inspect
import json
import signal
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {
    # hidden, layers, heads, kv heads, ffn, vocab, rope theta
    "llama-3-8b": (4096, 32, 32, 8, 14336, 128256, 500000.0),
    "tiny": (256, 2, 4, 2, 512, 1000, 500000.0),  # CPU tests; Llama-3's theta (not the config default)
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", choices=["hf", "manual"], default="manual")
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-3-8b")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (tests with --shape tiny)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16 (fp32 for --check)")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--prefill-batch", type=int, default=8, help="manual: prompts per prefill forward")
    p.add_argument("--hf-cache", choices=["auto", "string", "object"], default="auto",
                   help="hf: generate(cache_implementation='static') (string), a StaticCache object (object), "
                        "or string with a fallback to object (auto)")
    p.add_argument("--compile", action="store_true",
                   help="hf: let transformers torch.compile the decode step (or compile forward on versions "
                        "without auto-compile); the warm-up is then a full wave, not counted")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds for the timed waves: no wave is started that the last wave's time says "
                        "would end past it (0: no limit)")
    p.add_argument("--check", action="store_true", help="compare hf and manual greedy tokens, then exit")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    a.dtype = DTYPES[a.dtype or ("fp32" if a.check else "bf16")]
    a.device = torch.device(a.device)
    return a


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def llama_config(args, shape):
    from transformers import LlamaConfig

    hidden, layers, heads, kv_heads, ffn, vocab, theta = shape
    kw = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv_heads,
              max_position_embeddings=max(8192, args.input_len + args.output_len), rope_theta=theta,
              rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              attn_implementation="sdpa")
    cfg = LlamaConfig(**kw)
    # 5.x keeps RoPE parameters in rope_parameters; make sure theta landed wherever this version reads it.
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and rp.get("rope_theta") not in (None, theta):
        rp["rope_theta"] = theta
    return cfg


class Progress:
    """Timestamps of one wave: its start, then one per generated token (the first marks the prefill's end)."""

    def __init__(self, dev):
        self.dev, self.batch, self.t0, self.steps = dev, 0, 0.0, []

    def start(self, batch):
        self.batch, self.t0, self.steps = batch, time.perf_counter(), []

    def step(self, exact=False):
        if exact:
            sync(self.dev)
        self.steps.append(time.perf_counter())

    def stats(self):
        """prefill seconds, decode ms per step (None when unknown)."""
        if not self.steps:
            return None, None
        pre = round(self.steps[0] - self.t0, 2)
        if len(self.steps) < 2:
            return pre, None
        return pre, round((self.steps[-1] - self.steps[0]) / (len(self.steps) - 1) * 1e3, 2)


class HF:
    """transformers LlamaForCausalLM + generate with a static cache."""

    def __init__(self, args, shape):
        import transformers
        from transformers import LlamaForCausalLM

        self.args, self.vocab, self.dev = args, shape[5], args.device
        self.progress = Progress(self.dev)
        self.info = {"transformers": transformers.__version__}
        cfg = llama_config(args, shape)
        prev = torch.get_default_dtype()
        torch.set_default_dtype(args.dtype)
        try:
            with self.dev:  # parameters are allocated (and default-initialized) on the device, not the CPU
                model = LlamaForCausalLM(cfg)
        finally:
            torch.set_default_dtype(prev)
        model.requires_grad_(False)
        if any(p.device != self.dev for p in model.parameters()):
            model.to(self.dev)
        # One seeded draw for every weight, whatever this transformers version's _init_weights does.
        g = torch.Generator(device=self.dev).manual_seed(args.seed)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02, generator=g)
                else:
                    p.fill_(1.0)
        model.eval()
        self.model = model
        dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()})
        self.info["param_dtypes"] = ",".join(dtypes)
        self.info["attn"] = getattr(model.config, "_attn_implementation", None)
        rot = getattr(model.model, "rotary_emb", None)
        if rot is not None and hasattr(rot, "inv_freq"):  # did rope_theta reach the model in this version?
            hd = shape[0] // shape[2]
            want = 1.0 / (shape[6] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            self.info["rope_theta_ok"] = bool(torch.allclose(rot.inv_freq.float().cpu(), want, rtol=1e-4))

        # Compilation: transformers >= 4.47 compiles the decode step by itself when generate runs with a static
        # cache on CUDA; 4.49+ honours generation_config.disable_compile (4.49 reads the model's own
        # generation_config, later versions the one generate gets). Without --compile, switch it off every way
        # this version knows, including get_compiled_call (the hook 4.47-5.x call), and count the requests.
        from transformers import GenerationConfig

        self.compile_requests = 0
        self.gen_kwargs = {}
        self.has_disable_compile = hasattr(GenerationConfig(), "disable_compile")
        has_hook = hasattr(model, "get_compiled_call")
        if args.compile:
            if has_hook:
                self.info["compile"] = "transformers auto-compile of the decode step (CUDA only)"
            else:
                model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
                self.info["compile"] = "torch.compile(model.forward, mode=reduce-overhead, fullgraph)"
        else:
            how = []
            if self.has_disable_compile:
                model.generation_config.disable_compile = True
                self.gen_kwargs["disable_compile"] = True
                how.append("disable_compile")
            if has_hook:
                eager = model.__call__

                def no_compile(*_a, **_k):
                    self.compile_requests += 1
                    return eager

                model.get_compiled_call = no_compile
                how.append("get_compiled_call->eager")
            self.info["compile"] = "off (" + (", ".join(how) or "this version has no auto-compile") + ")"

        fwd = inspect.signature(type(model).forward).parameters
        self.cache_kw = "cache" if "cache" in fwd else "past_key_values"
        self.mode = args.hf_cache

        # A stopping criterion that never stops: it timestamps every generated token (generate syncs on every
        # step anyway; the first one is synced here so that it marks the end of the prefill).
        from transformers import StoppingCriteria, StoppingCriteriaList

        progress = self.progress

        class Tick(StoppingCriteria):
            def __call__(self, input_ids, scores=None, **kwargs):
                progress.step(exact=not progress.steps)
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        self.gen_kwargs["stopping_criteria"] = StoppingCriteriaList([Tick()])

    def _static_cache(self, batch, max_len):
        from transformers import StaticCache

        sig = inspect.signature(StaticCache.__init__).parameters
        kw = {"config": self.model.config, "max_cache_len": max_len}
        if "batch_size" in sig:  # 4.45-4.55
            kw["batch_size"] = batch
        elif "max_batch_size" in sig:  # 4.38-4.44
            kw["max_batch_size"] = batch
        if "device" in sig:
            kw["device"] = self.dev
        if "dtype" in sig:
            kw["dtype"] = self.args.dtype
        # 4.56+ / 5.x: (config, max_cache_len, offloading, ...), allocated lazily on the first update.
        return StaticCache(**kw), "StaticCache(" + ", ".join(k for k in kw) + f") as {self.cache_kw}="

    def _generate(self, ids, out_len, mode):
        kw = dict(self.gen_kwargs, attention_mask=torch.ones_like(ids), max_new_tokens=out_len,
                  min_new_tokens=out_len, do_sample=False, num_beams=1, pad_token_id=0)
        if mode == "string":
            kw["cache_implementation"] = "static"
            path = "generate(cache_implementation='static')"
        else:
            cache, path = self._static_cache(ids.shape[0], ids.shape[1] + out_len)
            kw[self.cache_kw] = cache
            path = f"generate({path})"
        return self.model.generate(ids, **kw), path

    def generate(self, prompts, out_len):
        if self.mode == "auto":
            try:
                out, path = self._generate(prompts, out_len, "string")
                self.mode = "string"
            except Exception as e:  # noqa: BLE001 - any API mismatch: try the explicit cache object
                print(f"hf: cache_implementation='static' failed ({type(e).__name__}: {e}); "
                      "trying a StaticCache object", file=sys.stderr, flush=True)
                out, path = self._generate(prompts, out_len, "object")
                self.mode = "object"
                path += f" [fallback after {type(e).__name__}]"
        else:
            out, path = self._generate(prompts, out_len, self.mode)
        if self.gen_kwargs.get("disable_compile"):
            path = path.replace("generate(", "generate(disable_compile=True, ", 1)
        self.info["hf_path"] = path
        return out[:, prompts.shape[1]:]

    def wave(self, batch, out_len, gen):
        ids = torch.randint(0, self.vocab, (batch, self.args.input_len), device=self.dev, generator=gen)
        self.progress.start(batch)
        new = self.generate(ids, out_len)
        return new.shape[1]


class Manual:
    def __init__(self, args, shape, hf_model=None):
        hidden, layers, heads, kv_heads, ffn, vocab, theta = shape
        self.h, self.nl, self.nh, self.nkv, self.ffn, self.vocab = hidden, layers, heads, kv_heads, ffn, vocab
        self.hd = hidden // heads
        self.args = args
        dev, dt = args.device, args.dtype
        self.dev, self.dt = dev, dt
        std = 0.02
        g = torch.Generator(device=dev).manual_seed(args.seed)

        def w(*s):
            return torch.randn(*s, device=dev, dtype=dt, generator=g) * std

        if hf_model is None:
            self.embed = w(vocab, hidden)
            self.lm_head = w(vocab, hidden)
            self.final_norm = torch.ones(hidden, device=dev, dtype=dt)
            qkv_out = (heads + 2 * kv_heads) * self.hd
            self.layers = [dict(attn_norm=torch.ones(hidden, device=dev, dtype=dt), wqkv=w(qkv_out, hidden),
                                wo=w(hidden, heads * self.hd), ffn_norm=torch.ones(hidden, device=dev, dtype=dt),
                                wgu=w(2 * ffn, hidden), wdown=w(hidden, ffn)) for _ in range(layers)]
        else:  # the same weights as a transformers LlamaForCausalLM (--check)
            m = hf_model.model

            def c(t):
                return t.detach().to(dev, dt)

            self.embed, self.lm_head, self.final_norm = c(m.embed_tokens.weight), c(hf_model.lm_head.weight), \
                c(m.norm.weight)
            self.layers = []
            for L in m.layers:
                a, f = L.self_attn, L.mlp
                self.layers.append(dict(
                    attn_norm=c(L.input_layernorm.weight), ffn_norm=c(L.post_attention_layernorm.weight),
                    wqkv=c(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])), wo=c(a.o_proj.weight),
                    wgu=c(torch.cat([f.gate_proj.weight, f.up_proj.weight])), wdown=c(f.down_proj.weight)))
        max_len = args.input_len + args.output_len
        inv = 1.0 / (theta ** (torch.arange(0, self.hd, 2, device=dev, dtype=torch.float32) / self.hd))
        ang = torch.outer(torch.arange(max_len, device=dev, dtype=torch.float32), inv)
        self.cos = torch.cat([ang.cos(), ang.cos()], -1).to(dt)  # [L, hd] (NeoX halves)
        self.sin = torch.cat([ang.sin(), ang.sin()], -1).to(dt)
        self.max_len = max_len
        self.suppress = None  # --check: token ids never chosen (generate's min_new_tokens masks EOS)
        self.progress = Progress(dev)

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
        logits = last @ self.lm_head.T
        if self.suppress is not None:
            logits[:, self.suppress] = float("-inf")
        return logits.argmax(-1)

    def generate(self, prompts, out_len):
        a = self.args
        batch, in_len = prompts.shape
        shape = (batch, self.nkv, self.max_len, self.hd)
        ks = [torch.empty(shape, device=self.dev, dtype=self.dt) for _ in range(self.nl)]
        vs = [torch.empty(shape, device=self.dev, dtype=self.dt) for _ in range(self.nl)]
        out = torch.empty(batch, out_len, dtype=torch.long, device=self.dev)
        for b0 in range(0, batch, a.prefill_batch):
            b1 = min(batch, b0 + a.prefill_batch)
            out[b0:b1, 0] = self.forward(prompts[b0:b1], 0, [k[b0:b1] for k in ks], [v[b0:b1] for v in vs])
        self.progress.step(exact=True)  # one sync a wave; the decode steps are timed as launched (asynchronous)
        for step in range(1, out_len):
            out[:, step] = self.forward(out[:, step - 1:step], in_len + step - 1, ks, vs)
            self.progress.step()
        return out

    def wave(self, batch, out_len, gen):
        prompts = torch.randint(0, self.vocab, (batch, self.args.input_len), device=self.dev, generator=gen)
        self.progress.start(batch)
        return self.generate(prompts, out_len).shape[1]


class Stop(Exception):
    pass


def on_signal(signum, _frame):
    raise Stop(signal.Signals(signum).name)


def check(args, shape):
    """Same weights in both implementations: the greedy tokens must agree."""
    t0 = time.perf_counter()
    hf = HF(args, shape)
    man = Manual(args, shape, hf_model=hf.model)
    eos = hf.model.generation_config.eos_token_id
    man.suppress = None if eos is None else torch.tensor(eos if isinstance(eos, list) else [eos], device=args.device)
    gen = torch.Generator(device=args.device).manual_seed(args.seed + 1)
    batch = min(args.concurrency, 8)
    prompts = torch.randint(0, shape[5], (batch, args.input_len), device=args.device, generator=gen)
    a = hf.generate(prompts, args.output_len)
    b = man.generate(prompts, args.output_len)
    same = (a == b).float().mean().item()
    first_diff = [int((a[i] != b[i]).nonzero()[0]) if (a[i] != b[i]).any() else None for i in range(batch)]
    res = {"check": "hf-vs-manual", "shape": args.shape, "device": str(args.device),
           "dtype": str(args.dtype).replace("torch.", ""), "batch": batch, "input_len": args.input_len,
           "output_len": args.output_len, "hf_tokens": list(a.shape), "token_match": round(same, 4),
           "first_mismatch_step": first_diff, "seconds": round(time.perf_counter() - t0, 2),
           "torch": torch.__version__, **hf.info}
    print(json.dumps(res), flush=True)
    # float32: every token must match; half precision: report only (rounding can flip a near-tie argmax).
    return 0 if same == 1.0 or args.dtype != torch.float32 else 1


def main():
    args = parse_args()
    shape = SHAPES[args.shape]
    dev = args.device
    torch.manual_seed(args.seed)
    if args.check:
        with torch.inference_mode():
            return check(args, shape)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    st = {"load_s": 0.0, "warm_s": 0.0, "done": 0, "produced": 0, "secs": 0.0, "phase": "load"}
    waves = []  # (batch, seconds, output tok/s, prefill s, decode ms/step)
    impl = None

    def summary(final, stopped=None):
        done, produced, secs = st["done"], st["produced"], st["secs"]
        r = {"impl": args.impl, "shape": args.shape, "requests": done, "requests_asked": args.num_requests,
             "input_len": args.input_len, "output_len": args.output_len, "concurrency": args.concurrency,
             "output_tokens": produced, "seconds": round(secs, 3),
             "output_tok_per_s": round(produced / secs, 1) if secs > 0 else 0.0,
             "total_tok_per_s": round((produced + done * args.input_len) / secs, 1) if secs > 0 else 0.0,
             "wave_tok_per_s": [w[2] for w in waves], "wave_seconds": [w[1] for w in waves],
             "wave_prefill_s": [w[3] for w in waves], "wave_decode_step_ms": [w[4] for w in waves],
             "load_seconds": round(st["load_s"], 1), "warmup_seconds": round(st["warm_s"], 1), "final": final}
        if stopped:
            r["stopped"] = stopped
            prog = getattr(impl, "progress", None)
            if st["phase"] == "wave" and prog is not None and prog.steps:
                # The wave that was cut: its prefill and decode-step times give the figure a whole wave would
                # have reached (static batching: prefill + (output_len - 1) decode steps).
                pre, step_ms = prog.stats()
                part = {"batch": prog.batch, "tokens_per_request": len(prog.steps),
                        "seconds": round(prog.steps[-1] - prog.t0, 2), "prefill_s": pre, "decode_step_ms": step_ms}
                if step_ms:
                    est = pre + (args.output_len - 1) * step_ms / 1e3
                    part["extrapolated_wave_tok_per_s"] = round(prog.batch * args.output_len / est, 1)
                r["partial_wave"] = part
        if dev.type == "cuda" and torch.cuda.is_initialized():
            r["peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 1)
            r["gpu"] = torch.cuda.get_device_name(dev)
        r.update({"torch": torch.__version__, "device": str(dev)})
        if args.impl == "hf" and impl is not None:
            r["compile_requests_refused"] = impl.compile_requests
            try:
                from torch._dynamo.utils import counters
                r["dynamo_graphs"] = int(counters["stats"]["unique_graphs"])
            except Exception:  # noqa: BLE001 - informational only
                pass
        r.update(getattr(impl, "info", {}))  # hf: the generate path, known after the first call
        print(json.dumps(r), flush=True)

    stopped = None
    try:
        with torch.inference_mode():
            t = time.perf_counter()
            impl = HF(args, shape) if args.impl == "hf" else Manual(args, shape)
            gen = torch.Generator(device=dev).manual_seed(args.seed)
            sync(dev)
            st["load_s"] = time.perf_counter() - t
            # Warm-up (kernel selection, allocator; with --compile the compilation: a full wave) not counted.
            st["phase"] = "warm-up"
            t = time.perf_counter()
            if args.impl == "hf" and args.compile:
                impl.wave(min(args.concurrency, args.num_requests), args.output_len, gen)
            else:
                impl.wave(min(2, args.concurrency), min(8, args.output_len), gen)
            sync(dev)
            st["warm_s"] = time.perf_counter() - t
            t0 = time.perf_counter()
            while st["done"] < args.num_requests:
                batch = min(args.concurrency, args.num_requests - st["done"])
                if args.time_budget > 0 and waves and \
                        (time.perf_counter() - t0) + waves[-1][1] * batch / waves[-1][0] > args.time_budget:
                    stopped = f"time budget {args.time_budget:g} s: next wave would not fit"
                    break
                st["phase"] = "wave"
                t = time.perf_counter()
                per_request = impl.wave(batch, args.output_len, gen)
                sync(dev)
                ws = time.perf_counter() - t
                st["phase"] = "between waves"
                st["produced"] += per_request * batch
                st["done"] += batch
                st["secs"] = time.perf_counter() - t0
                waves.append((batch, round(ws, 2), round(per_request * batch / ws, 1), *impl.progress.stats()))
                if st["done"] < args.num_requests:
                    summary(False)
    except Stop as e:
        stopped = f"{e} during the {st['phase']}" + (f" (wave {len(waves) + 1})" if st["phase"] == "wave" else "")
    summary(True, stopped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
