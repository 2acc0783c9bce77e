"""transformers side of the V4 oracle: reference names -> DeepseekV4ForCausalLM parameters
(spec model-v4.md §2.4), model construction in fp32 eager, strict loading, and checks of what
transformers derived from our release-style config.json.
"""
import math

import numpy as np
import torch

_ATTN = {
    "wq_a.weight": "q_a_proj.weight", "q_norm.weight": "q_a_norm.weight",
    "wq_b.weight": "q_b_proj.weight", "wkv.weight": "kv_proj.weight",
    "kv_norm.weight": "kv_norm.weight", "wo_a.weight": "o_a_proj.weight",
    "wo_b.weight": "o_b_proj.weight", "attn_sink": "sinks",
    "compressor.wkv.weight": "compressor.kv_proj.weight",
    "compressor.wgate.weight": "compressor.gate_proj.weight",
    "compressor.ape": "compressor.position_bias",
    "compressor.norm.weight": "compressor.kv_norm.weight",
    "indexer.wq_b.weight": "compressor.indexer.q_b_proj.weight",
    "indexer.weights_proj.weight": "compressor.indexer.scorer.weights_proj.weight",
    "indexer.compressor.wkv.weight": "compressor.indexer.kv_proj.weight",
    "indexer.compressor.wgate.weight": "compressor.indexer.gate_proj.weight",
    "indexer.compressor.ape": "compressor.indexer.position_bias",
    "indexer.compressor.norm.weight": "compressor.indexer.kv_norm.weight",
}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn": "attn_hc.fn", "hc_attn_base": "attn_hc.base", "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn", "hc_ffn_base": "ffn_hc.base", "hc_ffn_scale": "ffn_hc.scale",
    "ffn.gate.weight": "mlp.gate.weight", "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}
_GLOBAL = {
    "embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale",
}


def hf_state_dict(deq, cfg):
    """{reference name: fp32/int64 array} -> {transformers name: tensor}; MTP is skipped
    (transformers has no MTP module). Routed experts: gate_up_proj[e] = cat(w1, w3) rows,
    down_proj[e] = w2 (transformers' `_apply_gate` chunks gate first, then up)."""
    sd, experts = {}, {}
    for name, arr in deq.items():
        if name.startswith("mtp."):
            continue
        t = torch.from_numpy(np.ascontiguousarray(arr))
        if name in _GLOBAL:
            sd[_GLOBAL[name]] = t
            continue
        _, L, rest = name.split(".", 2)
        pre = f"model.layers.{L}."
        if rest.startswith("attn."):
            sd[pre + "self_attn." + _ATTN[rest[len("attn."):]]] = t
        elif rest.startswith("ffn.experts."):
            _, _, e, w, _ = rest.split(".")
            experts.setdefault(int(L), {})[(int(e), w)] = t
        else:
            sd[pre + _LAYER[rest]] = t
    for L, ws in experts.items():
        E = cfg["n_routed_experts"]
        sd[f"model.layers.{L}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat((ws[(e, "w1")], ws[(e, "w3")]), 0) for e in range(E)])
        sd[f"model.layers.{L}.mlp.experts.down_proj"] = torch.stack([ws[(e, "w2")] for e in range(E)])
    return sd


def _expected_rope(cfg):
    ys = cfg["rope_scaling"]
    return {
        "main": {"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        "compress": {"rope_type": "yarn", "rope_theta": cfg["compress_rope_theta"],
                     "factor": float(ys["factor"]), "attention_factor": 1.0,
                     "original_max_position_embeddings": ys["original_max_position_embeddings"],
                     "beta_fast": float(ys["beta_fast"]), "beta_slow": float(ys["beta_slow"])},
    }


def _rope_mismatches(hcfg, cfg):
    bad = []
    for kind, want in _expected_rope(cfg).items():
        got = (hcfg.rope_parameters or {}).get(kind, {})
        for k, v in want.items():
            if got.get(k) != v and not (isinstance(v, float) and isinstance(got.get(k), (int, float))
                                        and math.isclose(got.get(k), v)):
                bad.append(f"{kind}.{k}: got {got.get(k)!r}, want {v!r}")
    return bad


def build_config(cfg, notes):
    """DeepseekV4Config from the release-style dict, exactly as a user loading config.json would
    get it; checks the derived layer types / hash layers / RoPE and records what it found."""
    from transformers import DeepseekV4Config
    d = {k: v for k, v in cfg.items() if k not in ("quantization_config", "expert_dtype")}
    try:
        hcfg = DeepseekV4Config(**d)
    except TypeError as e:  # a strict config class may refuse keys it does not know
        notes["hf_config_refused"] = repr(e)
        for k in ("topk_method", "torch_dtype", "architectures"):
            d.pop(k, None)
        hcfg = DeepseekV4Config(**d)
    n = cfg["num_hidden_layers"]
    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    want_layers = [kinds[r] for r in cfg["compress_ratios"][:n]]
    want_mlp = ["hash_moe" if i < cfg["num_hash_layers"] else "moe" for i in range(n)]
    assert list(hcfg.layer_types) == want_layers, (hcfg.layer_types, want_layers)
    assert list(hcfg.mlp_layer_types) == want_mlp, (hcfg.mlp_layer_types, want_mlp)
    assert hcfg.qk_rope_head_dim == cfg["qk_rope_head_dim"]
    bad = _rope_mismatches(hcfg, cfg)
    notes["hf_rope_parameters_from_config_json"] = repr(hcfg.rope_parameters)
    if bad:
        # Fall back to the explicit nested form; the fixture then documents the parse problem.
        notes["hf_rope_parse_mismatch"] = bad
        exp = _expected_rope(cfg)
        for v in exp.values():
            v["partial_rotary_factor"] = cfg["qk_rope_head_dim"] / cfg["head_dim"]
        d["rope_parameters"] = exp
        d.pop("rope_scaling")
        hcfg = DeepseekV4Config(**d)
        assert not _rope_mismatches(hcfg, cfg), _rope_mismatches(hcfg, cfg)
    return hcfg


def build_model(cfg, deq, device, notes):
    from transformers import DeepseekV4ForCausalLM
    hcfg = build_config(cfg, notes)
    hcfg._attn_implementation = "eager"
    try:
        hcfg._experts_implementation = "eager"
    except Exception as e:  # older API: the attribute may not exist
        notes["experts_implementation_set_error"] = repr(e)
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(hcfg).to(torch.float32)
    model.config._attn_implementation = "eager"
    if getattr(model.config, "_experts_implementation", "eager") != "eager":
        model.config._experts_implementation = "eager"
    notes["attn_implementation"] = model.config._attn_implementation
    notes["experts_implementation"] = str(getattr(model.config, "_experts_implementation", None))
    sd = hf_state_dict(deq, cfg)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    notes["load_missing"], notes["load_unexpected"] = list(missing), list(unexpected)
    assert not missing and not unexpected, (missing, unexpected)
    # Every parameter/buffer must hold exactly what we assigned (catches tied or re-inited weights).
    live = model.state_dict()
    worst = max(float((live[k].float() - v.float()).abs().max()) for k, v in sd.items())
    assert worst == 0.0, f"parameters differ from the assigned weights by {worst}"
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    notes["hf_parameters_assigned"] = len(sd)
    return model.to(device).eval()


def rope_table_check(model, cfg, spec_freqs):
    """Max relative difference of transformers' inv_freq tables from the spec formula (fp64)."""
    rot = model.model.rotary_emb
    out = {}
    for kind, compressed in (("main", False), ("compress", True)):
        got = getattr(rot, f"{kind}_inv_freq").double().cpu()
        want = spec_freqs(cfg, compressed)
        out[kind] = {"max_rel_diff": float(((got - want) / want).abs().max()),
                     "attention_scaling": float(getattr(rot, f"{kind}_attention_scaling"))}
    return out
