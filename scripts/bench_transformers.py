#!/usr/bin/env python3
"""Baseline for `flashseek bench`: decode-step time per layer of DeepSeek-V4 in PyTorch (bf16).

Two measurements, both on one GPU with random weights, at the V4-Flash dimensions
(hidden 4096, 64 heads x 512, q_lora 1024, o_groups 8 x 1024, 256 experts x 2048, top-6,
mHC x4, window 128, indexer 64 x 128 top-512, compress ratios 4 / 128):

1. transformers' DeepseekV4ForCausalLM (if this transformers has it): a few layers, prefill of
   `--context` tokens, then single-token decode steps with the model's own cache. Reported:
   step time / layers (embedding and a small LM head included, so slightly pessimistic for it).
2. A plain torch bf16 re-implementation of one layer's decode step (the same matmuls, gathers
   and mHC/sinkhorn/router/expert loop a straightforward eager implementation runs), used
   when (1) is unavailable and printed either way as a second reference. It is NOT
   transformers' code; the output says which one each number is.

Timing: CUDA events around each step, 3 warm-ups, median of --reps. Writes Markdown and JSON
to --out (default: $OUT or .).

  python3 scripts/bench_transformers.py --layers 2 --context 4096 --reps 20
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

V4 = dict(hidden=4096, heads=64, head_dim=512, rope_dim=64, q_lora=1024, o_groups=8, o_rank=1024,
          experts=256, inter=2048, topk=6, hc=4, window=128, idx_heads=64, idx_dim=128,
          idx_topk=512, sinkhorn=20)


def cuda_time(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)  # us
    return statistics.median(times), min(times)


# ---------------------------------------------------------------------------------------------
# 1. transformers
# ---------------------------------------------------------------------------------------------
def bench_transformers(args, log):
    import transformers

    log(f"transformers {transformers.__version__}")
    if not hasattr(transformers, "DeepseekV4ForCausalLM"):
        raise RuntimeError(f"transformers {transformers.__version__} has no DeepseekV4ForCausalLM")
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    d = V4
    n = args.layers
    # Alternate the two compressed attention types (V4-Flash: [4, 128] x 20), routed MoE only.
    types = ["compressed_sparse_attention" if i % 2 == 0 else "heavily_compressed_attention" for i in range(n)]
    cfg = DeepseekV4Config(
        vocab_size=args.vocab, hidden_size=d["hidden"], moe_intermediate_size=d["inter"],
        num_hidden_layers=n, num_attention_heads=d["heads"], num_key_value_heads=1,
        head_dim=d["head_dim"], q_lora_rank=d["q_lora"], num_experts_per_tok=d["topk"],
        n_routed_experts=d["experts"], n_shared_experts=1, o_groups=d["o_groups"],
        o_lora_rank=d["o_rank"], index_n_heads=d["idx_heads"], index_head_dim=d["idx_dim"],
        index_topk=d["idx_topk"], sliding_window=d["window"], hc_mult=d["hc"],
        hc_sinkhorn_iters=d["sinkhorn"], layer_types=types, mlp_layer_types=["moe"] * n,
        max_position_embeddings=max(65536, 2 * args.context), use_cache=True)
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device("cuda"):
        model = DeepseekV4ForCausalLM(cfg).to(torch.bfloat16)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {n} layers, {params / 1e9:.2f} B params bf16, built in {time.time() - t0:.1f} s")
    ids = torch.randint(3, args.vocab, (1, args.context), device="cuda")
    with torch.no_grad():
        t0 = time.time()
        out = model(input_ids=ids, use_cache=True)
        torch.cuda.synchronize()
        log(f"prefill {args.context} tokens: {time.time() - t0:.2f} s")
        cache = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        pos = [args.context]

        # Each timed step appends one token to the same cache (positions advance, as in decoding).
        def step():
            r = model(input_ids=nxt, past_key_values=cache, use_cache=True,
                      position_ids=torch.tensor([[pos[0]]], device="cuda"))
            pos[0] += 1
            return r

        med, mn = cuda_time(step, args.reps)
    del model
    torch.cuda.empty_cache()
    return dict(kind="transformers DeepseekV4ForCausalLM", version=transformers.__version__, layers=n,
                step_us=med, step_min_us=mn, per_layer_us=med / n, params=params)


# ---------------------------------------------------------------------------------------------
# 2. torch bf16 re-implementation of one V4 decode layer (eager, batch 1, one token)
# ---------------------------------------------------------------------------------------------
class TorchV4Layer:
    def __init__(self, ctx, ratio, dev="cuda", dt=torch.bfloat16):
        d = V4
        H, D, hc = d["hidden"], d["head_dim"], d["hc"]
        r = lambda *s: (torch.randn(*s, device=dev, dtype=dt) * 0.02)
        self.ratio = ratio
        self.hc_fn = [r((2 + hc) * hc, hc * H).float() for _ in range(2)]  # F32 in the checkpoint
        self.hc_base = [torch.zeros((2 + hc) * hc, device=dev) for _ in range(2)]
        self.attn_norm = torch.ones(H, device=dev, dtype=dt)
        self.ffn_norm = torch.ones(H, device=dev, dtype=dt)
        self.wq_a = r(d["q_lora"], H)
        self.q_norm = torch.ones(d["q_lora"], device=dev, dtype=dt)
        self.wq_b = r(d["heads"] * D, d["q_lora"])
        self.wkv = r(D, H)
        self.kv_norm = torch.ones(D, device=dev, dtype=dt)
        self.wo_a = r(d["o_groups"], d["o_rank"], d["heads"] * D // d["o_groups"])
        self.wo_b = r(H, d["o_groups"] * d["o_rank"])
        self.sink = torch.zeros(d["heads"], device=dev)
        # compressor (kv + gate) and indexer
        self.c_wkv = r(2 * D, H)
        self.c_wgate = r(2 * D, H)
        self.i_wq_b = r(d["idx_heads"] * d["idx_dim"], d["q_lora"])
        self.i_wproj = r(d["idx_heads"], H)
        # router + experts
        self.gate = r(d["experts"], H)
        self.bias = torch.zeros(d["experts"], device=dev)
        self.sh = [r(d["inter"], H), r(d["inter"], H), r(H, d["inter"])]
        self.w1 = r(d["experts"], d["inter"], H)
        self.w3 = r(d["experts"], d["inter"], H)
        self.w2 = r(d["experts"], H, d["inter"])
        # caches: window ring, compressed KV (ctx / ratio rows), index keys
        n_comp = ctx // ratio
        self.window = r(d["window"], D)
        self.ckv = r(n_comp, D)
        self.ikeys = r(n_comp, d["idx_dim"]) if ratio == 4 else None
        cos = torch.randn(d["rope_dim"] // 2, device=dev)
        self.cos, self.sin = cos.cos().to(dt), cos.sin().to(dt)

    @staticmethod
    def rms(x, w, eps=1e-6):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(w.dtype) * w

    def rope(self, x):
        rd = V4["rope_dim"]
        a, b = x[..., -rd:].float().unflatten(-1, (-1, 2)).unbind(-1)
        c, s = self.cos.float(), self.sin.float()
        rot = torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)
        return torch.cat((x[..., :-rd], rot.to(x.dtype)), -1)

    def hc_pre(self, X, i):
        hc = V4["hc"]
        flat = X.flatten(-2).float()
        mix = F.linear(flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6), self.hc_fn[i]) + self.hc_base[i]
        pre = torch.sigmoid(mix[..., :hc]) + 1e-6
        post = 2 * torch.sigmoid(mix[..., hc:2 * hc])
        comb = mix[..., 2 * hc:].unflatten(-1, (hc, hc)).softmax(-1) + 1e-6
        for _ in range(V4["sinkhorn"]):
            comb = comb / (comb.sum(-1, keepdim=True) + 1e-6)
            comb = comb / (comb.sum(-2, keepdim=True) + 1e-6)
        x = (pre.unsqueeze(-1) * X.float()).sum(-2).to(X.dtype)
        return x, post, comb

    @staticmethod
    def hc_post(X, f, post, comb):
        return (post.unsqueeze(-1) * f.float().unsqueeze(-2) + torch.einsum("...ij,...jd->...id", comb, X.float())).to(X.dtype)

    def step(self, X):
        d = V4
        # ---- attention ----
        x, post, comb = self.hc_pre(X, 0)
        x = self.rms(x, self.attn_norm)
        qa = self.rms(F.linear(x, self.wq_a), self.q_norm)
        q = F.linear(qa, self.wq_b).view(-1, d["heads"], d["head_dim"])
        q = q * torch.rsqrt(q.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(q.dtype)
        q = self.rope(q)
        kv = self.rope(self.rms(F.linear(x, self.wkv), self.kv_norm))
        _ = torch.sigmoid(F.linear(x, self.c_wgate)) * F.linear(x, self.c_wkv)  # compressor projections
        if self.ikeys is not None:  # CSA: indexer picks top-512 compressed rows
            iq = F.linear(qa, self.i_wq_b).view(-1, d["idx_heads"], d["idx_dim"])
            w = F.linear(x, self.i_wproj)
            sc = (torch.relu(torch.einsum("thd,nd->thn", iq, self.ikeys)) * w.unsqueeze(-1)).sum(1)
            idx = sc.topk(min(d["idx_topk"], sc.shape[-1]), -1).indices[0]
            comp = self.ckv.index_select(0, idx)
        else:  # HCA: every compressed row
            comp = self.ckv
        keys = torch.cat((self.window, comp, kv), 0)
        s = torch.einsum("thd,nd->thn", q, keys).float() / math.sqrt(d["head_dim"])
        s = torch.cat((s, self.sink.view(1, -1, 1).expand(s.shape[0], -1, 1)), -1)
        p = s.softmax(-1)[..., :-1].to(keys.dtype)
        o = torch.einsum("thn,nd->thd", p, keys)
        o = self.rope(o)  # inverse rope on the output (same cost)
        og = o.view(-1, d["o_groups"], d["heads"] * d["head_dim"] // d["o_groups"])
        oa = torch.einsum("tgi,goi->tgo", og, self.wo_a).flatten(1)
        f = F.linear(oa, self.wo_b)
        X = self.hc_post(X, f, post, comb)
        # ---- MoE ----
        x, post, comb = self.hc_pre(X, 1)
        x = self.rms(x, self.ffn_norm)
        logits = F.linear(x.float(), self.gate.float())
        sc = torch.sqrt(F.softplus(logits))
        top = (sc + self.bias).topk(d["topk"], -1).indices
        wts = sc.gather(-1, top)
        wts = wts / wts.sum(-1, keepdim=True) * 1.5
        y = F.linear(F.silu(F.linear(x, self.sh[0])) * F.linear(x, self.sh[1]), self.sh[2]).float()
        for j, e in enumerate(top[0].tolist()):  # eager expert loop (host sync, as HF-style MoE does)
            g = F.linear(x, self.w1[e]).clamp(max=10.0)
            u = F.linear(x, self.w3[e]).clamp(-10.0, 10.0)
            y = y + F.linear(F.silu(g) * u, self.w2[e]).float() * wts[0, j]
        return self.hc_post(X, y.to(X.dtype), post, comb)

    def weight_bytes(self):
        d = V4
        t = [self.wq_a, self.wq_b, self.wkv, self.wo_a, self.wo_b, self.c_wkv, self.c_wgate, self.gate] + self.sh
        b = sum(x.numel() * x.element_size() for x in t) + sum(x.numel() * 4 for x in self.hc_fn)
        if self.ikeys is not None:
            b += self.i_wq_b.numel() * 2 + self.i_wproj.numel() * 2
        b += 3 * d["topk"] * d["inter"] * d["hidden"] * 2  # 6 experts x 3 matrices read per token
        return b


def bench_torch_layer(args, log):
    res = []
    for ratio in (4, 128):
        torch.manual_seed(ratio)
        layer = TorchV4Layer(args.context, ratio)
        X = torch.randn(1, V4["hc"], V4["hidden"], device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            med, mn = cuda_time(lambda: layer.step(X), args.reps)
        wb = layer.weight_bytes()
        log(f"torch bf16 layer (ratio {ratio}): {med:.1f} us (min {mn:.1f}), {wb / 1e6:.1f} MB weights")
        res.append(dict(kind=f"torch bf16 re-implementation, ratio {ratio}", ratio=ratio, per_layer_us=med,
                        min_us=mn, weight_mb=wb / 1e6))
        del layer
        torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=1024, help="small vocabulary: the baseline times layers")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()
    if args.layers <= 0 or args.context <= 0 or args.reps <= 0:
        sys.exit("bench_transformers: --layers, --context and --reps must be positive")
    if not torch.cuda.is_available():
        sys.exit("bench_transformers: no CUDA device")
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    log(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0)}, context {args.context}")
    results = {"context": args.context, "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if not args.skip_transformers:
        try:
            results["transformers"] = bench_transformers(args, log)
            log(f"transformers decode step: {results['transformers']['per_layer_us']:.1f} us per layer")
        except Exception as e:  # report and fall back, never hide
            log(f"transformers baseline unavailable: {type(e).__name__}: {e}")
            log(traceback.format_exc(limit=3))
            results["transformers_error"] = f"{type(e).__name__}: {e}"
            torch.cuda.empty_cache()
    results["torch_layer"] = bench_torch_layer(args, log)
    md = ["| baseline | per-layer decode us (batch 1, 1 token) |", "|---|---|"]
    if "transformers" in results:
        t = results["transformers"]
        md.append(f"| {t['kind']} {t['version']} ({t['layers']} layers, ctx {args.context}) | {t['per_layer_us']:.1f} |")
    else:
        md.append(f"| transformers DeepseekV4ForCausalLM | unavailable: {results.get('transformers_error', 'skipped')} |")
    for r in results["torch_layer"]:
        md.append(f"| {r['kind']} (ctx {args.context}) | {r['per_layer_us']:.1f} |")
    text = "\n".join(md)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "baseline.md"), "w") as f:
        f.write("\n".join(lines) + "\n\n" + text + "\n")
    with open(os.path.join(args.out, "baseline.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
