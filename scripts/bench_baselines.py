#!/usr/bin/env python3
"""FP8 GEMM ceilings for the V4.1 prefill linears, measured with torch._scaled_mm on the GPU box.

Same shapes as CudaGemmFp8Bench.V41PrefillShapes (tests/ops_cuda/gemm_fp8_test.cpp): Y[m, n] =
X[m, k] · W[n, k]ᵀ, e4m3 operands, BF16 output. Variants, as far as this torch/cuBLAS supports them:

  tensor      one FP32 scale per operand (the perf-budget's "FP8 ceiling")
  rowwise     FP32 scale per row of X and per row of W
  block128    1x128 activation blocks x 128x128 weight blocks (cuBLAS blockwise, DeepSeek-V3 style)
  bf16        torch.matmul on BF16 operands, for reference

V4.1's 1x32 / 32x32 scale blocks have no cuBLAS kernel on Hopper, so these are ceilings, not
like-for-like baselines. Timing: CUDA events, 3 warm-ups, median of 10-30 runs, random inputs.

Usage: python3 scripts/bench_baselines.py [--out baselines.md]
"""
import argparse
import statistics
import sys

import torch

SHAPES = [
    ("wq_a+wkv [1792,5120]", 8192, 1792, 5120),
    ("wq_b [32768,1280]", 8192, 32768, 1280),
    ("wo_b [5120,8192]", 8192, 5120, 8192),
    ("shared gate+up [4608,5120]", 8192, 4608, 5120),
    ("shared down [5120,2304]", 8192, 5120, 2304),
    ("routed gate+up, 1 expert (m=128)", 128, 4608, 5120),
    ("routed down, 1 expert (m=128)", 128, 5120, 2304),
    ("routed gate+up, all pairs dense proxy", 49152, 4608, 5120),
    ("square 8192^3", 8192, 8192, 8192),
]


def time_us(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(times)


def variants(m, n, k):
    dev = "cuda"
    x = (torch.randn(m, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
    wt = w.t()  # [k, n] column-major, as _scaled_mm wants its second operand
    one = torch.ones((), device=dev, dtype=torch.float32)
    out = {}
    out["tensor"] = lambda: torch._scaled_mm(x, wt, one, one, out_dtype=torch.bfloat16)
    sa = torch.rand(m, 1, device=dev) + 0.5
    sb = torch.rand(1, n, device=dev) + 0.5
    out["rowwise"] = lambda: torch._scaled_mm(x, wt, sa, sb, out_dtype=torch.bfloat16)
    # Blockwise: activation scales [m, k/128] (m-major), weight scales [n/128, k/128] presented
    # transposed as [k/128, n/128]; layouts differ between torch versions, so several are tried.
    if n % 128 == 0 and k % 128 == 0:
        a_blk = (torch.rand(k // 128, m, device=dev) + 0.5).t()          # [m, k/128], stride(0)=1
        b_blk = (torch.rand(n // 128, k // 128, device=dev) + 0.5)
        cands = [
            ("b^T", lambda: torch._scaled_mm(x, wt, a_blk, b_blk.t(), out_dtype=torch.bfloat16)),
            ("b", lambda: torch._scaled_mm(x, wt, a_blk, b_blk, out_dtype=torch.bfloat16)),
            ("b^T contig", lambda: torch._scaled_mm(x, wt, a_blk, b_blk.t().contiguous(),
                                                    out_dtype=torch.bfloat16)),
        ]
        for tag, fn in cands:
            try:
                fn()
                torch.cuda.synchronize()
                out["block128"] = fn
                out["_block128_layout"] = tag
                break
            except Exception as e:  # noqa: BLE001 - report and move on
                out["_block128_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    out["bf16"] = lambda: torch.matmul(xb, wb.t())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return 1
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(0)
    print(f"device: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    cols = ["tensor", "rowwise", "block128", "bf16"]
    lines = ["| shape | m | n | k | " + " | ".join(f"{c} TFLOP/s" for c in cols) + " |",
             "|---|---|---|---|" + "---|" * len(cols)]
    notes = set()
    for label, m, n, k in SHAPES:
        flop = 2.0 * m * n * k
        reps = 10 if flop > 1e12 else 30
        vs = variants(m, n, k)
        cells = []
        for c in cols:
            if c not in vs:
                cells.append("n/a")
                continue
            try:
                us = time_us(vs[c], reps)
                cells.append(f"{flop / us * 1e-6:.0f}")
            except Exception as e:  # noqa: BLE001
                cells.append("err")
                notes.add(f"{c}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        if "_block128_layout" in vs:
            notes.add(f"block128 scale layout accepted: {vs['_block128_layout']}")
        if "_block128_error" in vs and "block128" not in vs:
            notes.add(f"block128 unsupported here: {vs['_block128_error']}")
        line = f"| {label} | {m} | {n} | {k} | " + " | ".join(cells) + " |"
        lines.append(line)
        print(line, flush=True)
        del vs
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n" + "".join(f"\n* {n}" for n in sorted(notes)) + "\n"
    print()
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"device: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}\n\n")
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
