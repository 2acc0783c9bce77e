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
                    [--slice BIN[::ARGS]] VARIANT [VARIANT ...]

Every other round runs the layer counts and the variants in reverse order (drift within a round
then favours none).

VARIANT: a flashseek binary, optionally followed by '::' and bench arguments for that variant
alone (e.g. `build/bin/flashseek::--gemv-prequant-min-rows 1`). A shape is a batch size (1, 16,
64) or vN for one sequence's N-token verify block (`--batch 1 --step-tokens N`).

The engine's cost of one layer (issue 13): `--layers 8,12` runs every shape at both layer counts
and prints (step(12) - step(8)) / 4 per variant, the marginal time of a layer with the LM head,
sampling, embedding and the DSpark rings cancelled out: of the two medians, and per round (each
round's 12-layer run minus its 8-layer run; a machine's runs differ by a few per cent, which the
difference amplifies, and the per-round median with its range shows how much). With the release config, the 8-layer
model keeps one layer of every role (0,1,2,3,20,21,24,25) and the 12-layer one adds layers 4-7,
ratio-2 layers that read layer 2's compressed KV and top-k (no compressor, no indexer, no
Engram): the layer that the layer slice (`flashseek bench --tokens 1,6`, "graph replay
us/layer") measures. `--slice BIN` runs that slice once per round (`--contexts` = the prompt
length) and sets the engine's marginal layer against it at the shapes it measures (1 and vN).
The marginal table also differences the host time of the bench's patched steps (its graph line's
"patched steps: tape ... ms, ... node updates + launch ... ms": the flow, the backend and the
launch tape, then the node updates, before the step's graph runs while the GPU waits), so the
host's share of a layer shows beside the whole. The line's all-steps "host ... ms" is not used
where that split is printed: it averages in the steps recorded rather than patched (a capture and
an instantiation of the whole step), which vary from run to run.

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
# The bench's graph line: host time per step until its final sync (flow, backend, tape, patches),
# over all timed steps; and of the patched steps alone, the tape and the node updates + launch.
HOST = re.compile(r"; host ([0-9.]+) ms, sync wait")
PATCHED = re.compile(r"\(([0-9]+) patched,.*patched steps: tape ([0-9.]+) ms, [0-9.]+ node updates \+ launch ([0-9.]+) ms")
# The layer slice's summary table: "| M | kernel sum us | graph replay us/layer | ..." rows.
SLICE_HEAD = "| M | kernel sum us | graph replay us/layer |"


def parse_variant(text):
    """'PATH' or 'PATH::ARGS' -> (label, path, [args])."""
    path, _, args = text.partition("::")
    if not path:
        raise ValueError(f"variant '{text}': no binary")
    extra = shlex.split(args)
    label = os.path.basename(path) + ("" if not extra else " " + " ".join(extra))
    return label, path, extra


def unique_labels(variants):
    """Labels that collide (two binaries of one name, e.g. an A/B of two builds) take the path as
    given, then a position suffix, so no two variants share a table row."""
    def relabel(vs, make):
        counts = {}
        for label, _, _ in vs:
            counts[label] = counts.get(label, 0) + 1
        return [(make(i, v) if counts[v[0]] > 1 else v[0], v[1], v[2]) for i, v in enumerate(vs)]
    vs = relabel(variants, lambda i, v: v[1] + ("" if not v[2] else " " + " ".join(v[2])))
    return relabel(vs, lambda i, v: f"{v[0]} #{i + 1}")


def parse_shape(text):
    """'1' / '64' -> batch args; 'v6' -> one sequence's 6-token verify block."""
    if text.startswith("v") and text[1:].isdigit() and int(text[1:]) >= 1:
        return ["--batch", "1", "--step-tokens", text[1:]]
    if text.isdigit() and int(text) >= 1:
        return ["--batch", text]
    raise ValueError(f"shape '{text}': a batch size or vN")


def parse_layers(text):
    """'8' or '8,12' -> [8] / [8, 12]: one layer count, or two increasing ones (the marginal layer)."""
    try:
        ls = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--layers '{text}': one or two comma-separated layer counts")
    if not 1 <= len(ls) <= 2 or ls[0] < 1 or (len(ls) == 2 and ls[1] <= ls[0]):
        raise ValueError(f"--layers '{text}': one count >= 1, or two increasing ones")
    return ls


def shape_tokens(shape):
    """Tokens per sequence of a shape when it is one sequence (1 or vN), else None."""
    a = parse_shape(shape)
    if a[1] != "1":
        return None
    return int(a[a.index("--step-tokens") + 1]) if "--step-tokens" in a else 1


def run_cmd(cmd, timeout):
    """(exit status, stdout + stderr) of cmd; RuntimeError when it cannot run or times out."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout} s: {shlex.join(cmd)}")
    except OSError as e:
        raise RuntimeError(f"cannot run {cmd[0]}: {e}")
    return p.returncode, p.stdout + p.stderr


def run_slice(path, extra, contexts, tokens, timeout):
    """{M: graph replay us per layer} printed by one layer-slice run."""
    cmd = [path, "bench", "--tokens", ",".join(str(t) for t in tokens), "--contexts", str(contexts)] + extra
    rc, out = run_cmd(cmd, timeout)
    res, inside = {}, False
    for line in out.splitlines():
        if line.startswith(SLICE_HEAD):
            inside = True
            continue
        if inside:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 3 or cells[0].startswith("---"):
                if res:
                    break
                continue
            try:
                res[int(cells[0])] = float(cells[2])
            except ValueError:
                break
    if rc != 0 or any(t not in res for t in tokens):
        tail = "\n".join(out.strip().splitlines()[-8:])
        raise RuntimeError(f"exit {rc}, no graph replay row for M = {tokens}: {shlex.join(cmd)}\n{tail}")
    return res


def run_once(cmd, timeout):
    """(median ms/step, % of the HBM floor or None, host ms per step or None) printed by one bench run."""
    rc, out = run_cmd(cmd, timeout)
    m = MEDIAN.search(out)
    if rc != 0 or not m:
        tail = "\n".join(out.strip().splitlines()[-8:])
        raise RuntimeError(f"exit {rc}, no 'median ... ms/step' line: {shlex.join(cmd)}\n{tail}")
    f = FLOOR.search(out)
    return float(m.group(1)), (float(f.group(1)) if f else None), host_ms(out)


def host_ms(out):
    """Host ms per step of a bench run: its patched steps' tape + node updates + launch where any
    step was patched, else the all-steps average; None without a graph line."""
    p = PATCHED.search(out)
    if p and int(p.group(1)) > 0:
        return float(p.group(2)) + float(p.group(3))
    h = HOST.search(out)
    return float(h.group(1)) if h else None


def measure(variants, shapes, rounds, base_args, timeout, log=print, layers=None, slice_=None):
    """({(shape, layers): {label: [(ms, floor %, host ms), ...]}}, {M: [slice us, ...]}) over `rounds`
    interleaved rounds. base_args carry no --num-layers: each of `layers` is added per run.
    slice_ = (path, extra args, contexts, [M, ...]) or None."""
    layers = layers or [8]
    res = {(s, n): {v[0]: [] for v in variants} for s in shapes for n in layers}
    sl = {}
    for r in range(1, rounds + 1):
        # Every other round runs the layer counts and the variants in reverse order, so that a
        # drift within a round (clocks, heat) favours no variant and biases no marginal layer.
        flip = r % 2 == 0
        for s in shapes:
            for n in (layers[::-1] if flip else layers):
                for label, path, extra in (variants[::-1] if flip else variants):
                    ms, fl, host = run_once([path, "bench"] + base_args + ["--num-layers", str(n)] + parse_shape(s) +
                                            extra, timeout)
                    res[(s, n)][label].append((ms, fl, host))
                    log(f"round {r} shape {s:>4} layers {n} {label}: {ms:.3f} ms/step" +
                        ("" if fl is None else f" ({fl:.1f} % of the floor)"))
        if slice_:
            path, extra, contexts, tokens = slice_
            for m, us in run_slice(path, extra, contexts, tokens, timeout).items():
                sl.setdefault(m, []).append(us)
                log(f"round {r} layer slice M = {m}: {us:.1f} us per layer")
    return res, sl


def tables(res, sl=None):
    lines = []
    for (s, n), by in res.items():
        lines.append(f"\nshape {s}, {n} layers (ms per step; median of the runs)")
        lines.append("| variant | runs | median | vs first | % of the HBM floor |")
        lines.append("|---|---|---|---|---|")
        first = None
        for label, runs in by.items():
            med = statistics.median(r[0] for r in runs)
            first = med if first is None else first
            fl = [r[1] for r in runs if r[1] is not None]
            fls = f"{statistics.median(fl):.1f}" if fl else "-"
            lines.append(f"| {label} | {' / '.join(f'{r[0]:.3f}' for r in runs)} | {med:.3f} | {med / first:.3f}x | {fls} |")
    layers = sorted({n for _, n in res})
    shapes = list(dict.fromkeys(s for s, _ in res))
    if len(layers) > 1:
        lo, hi = layers[0], layers[-1]
        lines.append(f"\nthe engine's marginal layer: (step at {hi} layers - step at {lo}) / {hi - lo}, us per layer: "
                     "of the two medians, and per round (each round's two runs of the variant, minutes apart "
                     "at most, so that drift between rounds cancels): their median and range; of that, the "
                     "host's time per patched step (the bench's 'tape' + 'node updates + launch': flow, backend, "
                     "launch tape and node updates before the graph runs) per round" +
                     ("; the layer slice's graph replay per layer in the same rounds" if sl else ""))
        lines.append("| shape | variant | of the medians | per round: median (range) | host, per round |" +
                     (" slice us per layer | engine / slice (medians) | engine / slice (per round) |" if sl else ""))
        lines.append("|---|---|---|---|---|" + ("---|---|---|" if sl else ""))
        for s in shapes:
            for label in res[(s, lo)]:
                a = statistics.median(r[0] for r in res[(s, lo)][label])
                b = statistics.median(r[0] for r in res[(s, hi)][label])
                us = (b - a) * 1000.0 / (hi - lo)
                pairs = list(zip(res[(s, lo)][label], res[(s, hi)][label]))
                per = [(rb[0] - ra[0]) * 1000.0 / (hi - lo) for ra, rb in pairs]
                pm = statistics.median(per)
                # Host ms per step: the third field, where the bench printed it (graphs on).
                hosts = [(rb[2] - ra[2]) * 1000.0 / (hi - lo) for ra, rb in pairs
                         if len(ra) > 2 and len(rb) > 2 and ra[2] is not None and rb[2] is not None]
                hs = f"{statistics.median(hosts):.1f}" if hosts and len(hosts) == len(pairs) else "-"
                row = f"| {s} | {label} | {us:.1f} | {pm:.1f} ({min(per):.1f} - {max(per):.1f}) | {hs} |"
                m = shape_tokens(s)
                if sl:
                    if m in sl:
                        ref = statistics.median(sl[m])
                        row += (f" {ref:.1f} ({' / '.join(f'{x:.1f}' for x in sl[m])}) | {us / ref:.3f}x |"
                                f" {pm / ref:.3f}x |")
                    else:
                        row += " - | - | - |"
                lines.append(row)
    return "\n".join(lines)


def stand_in(d, name, text):
    """An executable script `name` in folder d with `text`; its path."""
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def refused(parse, values):
    """Every value must make `parse` raise ValueError."""
    for bad in values:
        try:
            parse(bad)
        except ValueError:
            continue
        raise AssertionError(f"{parse.__name__}('{bad}') must be refused")


def self_test():
    """A stand-in `flashseek` that prints a median from its arguments: the tables must follow."""
    with tempfile.TemporaryDirectory() as d:
        fake = stand_in(d, "fakebench", "#!/usr/bin/env python3\n"
                                        "import sys\n"
                                        "a = sys.argv[1:]\n"
                                        "assert a[0] == 'bench' and '--load-format' in a, a\n"
                                        "b = int(a[a.index('--batch') + 1])\n"
                                        "t = int(a[a.index('--step-tokens') + 1]) if '--step-tokens' in a else 1\n"
                                        "n = int(a[a.index('--num-layers') + 1])\n"
                                        "ms = 3.0 + b * 0.2 + t * 0.5 - (0.5 if '--fast' in a else 0.0) + (n - 8) * 0.25\n"
                                        "print(f'median {ms:.3f} ms/step over 10 steps')\n"
                                        "print(f'decode steps: 10 graph launches (9 patched, 1 new executables), 0 eager; '\n"
                                        "      f'host {0.1 + n * 0.02:.3f} ms, sync wait 3.000 ms per step; patched steps: '\n"
                                        "      f'tape {0.08 + n * 0.01:.3f} ms, 17 node updates + launch 0.050 ms per step')\n"
                                        "print(f'HBM floor: 1.0 ms at the measured copy bandwidth 4200 GB/s; '\n"
                                        "      f'the step is {100.0 / ms:.1f} % of it')\n")
        broken = stand_in(d, "broken", "#!/bin/sh\necho 'no numbers here'\nexit 3\n")
        # A stand-in layer slice: the summary table's rows for the --tokens it is given; a
        # second table with other numbers follows (it must not be read).
        fslice = stand_in(d, "fakeslice", "#!/usr/bin/env python3\n"
                                          "import sys\n"
                                          "a = sys.argv[1:]\n"
                                          "assert a[0] == 'bench' and a[a.index('--contexts') + 1] == '4096', a\n"
                                          "ms = [int(x) for x in a[a.index('--tokens') + 1].split(',')]\n"
                                          "print('| M | kernel | role (layers/step) | median us |')\n"
                                          "print('|---|---|---|---|')\n"
                                          "print('| 1 | wq_b (FP8) | every | 23.0 |')\n"
                                          "print()\n"
                                          "print('| M | kernel sum us | graph replay us/layer | graph/sum | layer MB |')\n"
                                          "print('|---|---|---|---|---|')\n"
                                          "for m in ms:\n"
                                          "    if m <= 8:\n"
                                          "        print(f'| {m} | 999.0 | {200.0 + 50.0 * m:.1f} | 0.9 | 80.0 |')\n"
                                          "print()\n"
                                          "print('| M | context | step ms |')\n"
                                          "print('|---|---|---|')\n"
                                          "print('| 1 | 4096 | 12.00 |')\n")
        # Two binaries of one name get their paths as labels; the same one twice, positions.
        two = unique_labels([parse_variant("/a/flashseek"), parse_variant("/b/flashseek::--x 1")])
        assert [v[0] for v in two] == ["flashseek", "flashseek --x 1"], two
        two = unique_labels([parse_variant("/a/flashseek"), parse_variant("/b/flashseek")])
        assert [v[0] for v in two] == ["/a/flashseek", "/b/flashseek"], two
        two = unique_labels([parse_variant("/a/flashseek"), parse_variant("/a/flashseek")])
        assert [v[0] for v in two] == ["/a/flashseek #1", "/a/flashseek #2"], two
        variants = [parse_variant(fake), parse_variant(fake + "::--fast")]
        order = []
        res, sl = measure(variants, ["1"], 2, ["--load-format", "dummy"], 30, log=order.append, layers=[8, 12])
        # Round 2 runs the layer counts and the variants in reverse order.
        assert [o.split(":")[0] for o in order] == [
            "round 1 shape    1 layers 8 fakebench", "round 1 shape    1 layers 8 fakebench --fast",
            "round 1 shape    1 layers 12 fakebench", "round 1 shape    1 layers 12 fakebench --fast",
            "round 2 shape    1 layers 12 fakebench --fast", "round 2 shape    1 layers 12 fakebench",
            "round 2 shape    1 layers 8 fakebench --fast", "round 2 shape    1 layers 8 fakebench"], order
        res, sl = measure(variants, ["1", "v6"], 2, ["--load-format", "dummy"], 30, log=lambda *_: None)
        assert not sl, sl
        assert [r[0] for r in res[("1", 8)]["fakebench"]] == [3.7, 3.7], res
        assert [r[0] for r in res[("v6", 8)]["fakebench --fast"]] == [5.7, 5.7], res
        assert [round(r[2], 6) for r in res[("1", 8)]["fakebench"]] == [0.21, 0.21], res  # tape + launch
        assert abs(res[("1", 8)]["fakebench"][0][1] - 27.0) < 0.05, res
        line = ("decode steps: 10 graph launches ({} patched, 10 new executables), 0 eager; host 1.500 ms, sync wait "
                "3.000 ms per step; patched steps: tape 0.300 ms, 12 node updates + launch 0.040 ms per step")
        assert abs(host_ms(line.format(9)) - 0.34) < 1e-9 and host_ms(line.format(0)) == 1.5, line
        assert host_ms("median 3.0 ms/step") is None
        t = tables(res)
        assert "| fakebench --fast | 3.200 / 3.200 | 3.200 | 0.865x |" in t, t
        assert "marginal" not in t, t
        # Two layer counts: (step(12) - step(8)) / 4 = 0.25 ms = 250 us per layer, against the
        # slice's 250 us (M = 1) and 500 us (M = 6).
        res, sl = measure(variants, ["1", "v6", "16"], 2, ["--load-format", "dummy"], 30, log=lambda *_: None,
                          layers=[8, 12], slice_=(fslice, [], 4096, [1, 6]))
        assert sl == {1: [250.0, 250.0], 6: [500.0, 500.0]}, sl
        assert [r[0] for r in res[("1", 12)]["fakebench"]] == [4.7, 4.7], res
        t = tables(res, sl)
        # Host of the patched steps: tape (0.08 + 12 * 0.01 - (0.08 + 8 * 0.01)) / 4 ms = 10 us per layer.
        assert "| 1 | fakebench | 250.0 | 250.0 (250.0 - 250.0) | 10.0 | 250.0 (250.0 / 250.0) | 1.000x | 1.000x |" in t, t
        assert "| v6 | fakebench --fast | 250.0 | 250.0 (250.0 - 250.0) | 10.0 | 500.0 (500.0 / 500.0) | 0.500x | 0.500x |" in t, t
        assert "| 16 | fakebench | 250.0 | 250.0 (250.0 - 250.0) | 10.0 | - | - | - |" in t, t
        # Per round: round r's runs at both layer counts, paired (here rounds of 3.0 / 4.2 and
        # 3.4 / 4.4 ms: 300 and 250 us per layer), against the medians' (4.3 - 3.2) / 4 = 275.
        fake_res = {("1", 8): {"x": [(3.0, None), (3.4, None)]}, ("1", 12): {"x": [(4.2, None), (4.4, None)]}}
        t = tables(fake_res, {1: [250.0]})
        assert "| 1 | x | 275.0 | 275.0 (250.0 - 300.0) | - | 250.0 (250.0) | 1.100x | 1.100x |" in t, t
        try:
            run_slice(fslice, [], 4096, [1, 9], 30)  # the stand-in prints no row past M = 8
            raise AssertionError("a slice run without a row for an M asked for must fail")
        except RuntimeError as e:
            assert "M = [1, 9]" in str(e), e
        try:
            run_slice(broken, [], 4096, [1], 30)
            raise AssertionError("a slice run without its table must fail")
        except RuntimeError as e:
            assert "exit 3" in str(e) and "graph replay" in str(e), e
        refused(parse_layers, ["", "8,8", "12,8", "0,8", "x", "8,12,16"])
        assert parse_layers("8,12") == [8, 12] and shape_tokens("v6") == 6 and shape_tokens("16") is None
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
        refused(parse_shape, ["0", "v", "v0", "x4", ""])
    print("gpu_ab.py self-test: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="*", help="BIN or BIN::bench args")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", default="8", help="layer count, or two (e.g. 8,12) for the marginal layer")
    ap.add_argument("--slice", help="BIN[::ARGS]: also run BIN's layer slice (with two --layers counts)")
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
    if a.rounds < 1 or a.experts < 1 or a.reps < 1 or a.prompt_tokens < 1:
        ap.error("--rounds, --experts, --reps and --prompt-tokens must be >= 1")
    try:
        variants = unique_labels([parse_variant(v) for v in a.variants])
        shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
        for s in shapes:
            parse_shape(s)
        layers = parse_layers(a.layers)
        slice_ = None
        if a.slice:
            if len(layers) < 2:
                raise ValueError("--slice needs two --layers counts (the engine's marginal layer)")
            _, path, extra = parse_variant(a.slice)
            tokens = sorted({shape_tokens(s) for s in shapes if shape_tokens(s) is not None})
            if not tokens:
                raise ValueError("--slice needs a one-sequence shape (1 or vN)")
            slice_ = (path, extra, a.prompt_tokens, tokens)
    except ValueError as e:
        ap.error(str(e))
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "config.json")
        subprocess.run([sys.executable, os.path.join(here, "realwidth_config.py"), "--experts", str(a.experts), cfg],
                       check=True)
        base = ["--load-format", "dummy", "--config", cfg, "--gpus", a.gpus,
                "--reps", str(a.reps), "--prompt-tokens", str(a.prompt_tokens)]
        try:
            res, sl = measure(variants, shapes, a.rounds, base, a.timeout, layers=layers, slice_=slice_)
        except RuntimeError as e:
            print(f"gpu_ab.py: {e}", file=sys.stderr)
            return 1
    print(tables(res, sl))
    return 0


if __name__ == "__main__":
    sys.exit(main())
