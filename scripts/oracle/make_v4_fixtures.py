#!/usr/bin/env python3
"""Makes the DeepSeek-V4 oracle fixtures tests/golden/v4-tiny-{a,b}.tgz (docs/oracles.md).

For each tiny config: writes a release-format checkpoint with random weights (v4_checkpoint),
dequantises it itself, loads it into transformers' DeepseekV4ForCausalLM (fp32, eager, strict),
and records full-prefill logits without cache plus a 40-token greedy continuation where every
step is a full no-cache forward. An independent fp64 implementation of the spec (v4_spec_ref)
runs on the same weights; both results and their differences go into the fixture.

Run on a CUDA machine with torch + transformers (>= 5.17, which ships DeepseekV4):
    python3 scripts/oracle/make_v4_fixtures.py --out OUTDIR [--configs a,b]
Numpy-only self-check of the formats / checkpoint writer:  --selfcheck
"""
import argparse
import json
import os
import sys
import tarfile
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v4_checkpoint as ckpt  # noqa: E402
import v4_format as fmt  # noqa: E402

T_PREFILL = 320        # > 256: two HCA entries; CSA top-k drops entries from t = 4*topk+3 on
GREEDY_PROMPT = 250    # the greedy continuation crosses the HCA boundary at 256
GREEDY_STEPS = 40
SEEDS = {"a": 1234, "b": 5678}
DRY_RUN = False
REFERENCE_TENSORS = [  # saved dequantised so the C++ loader's dequant can be compared
    "norm.weight", "layers.0.attn.wkv.weight", "layers.0.attn.wo_b.weight",
    "layers.2.attn.compressor.ape", "layers.3.attn.indexer.weights_proj.weight",
    "layers.3.ffn.shared_experts.w1.weight", "layers.3.ffn.experts.1.w2.weight",
    "layers.0.ffn.gate.tid2eid",
]  # BF16, FP8 (B: a partial 64-row block), FP8 2x2 blocks, F32, BF16, FP8, FP4, I64


def pos_stats(a, b):
    """Per-position max |a-b| -> median / p99 / max."""
    d = np.abs(a.astype(np.float64) - b.astype(np.float64)).max(axis=1)
    return {"median": float(np.median(d)), "p99": float(np.percentile(d, 99)), "max": float(d.max()),
            "argmax_agree": int((a.argmax(1) == b.argmax(1)).sum()), "positions": int(a.shape[0])}


def greedy(step_fn, prompt):
    """40 tokens, each from a full no-cache forward over everything so far."""
    seq, margins, rows = list(prompt), [], []
    for _ in range(GREEDY_STEPS):
        row = step_fn(seq)
        top2 = np.sort(row)[-2:]
        margins.append(float(top2[1] - top2[0]))
        rows.append(row)
        seq.append(int(row.argmax()))
    return seq[len(prompt):], margins, np.stack(rows)


def hf_incremental(model, torch, device, prompt, outputs, nocache_rows):
    """transformers' own cache path (prefill prompt, then one token at a time), compared with the
    no-cache rows; documentation only (docs/oracles.md), never used for the fixture."""
    ids = torch.tensor([prompt], device=device)
    out = model(input_ids=ids, use_cache=True)
    rows = [out.logits[0, -1].double().cpu().numpy()]
    pkv = out.past_key_values
    for tok in outputs[:-1]:
        out = model(input_ids=torch.tensor([[tok]], device=device), past_key_values=pkv, use_cache=True)
        pkv = out.past_key_values
        rows.append(out.logits[0, -1].double().cpu().numpy())
    d = np.abs(np.stack(rows) - nocache_rows).max(axis=1)
    return {"max_abs_diff_per_step_max": float(d.max()), "first_step_over_1e-3":
            int(np.argmax(d > 1e-3)) if (d > 1e-3).any() else None, "median": float(np.median(d))}


def safetensors_library_check(fdir):
    """Our writer is independent; check that the safetensors library reads every tensor back
    bit-exactly (F8_E8M0 included)."""
    try:
        import safetensors
        import torch
        from safetensors import safe_open
        n = 0
        for fname in sorted(f for f in os.listdir(fdir) if f.endswith(".safetensors")):
            ours = fmt.read_safetensors(os.path.join(fdir, fname))
            with safe_open(os.path.join(fdir, fname), framework="pt") as f:
                for k in f.keys():
                    t = f.get_tensor(k)
                    raw = t.view(torch.int16 if t.element_size() == 2 else torch.uint8) \
                        if t.element_size() <= 2 else t
                    assert (raw.numpy().view(ours[k][1].dtype).reshape(ours[k][1].shape) == ours[k][1]).all(), k
                    n += 1
        return f"ok: safetensors {safetensors.__version__} read {n} tensors bit-exactly"
    except Exception as e:
        return f"failed: {e!r}"


def make_runners(cfg, deq, device, notes):
    """-> (hf_logits, spec_logits, model, spec_stats): logits [T, V] (fp64 numpy) of a token list
    from transformers and from the fp64 spec implementation; spec_stats accumulates the spec's
    top-k / clamp statistics over every call (worst margin, summed counts)."""
    import torch
    import v4_hf
    import v4_spec_ref as spec
    W = {k: torch.from_numpy(v).to(device, torch.int64 if v.dtype == np.int64 else torch.float64)
         for k, v in deq.items()}
    spec_stats = {}

    def spec_logits(seq):
        with torch.no_grad():
            lg, st = spec.forward(W, cfg, torch.tensor(seq, device=device))
        for k, v in st.items():
            spec_stats[k] = min(spec_stats.get(k, v), v) if "margin" in k else spec_stats.get(k, 0) + v
        return lg.cpu().numpy(), st

    if DRY_RUN:  # local plumbing test without transformers: the "HF" logits are the spec's
        return (lambda seq: spec_logits(seq)[0].astype(np.float32).astype(np.float64),
                spec_logits, None, spec_stats)
    model = v4_hf.build_model(cfg, deq, device, notes)
    notes["hf_rope_tables_vs_spec"] = v4_hf.rope_table_check(model, cfg, spec.rope_freqs)

    def hf_logits(seq):
        with torch.no_grad():
            ids = torch.tensor([seq], device=device)
            return model(input_ids=ids, use_cache=False).logits[0].double().cpu().numpy()
    return hf_logits, spec_logits, model, spec_stats


def base_notes(name, device, fdir):
    import torch
    version = "dry-run"
    if not DRY_RUN:
        import transformers
        version = transformers.__version__
    return {"config": name, "torch": torch.__version__, "transformers": version,
            "numpy": np.__version__, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "seed": SEEDS[name], "tf32": False, "float32_matmul_precision": "highest",
            "safetensors_library_reads_checkpoint": safetensors_library_check(fdir)}


def write_fixture(fdir, out_root, name, expected, logits, deq, notes):
    """logits: {file name: [T, V] array}; saves everything and packs v4-tiny-<name>.tgz."""
    for fname, arr in logits.items():
        np.save(os.path.join(fdir, fname), arr.astype(np.float32))
    os.makedirs(os.path.join(fdir, "reference_tensors"), exist_ok=True)
    expected["reference_tensors"] = {}
    for t in REFERENCE_TENSORS:
        fname = f"reference_tensors/{t}.npy"
        np.save(os.path.join(fdir, fname), deq[t])
        expected["reference_tensors"][t] = fname
    with open(os.path.join(fdir, "expected.json"), "w") as f:
        json.dump(expected, f)
    with open(os.path.join(fdir, "notes.json"), "w") as f:
        json.dump(notes, f, indent=2, default=str)
    with tarfile.open(os.path.join(out_root, f"v4-tiny-{name}.tgz"), "w:gz") as tf:
        tf.add(fdir, arcname=f"v4-tiny-{name}")


def run_config(name, out_root, device, checks):
    import torch
    t0 = time.time()
    cfg, stored, deq = ckpt.build_tensors(name, SEEDS[name])
    fdir = os.path.join(out_root, f"v4-tiny-{name}")
    ckpt.write_checkpoint(fdir, cfg, stored)
    tokens = np.random.default_rng(SEEDS[name] + 1).integers(3, cfg["vocab_size"], size=T_PREFILL).tolist()
    notes = base_notes(name, device, fdir)
    hf_logits, spec_logits, model, spec_stats = make_runners(cfg, deq, device, notes)

    lp_hf = hf_logits(tokens)
    lp_spec, stats = spec_logits(tokens)
    notes.update(spec_ref_stats=stats, hf_vs_spec_prefill=pos_stats(lp_hf, lp_spec),
                 logits_std=float(lp_hf.std()))
    prompt = tokens[:GREEDY_PROMPT]
    g_hf, m_hf, rows_hf = greedy(lambda s: hf_logits(s)[-1], prompt)
    g_spec, _, rows_spec = greedy(lambda s: spec_logits(s)[0][-1], prompt)
    notes.update(greedy_min_top2_margin=min(m_hf), greedy_distinct_tokens=len(set(g_hf)),
                 greedy_hf_equals_spec=g_hf == g_spec,
                 hf_vs_spec_greedy_rows=pos_stats(rows_hf, rows_spec) if g_hf == g_spec else None,
                 spec_ref_stats_all_calls=spec_stats)
    try:
        with torch.no_grad():
            notes["hf_incremental_vs_nocache"] = hf_incremental(model, torch, device, prompt, g_hf, rows_hf)
    except Exception as e:  # transformers' cache path is not part of the fixture
        notes["hf_incremental_vs_nocache"] = f"failed: {e!r}"

    checks[name] = notes["checks"] = {
        "logits_std_in_0.5_5": 0.5 < notes["logits_std"] < 5.0,
        "greedy_not_looping": notes["greedy_distinct_tokens"] >= 5,
        "hf_matches_spec_p99_below_1e-3": notes["hf_vs_spec_prefill"]["p99"] < 1e-3,
        "greedy_hf_equals_spec": notes["greedy_hf_equals_spec"],
        "topk_dropped_entries": stats.get("queries_dropping", 0) > 0,
        "no_topk_ties_at_cut": spec_stats.get("topk_ties_at_cut", 0) == 0,
        "swiglu_clamp_active": stats.get("clamped", 0) > 0,
    }
    notes["seconds"] = round(time.time() - t0, 1)
    expected = {"tokens": tokens, "greedy_prompt": prompt, "greedy_output": g_hf,
                "greedy_output_spec_ref": g_spec,
                "thresholds": {"median_max_abs": 1e-3, "p99_max_abs": 5e-2, "greedy_match": GREEDY_STEPS}}
    write_fixture(fdir, out_root, name, expected,
                  {"logits_prefill.npy": lp_hf, "logits_prefill_spec_ref.npy": lp_spec}, deq, notes)
    print(json.dumps(notes, indent=1, default=str), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/v4-oracle")
    ap.add_argument("--configs", default="a,b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--selfcheck", action="store_true")
    ap.add_argument("--dry-run-without-transformers", action="store_true",
                    help="plumbing test only: spec logits stand in for transformers' (no valid fixture)")
    args = ap.parse_args()
    global DRY_RUN
    DRY_RUN = args.dry_run_without_transformers
    if args.selfcheck:
        fmt.selfcheck()
        ckpt.checkpoint_selfcheck(tempfile.mkdtemp())
        return 0
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    os.makedirs(args.out, exist_ok=True)
    checks, rc = {}, 0
    for name in args.configs.split(","):
        try:
            run_config(name, args.out, args.device, checks)
        except Exception:
            traceback.print_exc()
            rc = 1
    print("CHECKS", json.dumps(checks, indent=1))
    if any(not v for c in checks.values() for v in c.values()):
        rc = rc or 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
