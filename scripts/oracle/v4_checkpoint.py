"""Tiny DeepSeek-V4-Flash checkpoints in the release format (spec model-v4.md §2, §6), numpy only.

`build_tensors(cfg, seed)` returns every release tensor twice: as stored (dtype + storage array,
FP8/FP4 with E8M0 scales) and dequantised to fp32 (what an `exact` engine computes with).
`write_checkpoint(dir, cfg, stored)` writes the flat HF config.json, two shards and the index.
"""
import json
import os

import numpy as np

import v4_format as fmt

# Config A = spec §6 tiny config. Config B changes heads, head_dim, RoPE dims, window, top-k,
# hash layers, layer schedule, expert counts and eps, keeping the ratios 4 / 128.
# Deviation from §6: index_n_heads is 8 (not 4) in A. With 4 heads, 1/16 of the indexer scores are
# exactly 0 (every head's ReLU is 0) and 14 of 602 queries had exact ties at the top-k cut, which
# makes the selection implementation-defined (spec §3.5.6); with 8 heads there are none.
CONFIGS = {
    "a": dict(vocab_size=1024, hidden_size=256, num_hidden_layers=4, compress_ratios=[0, 4, 128, 4, 0],
              num_hash_layers=2, num_attention_heads=16, head_dim=128, qk_rope_head_dim=64,
              q_lora_rank=128, o_groups=4, o_lora_rank=64, sliding_window=8, index_n_heads=8,
              index_head_dim=128, index_topk=4, n_routed_experts=8, num_experts_per_tok=2,
              moe_intermediate_size=128, rms_norm_eps=1e-6),
    "b": dict(vocab_size=1024, hidden_size=256, num_hidden_layers=5, compress_ratios=[4, 0, 128, 4, 128, 0],
              num_hash_layers=3, num_attention_heads=8, head_dim=64, qk_rope_head_dim=32,
              q_lora_rank=256, o_groups=2, o_lora_rank=64, sliding_window=16, index_n_heads=16,
              index_head_dim=64, index_topk=8, n_routed_experts=16, num_experts_per_tok=3,
              moe_intermediate_size=128, rms_norm_eps=1e-20),
}


def hf_config(name):
    """Flat release-style config.json (spec §1.1 keys; every field explicit, §6)."""
    c = dict(CONFIGS[name])
    c.update({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "num_key_value_heads": 1, "n_shared_experts": 1, "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0, "hidden_act": "silu", "hc_mult": 4, "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1048576, "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
        "attention_bias": False, "torch_dtype": "bfloat16", "initializer_range": 0.02,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
        "expert_dtype": "fp4",
    })
    return c


class _Gen:
    """Collects tensors: `stored` = [(name, st_dtype, array)], `deq` = {name: fp32 array}."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.stored, self.deq = [], {}

    def normal(self, shape, std):
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def f32(self, name, arr):
        arr = np.asarray(arr, dtype=np.float32)
        self.stored.append((name, "F32", arr))
        self.deq[name] = arr

    def bf16(self, name, arr):
        bits = fmt.bf16_bits(arr)
        self.stored.append((name, "BF16", bits))
        self.deq[name] = fmt.bf16_to_f32(bits)

    def fp8(self, name, shape, std):
        """FP8 weight with per-block magnitudes 2^{-1,0,1} so that block scales differ."""
        w = self.normal(shape, std)
        gr, gc = -(-shape[0] // 128), -(-shape[1] // 128)
        mult = 2.0 ** self.rng.integers(-1, 2, size=(gr, gc))
        w = w * np.repeat(np.repeat(mult, 128, 0), 128, 1)[:shape[0], :shape[1]].astype(np.float32)
        jitter = (self.rng.random((gr, gc)) < 0.25).astype(np.int32)  # some blocks use a coarser scale
        codes, sc = fmt.quant_fp8_block(w, 128, jitter)
        self.stored += [(name, "F8_E4M3", codes), (name[:-len("weight")] + "scale", "F8_E8M0", sc)]
        self.deq[name] = fmt.dequant_fp8_block(codes, sc, 128)

    def fp4(self, name, shape, std):
        packed, sc = fmt.quant_fp4_group(self.normal(shape, std), 32)
        self.stored += [(name, "I8", packed), (name[:-len("weight")] + "scale", "F8_E8M0", sc)]
        self.deq[name] = fmt.dequant_fp4_group(packed, sc, 32)


def _norm_weight(g, name, n):
    g.bf16(name, 1.0 + g.normal((n,), 0.1))


def _hc(g, prefix, n_out, D, n):
    g.f32(prefix + "_fn", g.normal((n_out, n * D), 0.02))
    g.f32(prefix + "_base", g.normal((n_out,), 0.5))
    g.f32(prefix + "_scale", 0.5 + g.rng.random((3 if n_out > n else 1,)).astype(np.float32))


def _compressor(g, p, ratio, c, D):
    coff = 2 if ratio == 4 else 1
    g.bf16(p + "wkv.weight", g.normal((coff * c, D), D ** -0.5))
    g.bf16(p + "wgate.weight", g.normal((coff * c, D), 2.0 * D ** -0.5))
    g.f32(p + "ape", g.normal((ratio, coff * c), 0.5))
    _norm_weight(g, p + "norm.weight", c)


def _attention(g, p, c, ratio):
    D, H, Dh, R = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
    G, Ro = c["o_groups"], c["o_lora_rank"]
    g.fp8(p + "wq_a.weight", (R, D), D ** -0.5)
    _norm_weight(g, p + "q_norm.weight", R)
    g.fp8(p + "wq_b.weight", (H * Dh, R), R ** -0.5)
    g.fp8(p + "wkv.weight", (Dh, D), D ** -0.5)
    _norm_weight(g, p + "kv_norm.weight", Dh)
    g.fp8(p + "wo_a.weight", (G * Ro, H * Dh // G), (H * Dh // G) ** -0.5)
    g.fp8(p + "wo_b.weight", (D, G * Ro), (G * Ro) ** -0.5)
    g.f32(p + "attn_sink", g.normal((H,), 1.0))
    if ratio:
        _compressor(g, p + "compressor.", ratio, Dh, D)
    if ratio == 4:
        nI, dI = c["index_n_heads"], c["index_head_dim"]
        g.fp8(p + "indexer.wq_b.weight", (nI * dI, R), R ** -0.5)
        g.bf16(p + "indexer.weights_proj.weight", g.normal((nI, D), D ** -0.5))
        _compressor(g, p + "indexer.compressor.", 4, dI, D)


def _moe(g, p, c, hash_layer):
    D, E, k, I, V = (c["hidden_size"], c["n_routed_experts"], c["num_experts_per_tok"],
                     c["moe_intermediate_size"], c["vocab_size"])
    g.bf16(p + "gate.weight", g.normal((E, D), D ** -0.5))
    if hash_layer:
        # k distinct ids per token (spec §6: the reference keeps one copy of a repeated id).
        ids = np.argsort(g.rng.random((V, E)), axis=1)[:, :k].astype(np.int64)
        g.stored.append((p + "gate.tid2eid", "I64", ids))
        g.deq[p + "gate.tid2eid"] = ids
    else:
        g.f32(p + "gate.bias", g.normal((E,), 0.3))
    # Gate/up std 0.3 (pre-activations ~ N(0, 4.8^2) on unit-RMS inputs): some exceed the
    # SwiGLU limit 10, so the clamp is exercised; down-proj scaled down to compensate.
    for name, fn in (("shared_experts.", g.fp8), *((f"experts.{e}.", g.fp4) for e in range(E))):
        fn(p + name + "w1.weight", (I, D), 0.3)
        fn(p + name + "w3.weight", (I, D), 0.3)
        fn(p + name + "w2.weight", (D, I), 0.1 * I ** -0.5)


def _block(g, p, c, ratio, hash_layer):
    D, n = c["hidden_size"], 4
    _hc(g, p + "hc_attn", (2 + n) * n, D, n)
    _hc(g, p + "hc_ffn", (2 + n) * n, D, n)
    _norm_weight(g, p + "attn_norm.weight", D)
    _norm_weight(g, p + "ffn_norm.weight", D)
    _attention(g, p + "attn.", c, ratio)
    _moe(g, p + "ffn.", c, hash_layer)


def build_tensors(name, seed):
    c = hf_config(name)
    g = _Gen(seed)
    D, V, n = c["hidden_size"], c["vocab_size"], 4
    g.bf16("embed.weight", g.normal((V, D), 1.0))
    for L in range(c["num_hidden_layers"]):
        _block(g, f"layers.{L}.", c, c["compress_ratios"][L], L < c["num_hash_layers"])
    _hc(g, "hc_head", n, D, n)
    _norm_weight(g, "norm.weight", D)
    g.bf16("head.weight", g.normal((V, D), 2.0 * D ** -0.5))
    # MTP block (transformers ignores it; kept so the loader sees the full release layout).
    p = "mtp.0."
    _block(g, p, c, c["compress_ratios"][c["num_hidden_layers"]], False)
    for nm in ("enorm", "hnorm", "norm"):
        _norm_weight(g, p + nm + ".weight", D)
    g.fp8(p + "e_proj.weight", (D, D), D ** -0.5)
    g.fp8(p + "h_proj.weight", (D, D), D ** -0.5)
    _hc(g, p + "hc_head", n, D, n)
    return c, g.stored, g.deq


def write_checkpoint(out_dir, cfg, stored):
    """Two shards: globals + first half of the layers, then the rest + MTP; plus the index."""
    os.makedirs(out_dir, exist_ok=True)
    half = cfg["num_hidden_layers"] // 2
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]

    def shard_of(name):
        if name.startswith("mtp."):
            return 1
        if name.startswith("layers."):
            return 0 if int(name.split(".")[1]) < half else 1
        return 0

    weight_map, total = {}, 0
    for s, fname in enumerate(files):
        part = [t for t in stored if shard_of(t[0]) == s]
        total += fmt.write_safetensors(os.path.join(out_dir, fname), part)
        weight_map.update({t[0]: fname for t in part})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                  f, indent=2)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def checkpoint_selfcheck(tmp):
    """Writes config A, reads it back, and checks dtypes/shapes against spec §2.2 rules."""
    cfg, stored, deq = build_tensors("a", 1)
    write_checkpoint(tmp, cfg, stored)
    idx = json.load(open(os.path.join(tmp, "model.safetensors.index.json")))
    back = {}
    for fname in sorted(set(idx["weight_map"].values())):
        back.update(fmt.read_safetensors(os.path.join(tmp, fname)))
    assert set(back) == set(idx["weight_map"]) == {t[0] for t in stored}
    for name, (dt, arr) in back.items():
        if dt == "F8_E4M3":
            sdt, sc = back[name[:-len("weight")] + "scale"]
            assert sdt == "F8_E8M0" and sc.shape == tuple(-(-x // 128) for x in arr.shape), name
            assert (fmt.dequant_fp8_block(arr, sc) == deq[name]).all(), name
        if dt == "I8":
            sdt, sc = back[name[:-len("weight")] + "scale"]
            assert sc.shape == (arr.shape[0], arr.shape[1] * 2 // 32), name
            assert (fmt.dequant_fp4_group(arr, sc) == deq[name]).all(), name
    assert back["layers.1.attn.compressor.ape"][1].shape == (4, 256)
    assert back["layers.2.attn.compressor.ape"][1].shape == (128, 128)
    assert back["layers.0.ffn.gate.tid2eid"][0] == "I64" and "layers.2.ffn.gate.tid2eid" not in back
    assert "layers.0.ffn.gate.bias" not in back and back["layers.2.ffn.gate.bias"][0] == "F32"
    t = back["layers.0.ffn.gate.tid2eid"][1]
    assert all(len(set(r)) == len(r) for r in t.tolist()) and t.min() >= 0 and t.max() < 8
    assert back["layers.1.ffn.experts.7.w2.weight"][1].shape == (256, 64)
    print("v4_checkpoint selfcheck: ok,", len(back), "tensors")
