#!/usr/bin/env python3
"""Sums an ncu CSV (gpu__time_duration.sum per kernel) by kernel for one engine forward.

Forwards are split at each embedding kernel (one per forward); the last forward is reported
(a decode step when the run generated tokens), or with `first` as the second argument the first
forward (the prompt's prefill chunk), largest first, with its share of the step."""
import csv
import sys
from collections import OrderedDict


def main(path, which="last"):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines before the CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        rows.append((r["Kernel Name"], float(r["Metric Value"].replace(",", ""))))  # thousands separators
    starts = [i for i, (name, _) in enumerate(rows) if "embed" in name.lower()]
    if not starts:
        sys.exit("no embedding kernel found: cannot split forwards")
    if which == "first":
        step = rows[starts[0]:starts[1]] if len(starts) > 1 else rows[starts[0]:]
    else:
        step = rows[starts[-1]:]
    total = sum(t for _, t in step)
    by = OrderedDict()
    for name, t in step:
        short = name.split("(")[0].split("<")[0]
        n, s = by.get(short, (0, 0.0))
        by[short] = (n + 1, s + t)
    print(f"forwards seen: {len(starts)}; {which} forward: {len(step)} kernels, {total / 1e3:.1f} us of kernel time")
    print(f"{'kernel':48s} {'launches':>8s} {'us':>10s} {'share':>7s}")
    for short, (n, s) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{short[:48]:48s} {n:8d} {s / 1e3:10.1f} {100 * s / total:6.1f}%")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] not in ("first", "last"):
        sys.exit("usage: ncu_step_profile.py NCU_CSV [first|last]")
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "last")
