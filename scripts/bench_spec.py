#!/usr/bin/env python3
"""Tokens/s of `flashseek run` with `--speculative auto` against `off` (and optionally `on`), or at
scripted acceptances against `off`.

Runs the same greedy request (fixed prompt ids, --ignore-eos) `--reps` times per mode, the modes
interleaved in a rotating order so that drift in the machine's load hits every mode alike, and
prints a Markdown table: median wall time, median decode tok/s (from run's stderr line), median
CPU seconds (user + sys of the child; the steadier figure on a shared machine), the verify steps
and probes the policy made, and whether every run printed the same output (greedy output must
not depend on the mode; a difference makes the script exit 1).

By default it writes the `demo` checkpoint (tiny-v41 layers, the full vocabulary, a random DSpark
draft that the target never accepts: the worst case for speculation) with make-tiny first.

CPU (this repository's build):
    python3 scripts/bench_spec.py --reps 5 --max-tokens 300
GPU box (packed binaries, one GPU):
    python3 scripts/bench_spec.py --bin $P/bin/flashseek --ckpt /tmp/spec_demo \
        --reps 5 --max-tokens 1000 --extra '--gpus 0'

Scripted acceptance (issue 18: tokens/s at 2, 3.5 and 5.6 tokens per verification step vs `off`):
`--script-accept 2,3.5,5.6` adds a mode `on@MEAN` per value that runs `--speculative on
--spec-script-accept MEAN --allow-scripted-output`: the real draft and the real verify block run,
but each verification accepts a scripted number of drafts (mean tokens per step = MEAN), so the
cost is the product's while the output is not the model's (its outputs are only compared between
its own runs). `--script-mode auto` lets the policy decide instead of `on`. On the real-width dummy
model (no checkpoint: `--ckpt ''` and the source in --extra, as scripts/gpu-realwidth.sh builds it):
    python3 scripts/bench_spec.py --bin $P/bin/flashseek --ckpt '' --modes off \
        --script-accept 2,3.5,5.6 --reps 3 --max-tokens 256 \
        --extra "--load-format dummy --config $CFG --num-layers 8 --gpus 0 --max-context 4096"
"""
import argparse
import hashlib
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time


def child_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def mode_flags(mode):
    """`run` flags of a mode: off / auto / on, or on@MEAN / auto@MEAN (scripted acceptance)."""
    if "@" in mode:
        spec, mean = mode.split("@", 1)
        return ["--speculative", spec, "--spec-script-accept", mean, "--allow-scripted-output"]
    return ["--speculative", mode]


def base_cmd(args):
    src = ["--ckpt", args.ckpt] if args.ckpt else []
    return [args.bin, "run"] + src + ["--prompt-ids", args.prompt_ids, "--max-tokens",
                                      str(args.max_tokens), "--ignore-eos", "--temperature", "0",
                                      "--json"] + shlex.split(args.extra)


def run_once(args, mode):
    cmd = base_cmd(args) + mode_flags(mode)
    cpu0, t0 = child_cpu_seconds(), time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"bench_spec: {mode}: no result within {args.timeout} s: {shlex.join(cmd)}")
    wall, cpu = time.monotonic() - t0, child_cpu_seconds() - cpu0
    if p.returncode != 0:
        sys.exit(f"bench_spec: {mode}: exit {p.returncode}: {shlex.join(cmd)}\n{p.stderr[-2000:]}")
    m = re.search(r"decode ([0-9.]+) tok/s", p.stderr)
    if not m:
        sys.exit(f"bench_spec: {mode}: no 'decode ... tok/s' in run's stderr:\n{p.stderr[-2000:]}")
    spec = re.search(r"speculative: \w+, (\d+) verify steps \((\d+) probes\), ([0-9.]+) tokens/step",
                     p.stderr)
    return {
        "wall": wall,
        "cpu": cpu,
        "decode_tps": float(m.group(1)),
        "verify": int(spec.group(1)) if spec else 0,
        "probes": int(spec.group(2)) if spec else 0,
        "tokens_per_step": float(spec.group(3)) if spec else 1.0,
        "md5": hashlib.md5(p.stdout.encode()).hexdigest(),
        "spec_line": next((l for l in p.stderr.splitlines() if l.startswith("speculative: ")), ""),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin/flashseek", help="the flashseek binary")
    ap.add_argument("--ckpt", default="/tmp/spec_demo",
                    help="checkpoint directory; written with make-tiny --config demo --seed 1 when absent; "
                         "'' for none (give the model source in --extra, e.g. --load-format dummy)")
    ap.add_argument("--modes", default="off,auto", help="comma-separated: off, auto, on")
    ap.add_argument("--script-accept", default="",
                    help="comma-separated mean tokens per verification step, e.g. 2,3.5,5.6: adds a "
                         "scripted-acceptance mode per value (benchmark only: changes the output)")
    ap.add_argument("--script-mode", default="on", choices=("on", "auto"),
                    help="--speculative of the scripted modes")
    ap.add_argument("--reps", type=int, default=3, help="runs per mode")
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--prompt-ids", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--extra", default="", help="more `run` flags, e.g. '--gpus 0' or '--threads 2'")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in ("off", "auto", "on") for m in modes):
        sys.exit(f"bench_spec: --modes must list off / auto / on, got {args.modes!r}")
    for mean in (x for x in args.script_accept.split(",") if x):
        try:
            if not float(mean) >= 1:
                raise ValueError
        except ValueError:
            sys.exit(f"bench_spec: --script-accept takes numbers >= 1, got {mean!r}")
        modes.append(f"{args.script_mode}@{mean}")
    if not modes:
        sys.exit("bench_spec: no mode to run (--modes / --script-accept)")
    if args.reps < 1 or args.max_tokens < 2:
        sys.exit("bench_spec: --reps >= 1 and --max-tokens >= 2 required")
    if args.ckpt and not os.path.exists(os.path.join(args.ckpt, "config.json")):
        print(f"writing the demo checkpoint to {args.ckpt}", file=sys.stderr)
        subprocess.run([args.bin, "make-tiny", "--config", "demo", "--seed", "1", "--out", args.ckpt],
                       check=True)

    runs = {m: [] for m in modes}
    for rep in range(args.reps):
        order = modes[rep % len(modes):] + modes[:rep % len(modes)]
        for mode in order:
            r = run_once(args, mode)
            runs[mode].append(r)
            print(f"rep {rep + 1} {mode}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU, "
                  f"decode {r['decode_tps']:.1f} tok/s, {r['verify']} verify steps "
                  f"({r['probes']} probes), {r['tokens_per_step']:.3f} tokens/step", file=sys.stderr)

    # Greedy output must not depend on the mode; a scripted mode's output is not the model's, so
    # it is only compared between its own runs (deterministic: the same every time).
    model_modes = [m for m in modes if "@" not in m]
    digests = {r["md5"] for m in model_modes for r in runs[m]}
    # A scripted acceptance is keyed by the verification's number; under `auto` which steps verify
    # depends on the measured costs, so only the `on@` modes must repeat their output exactly.
    scripted_diff = [m for m in modes if m.startswith("on@") and len({r["md5"] for r in runs[m]}) != 1]
    med = lambda m, k: statistics.median(r[k] for r in runs[m])
    print(f"`{shlex.join(base_cmd(args))} --speculative MODE` (MODE@MEAN: `--speculative MODE "
          f"--spec-script-accept MEAN --allow-scripted-output`), "
          f"{args.reps} runs per mode, interleaved; load average at the end: "
          f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print("| mode | median wall (s) | median decode tok/s | median CPU (s) | tokens per CPU-second | "
          "verify steps (probes) per run | tokens per verify step | vs off (decode tok/s) |")
    print("|---|---|---|---|---|---|---|---|")
    for m in modes:
        vs = (f"{med(m, 'decode_tps') / med('off', 'decode_tps'):.2f}x"
              if "off" in runs and m != "off" else "")
        tps = f"{med(m, 'tokens_per_step'):.3f}" if any(r["verify"] for r in runs[m]) else ""
        print(f"| {m} | {med(m, 'wall'):.2f} | {med(m, 'decode_tps'):.1f} | {med(m, 'cpu'):.2f} | "
              f"{args.max_tokens / med(m, 'cpu'):.1f} | "
              f"{'/'.join(str(r['verify']) for r in runs[m])} "
              f"({'/'.join(str(r['probes']) for r in runs[m])}) | {tps} | {vs} |")
    if model_modes:
        print(f"\nOutputs of {', '.join(model_modes)}: "
              f"{'identical in all runs' if len(digests) == 1 else 'DIFFERENT'} "
              f"(md5 of the JSON: {', '.join(sorted(digests))})")
    if any("@" in m for m in modes):
        print("Scripted modes (output not the model's): "
              + ("each `on@` mode identical across its runs" if not scripted_diff
                 else f"DIFFERENT across runs: {', '.join(scripted_diff)}")
              + ("; `auto@` modes verify where the policy decides, so their outputs may differ"
                 if any(m.startswith("auto@") for m in modes) else ""))
    for m in modes:
        if runs[m][-1]["spec_line"]:
            print(f"\n{m}, last run: `{runs[m][-1]['spec_line']}`")
    if len(digests) > 1:
        sys.exit("bench_spec: greedy outputs differ between runs")
    if scripted_diff:
        sys.exit("bench_spec: a scripted mode gave different outputs in its runs")


if __name__ == "__main__":
    main()
