"""An independent fp64 implementation of the DeepSeek-V4 forward pass written from the SPEC
(model-v4.md §3, `exact` semantics: no FP8/FP4/BF16 simulation), full prefill, no cache.

Used to cross-check transformers: where both agree the fixture is right by two independent
readings; where they differ, docs/oracles.md says which one follows the spec.
Weights come by reference name (`layers.0.attn.wq_a.weight`, ...) as dequantised fp32 arrays.
"""
import math

import torch
import torch.nn.functional as F


def rope_freqs(c, compressed, dtype=torch.float64):
    """ω_i (i < Dr/2): θ^(-2i/Dr); compressed layers use θ=compress_rope_theta + YaRN (§3.5.3)."""
    dr = c["qk_rope_head_dim"]
    theta = c["compress_rope_theta"] if compressed else c["rope_theta"]
    i = torch.arange(dr // 2, dtype=torch.float64)
    w = theta ** (-2.0 * i / dr)
    if compressed:
        ys = c["rope_scaling"]
        orig, factor = ys["original_max_position_embeddings"], ys["factor"]

        def d(r):
            return dr * math.log(orig / (2 * math.pi * r)) / (2 * math.log(theta))

        lo, hi = max(0, math.floor(d(ys["beta_fast"]))), min(dr - 1, math.ceil(d(ys["beta_slow"])))
        if lo == hi:
            hi += 0.001
        gamma = ((i - lo) / (hi - lo)).clamp(0, 1)
        w = w * (1 - gamma) + (w / factor) * gamma
    return w.to(dtype)


def rope(x, pos, freqs, inverse=False):
    """Interleaved RoPE on the trailing 2·len(freqs) dims of x [T, dim] or [T, H, dim]."""
    dr = 2 * freqs.numel()
    ang = pos.to(freqs.dtype)[:, None] * freqs[None, :]          # [T, Dr/2]
    cos, sin = ang.cos(), ang.sin()
    if inverse:
        sin = -sin
    if x.dim() == 3:                                              # per-head x [T, H, dim]
        cos, sin = cos[:, None, :], sin[:, None, :]
    r = x[..., -dr:]
    a, b = r[..., 0::2], r[..., 1::2]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., :-dr], out), dim=-1)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def hc_pre(X, fn, base, scale, c):
    """X [T, n, D] -> u [T, D], post [T, n], comb [T, n, n] (§3.3)."""
    T, n, D = X.shape
    x = X.reshape(T, n * D)
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])
    mu = (x @ fn.T) * r
    eps = c["hc_eps"]
    pre = torch.sigmoid(mu[:, :n] * scale[0] + base[:n]) + eps
    post = 2 * torch.sigmoid(mu[:, n:2 * n] * scale[1] + base[n:2 * n])
    M = mu[:, 2 * n:].reshape(T, n, n) * scale[2] + base[2 * n:].reshape(n, n)
    P = torch.softmax(M, dim=-1) + eps
    P = P / (P.sum(-2, keepdim=True) + eps)
    for _ in range(c["hc_sinkhorn_iters"] - 1):
        P = P / (P.sum(-1, keepdim=True) + eps)
        P = P / (P.sum(-2, keepdim=True) + eps)
    u = (pre[:, :, None] * X).sum(1)
    return u, post, P


def hc_post(f, X, post, P):
    """X'_k = post_k f + Σ_j P_jk X_j."""
    return post[:, :, None] * f[:, None, :] + torch.einsum("tjk,tjd->tkd", P, X)


def compress(a, W, p, ratio, cdim, c, freqs):
    """Compressed entries [T//ratio, cdim] of a [T, D] (§3.5.5), RoPE at w·ratio."""
    T = a.shape[0]
    nw = T // ratio
    if nw == 0:
        return a.new_zeros((0, cdim))
    v = a @ W[p + "wkv.weight"].T
    z = a @ W[p + "wgate.weight"].T + W[p + "ape"][torch.arange(T, device=a.device) % ratio]
    v, z = v[:nw * ratio].reshape(nw, ratio, -1), z[:nw * ratio].reshape(nw, ratio, -1)
    if ratio == 4:
        V = torch.zeros(nw, 8, cdim, dtype=a.dtype, device=a.device)
        Z = torch.full((nw, 8, cdim), -math.inf, dtype=a.dtype, device=a.device)
        V[:, 4:], Z[:, 4:] = v[:, :, cdim:], z[:, :, cdim:]
        V[1:, :4], Z[1:, :4] = v[:-1, :, :cdim], z[:-1, :, :cdim]
    else:
        V, Z = v, z
    C = (torch.softmax(Z, dim=1) * V).sum(1)
    K = rmsnorm(C, W[p + "norm.weight"], c["rms_norm_eps"])
    return rope(K, torch.arange(nw, device=a.device) * ratio, freqs)


def attention(a, W, p, c, ratio, stats):
    T, dev = a.shape[0], a.device
    H, Dh, win = c["num_attention_heads"], c["head_dim"], c["sliding_window"]
    eps = c["rms_norm_eps"]
    freqs = rope_freqs(c, ratio > 0).to(dev)
    pos = torch.arange(T, device=dev)
    qlat = rmsnorm(a @ W[p + "wq_a.weight"].T, W[p + "q_norm.weight"], eps)
    q = (qlat @ W[p + "wq_b.weight"].T).reshape(T, H, Dh)
    q = rope(q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps), pos, freqs)
    kv = rope(rmsnorm(a @ W[p + "wkv.weight"].T, W[p + "kv_norm.weight"], eps), pos, freqs)
    t, s = pos[:, None], pos[None, :]
    mask = (s <= t) & (s > t - win)                                 # [T, T] raw window
    keys = kv
    if ratio:
        comp = compress(a, W, p + "compressor.", ratio, Dh, c, freqs)
        w_idx = torch.arange(comp.shape[0], device=dev)[None, :]
        visible = w_idx < (t + 1) // ratio                          # [T, N]
        if ratio == 4:
            visible = visible & indexer_select(a, qlat, W, p, c, freqs, visible, stats)
        mask = torch.cat((mask, visible), dim=1)
        keys = torch.cat((kv, comp), dim=0)
    logits = torch.einsum("thd,sd->ths", q, keys) * Dh ** -0.5
    logits = logits.masked_fill(~mask[:, None, :], -math.inf)
    sink = W[p + "attn_sink"][None, :, None].expand(T, H, 1)
    probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
    o = rope(torch.einsum("ths,sd->thd", probs, keys), pos, freqs, inverse=True)
    G, Ro = c["o_groups"], c["o_lora_rank"]
    og = o.reshape(T, G, H * Dh // G)
    z = torch.einsum("tgi,goi->tgo", og, W[p + "wo_a.weight"].reshape(G, Ro, -1)).reshape(T, G * Ro)
    return z @ W[p + "wo_b.weight"].T


def indexer_select(a, qlat, W, p, c, freqs, visible, stats):
    """Boolean [T, N]: the top min(k, visible) visible entries by the indexer score (§3.5.6)."""
    T = a.shape[0]
    nI, dI, k = c["index_n_heads"], c["index_head_dim"], c["index_topk"]
    KI = compress(a, W, p + "indexer.compressor.", 4, dI, c, freqs)                # [N, dI]
    qI = rope((qlat @ W[p + "indexer.wq_b.weight"].T).reshape(T, nI, dI),
              torch.arange(T, device=a.device), freqs)
    wts = (a @ W[p + "indexer.weights_proj.weight"].T) * dI ** -0.5 * nI ** -0.5     # [T, nI]
    score = (wts[:, :, None] * torch.relu(torch.einsum("thd,nd->thn", qI, KI))).sum(1)
    score = score.masked_fill(~visible, -math.inf)
    sel = torch.zeros_like(visible)
    nvis = visible.sum(1)
    for t in range(T):
        m = int(min(k, nvis[t]))
        if m == 0:
            continue
        srt = torch.sort(score[t], descending=True).values
        top = torch.topk(score[t], m).indices
        sel[t, top] = True
        if nvis[t] > k:  # margin between the last kept and the first dropped entry
            gap = float(srt[k - 1] - srt[k])
            stats["min_topk_margin"] = min(stats.get("min_topk_margin", math.inf), gap)
            stats["queries_dropping"] = stats.get("queries_dropping", 0) + 1
            stats["topk_ties_at_cut"] = stats.get("topk_ties_at_cut", 0) + int(gap == 0)
            stats["topk_margins_below_1e-5"] = stats.get("topk_margins_below_1e-5", 0) + int(gap < 1e-5)
    return sel


def moe(m, ids, W, p, c, hash_layer, stats):
    lim = c["swiglu_limit"]
    g = m @ W[p + "gate.weight"].T
    sig = torch.sqrt(F.softplus(g))
    k = c["num_experts_per_tok"]
    if hash_layer:
        sel = W[p + "gate.tid2eid"][ids].long()
    else:
        sel = torch.topk(sig + W[p + "gate.bias"], k, dim=-1).indices
    wsel = sig.gather(1, sel)
    wsel = wsel / wsel.sum(-1, keepdim=True) * c["routed_scaling_factor"]

    def ffn(x, q, scale=None):
        gate, up = x @ W[q + "w1.weight"].T, x @ W[q + "w3.weight"].T
        stats["clamped"] = stats.get("clamped", 0) + int((gate > lim).sum() + (up.abs() > lim).sum())
        h = F.silu(gate.clamp(max=lim)) * up.clamp(-lim, lim)
        if scale is not None:
            h = h * scale[:, None]
        return h @ W[q + "w2.weight"].T

    out = ffn(m, p + "shared_experts.")
    for e in range(c["n_routed_experts"]):
        hit = sel == e                                               # [T, k]
        rows = hit.any(1).nonzero().flatten()
        if rows.numel():
            out[rows] += ffn(m[rows], p + f"experts.{e}.", (wsel * hit).sum(1)[rows])
    return out


def forward(W, c, ids):
    """W: {ref name: tensor (fp64, on device)}; ids LongTensor [T] -> (logits [T, V], stats)."""
    stats = {}
    n, eps = c["hc_mult"], c["rms_norm_eps"]
    X = W["embed.weight"][ids][:, None, :].expand(-1, n, -1).clone()
    for L in range(c["num_hidden_layers"]):
        p = f"layers.{L}."
        u, post, P = hc_pre(X, W[p + "hc_attn_fn"], W[p + "hc_attn_base"], W[p + "hc_attn_scale"], c)
        f = attention(rmsnorm(u, W[p + "attn_norm.weight"], eps), W, p + "attn.", c,
                      c["compress_ratios"][L], stats)
        X = hc_post(f, X, post, P)
        u, post, P = hc_pre(X, W[p + "hc_ffn_fn"], W[p + "hc_ffn_base"], W[p + "hc_ffn_scale"], c)
        f = moe(rmsnorm(u, W[p + "ffn_norm.weight"], eps), ids, W, p + "ffn.", c,
                L < c["num_hash_layers"], stats)
        X = hc_post(f, X, post, P)
    T = X.shape[0]
    x = X.reshape(T, -1)
    mu = (x @ W["hc_head_fn"].T) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    pre = torch.sigmoid(mu * W["hc_head_scale"] + W["hc_head_base"]) + c["hc_eps"]
    y = rmsnorm((pre[:, :, None] * X).sum(1), W["norm.weight"], eps)
    return y @ W["head.weight"].T, stats
