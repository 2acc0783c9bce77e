#!/usr/bin/env python3
"""Same-machine A/B of flashseek builds (or options) on the real-width dummy model.

Runs `BIN bench --load-format dummy --config CFG --num-layers L --gpus G --reps R
--prompt-tokens P` for every variant and shape, in rounds: each round runs every variant once per
shape, one after another, so that a drifting machine (clocks, a neighbour) hits all variants
alike. Prints each run's median ms per step and, per shape, a table of the variants' medians of
those medians, their ratio to the first variant and the step's share of the HBM floor that the
bench prints. Machines of one kind differ by a few per cent, so only variants measured in one call
are compared (bench/RESULTS.md, sessions 24-25).

  scripts/gpu_ab.py [--rounds 3] [--layers 8] [--experts 16] [--shapes 1,v6,16,64]
                    [--prompt-tokens 1024] [--reps 10] [--gpus 0] [--timeout 120]
                    VARIANT [VARIANT ...]

VARIANT: a flashseek binary, optionally followed by '::' and bench arguments for that variant
alone (e.g. `build/bin/flashseek::--gemv-prequant-min-rows 1`). A shape is a batch size (1, 16,
64) or vN for one sequence's N-token verify block (`--batch 1 --step-tokens N`).
`--self-test` checks the parsing and the tables against a stand-in binary (no GPU needed).
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

MEDIAN = re.compile(r"median ([0-9.]+) ms/step")
FLOOR = re.compile(r"the step is ([0-9.]+) % of it")


def parse_variant(text):
    """'PATH' or 'PATH::ARGS' -> (label, path, [args])."""
    path, _, args = text.partition("::")
    if not path:
        raise ValueError(f"variant '{text}': no binary")
    extra = shlex.split(args)
    label = os.path.basename(path) + ("" if not extra else " " + " ".join(extra))
    return label, path, extra


def parse_shape(text):
    """'1' / '64' -> batch args; 'v6' -> one sequence's 6-token verify block."""
    if text.startswith("v") and text[1:].isdigit() and int(text[1:]) >= 1:
        return ["--batch", "1", "--step-tokens", text[1:]]
    if text.isdigit() and int(text) >= 1:
        return ["--batch", text]
    raise ValueError(f"shape '{text}': a batch size or vN")


def run_once(cmd, timeout):
    """(median ms/step, % of the HBM floor or None) printed by one bench run."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout} s: {shlex.join(cmd)}")
    except OSError as e:
        raise RuntimeError(f"cannot run {cmd[0]}: {e}")
    out = p.stdout + p.stderr
    m = MEDIAN.search(out)
    if p.returncode != 0 or not m:
        tail = "\n".join(out.strip().splitlines()[-8:])
        raise RuntimeError(f"exit {p.returncode}, no 'median ... ms/step' line: {shlex.join(cmd)}\n{tail}")
    f = FLOOR.search(out)
    return float(m.group(1)), (float(f.group(1)) if f else None)


def measure(variants, shapes, rounds, base_args, timeout, log=print):
    """{shape: {label: [(ms, floor %), ...]}} over `rounds` interleaved rounds."""
    res = {s: {v[0]: [] for v in variants} for s in shapes}
    for r in range(1, rounds + 1):
        for s in shapes:
            for label, path, extra in variants:
                ms, fl = run_once([path, "bench"] + base_args + parse_shape(s) + extra, timeout)
                res[s][label].append((ms, fl))
                log(f"round {r} shape {s:>4} {label}: {ms:.3f} ms/step" + ("" if fl is None else f" ({fl:.1f} % of the floor)"))
    return res


def tables(res):
    lines = []
    for s, by in res.items():
        lines.append(f"\nshape {s} (ms per step; median of the runs)")
        lines.append("| variant | runs | median | vs first | % of the HBM floor |")
        lines.append("|---|---|---|---|---|")
        first = None
        for label, runs in by.items():
            med = statistics.median(ms for ms, _ in runs)
            first = med if first is None else first
            fl = [f for _, f in runs if f is not None]
            fls = f"{statistics.median(fl):.1f}" if fl else "-"
            lines.append(f"| {label} | {' / '.join(f'{ms:.3f}' for ms, _ in runs)} | {med:.3f} | {med / first:.3f}x | {fls} |")
    return "\n".join(lines)


def self_test():
    """A stand-in `flashseek` that prints a median from its arguments: the tables must follow."""
    with tempfile.TemporaryDirectory() as d:
        fake = os.path.join(d, "fakebench")
        with open(fake, "w") as f:
            f.write("#!/usr/bin/env python3\n"
                    "import sys\n"
                    "a = sys.argv[1:]\n"
                    "assert a[0] == 'bench' and '--load-format' in a, a\n"
                    "b = int(a[a.index('--batch') + 1])\n"
                    "t = int(a[a.index('--step-tokens') + 1]) if '--step-tokens' in a else 1\n"
                    "ms = 3.0 + b * 0.2 + t * 0.5 - (0.5 if '--fast' in a else 0.0)\n"
                    "print(f'median {ms:.3f} ms/step over 10 steps')\n"
                    "print(f'HBM floor: 1.0 ms at the measured copy bandwidth 4200 GB/s; the step is {100.0 / ms:.1f} % of it')\n")
        os.chmod(fake, 0o755)
        broken = os.path.join(d, "broken")
        with open(broken, "w") as f:
            f.write("#!/bin/sh\necho 'no numbers here'\nexit 3\n")
        os.chmod(broken, 0o755)
        variants = [parse_variant(fake), parse_variant(fake + "::--fast")]
        res = measure(variants, ["1", "v6"], 2, ["--load-format", "dummy"], 30, log=lambda *_: None)
        assert [ms for ms, _ in res["1"]["fakebench"]] == [3.7, 3.7], res
        assert [ms for ms, _ in res["v6"]["fakebench --fast"]] == [5.7, 5.7], res
        assert abs(res["1"]["fakebench"][0][1] - 27.0) < 0.05, res
        t = tables(res)
        assert "| fakebench --fast | 3.200 / 3.200 | 3.200 | 0.865x |" in t, t
        try:
            measure([parse_variant(broken)], ["1"], 1, [], 30, log=lambda *_: None)
            raise AssertionError("a run without a median line must fail")
        except RuntimeError as e:
            assert "exit 3" in str(e) and "no numbers here" in str(e), e
        try:
            measure([parse_variant(os.path.join(d, "absent"))], ["1"], 1, [], 30, log=lambda *_: None)
            raise AssertionError("a missing binary must fail")
        except RuntimeError as e:
            assert "cannot run" in str(e), e
        for bad in ["0", "v", "v0", "x4", ""]:
            try:
                parse_shape(bad)
                raise AssertionError(f"shape '{bad}' must be refused")
            except ValueError:
                pass
    print("gpu_ab.py self-test: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="*", help="BIN or BIN::bench args")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--shapes", default="1,v6,16,64")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--gpus", default="0")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per bench run")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.variants:
        ap.error("name at least one variant (a flashseek binary)")
    if a.rounds < 1 or a.layers < 1 or a.experts < 1 or a.reps < 1 or a.prompt_tokens < 1:
        ap.error("--rounds, --layers, --experts, --reps and --prompt-tokens must be >= 1")
    try:
        variants = [parse_variant(v) for v in a.variants]
        shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
        for s in shapes:
            parse_shape(s)
    except ValueError as e:
        ap.error(str(e))
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "config.json")
        subprocess.run([sys.executable, os.path.join(here, "realwidth_config.py"), "--experts", str(a.experts), cfg],
                       check=True)
        base = ["--load-format", "dummy", "--config", cfg, "--num-layers", str(a.layers), "--gpus", a.gpus,
                "--reps", str(a.reps), "--prompt-tokens", str(a.prompt_tokens)]
        try:
            res = measure(variants, shapes, a.rounds, base, a.timeout)
        except RuntimeError as e:
            print(f"gpu_ab.py: {e}", file=sys.stderr)
            return 1
    print(tables(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
