#!/usr/bin/env python3
"""Non-coherent loads (ld.global.nc) in the CUDA kernels read weights only.

Under programmatic dependent launch a kernel runs while its predecessors still write, and
ld.global.nc is only defined for data that stays read-only over the kernel's lifetime (see
ops/cuda/runtime/pdl.cuh). So in the files searched:
  * __ldg is called only inside ld_weight (runtime/pdl.cuh), the named load for weights and
    load-time tables, so each use says what it reads;
  * inline `ld.global.nc` appears only in the weight-streaming helpers listed in ALLOWED;
  * no pointer is declared `const T* __restrict__`, which nvcc compiles to ld.global.nc loads.
Exits 1 and names each offending line; with --expect N (the check's own test), exits 0 exactly
when it finds N offending lines.

Usage: check_nc_loads.py [--expect N] DIR...   (searched recursively for .cu / .cuh files)"""
import pathlib
import re
import sys

# (file name, function) pairs whose inline asm may use ld.global.nc: weight streams only.
ALLOWED = {("gemv.cu", "ld_stream"), ("linear_mma.cu", "load_weights")}
FUNC = re.compile(r"__device__[^;{]*?\b(\w+)\s*\(")
CONST_RESTRICT = re.compile(r"\bconst\b[^,;()]*\*\s*(const\s+)?__restrict__")


def enclosing_function(lines, i):
    """The name of the last __device__ function declared at or above line i (None if none)."""
    for j in range(i, -1, -1):
        m = FUNC.search(lines[j])
        if m:
            return m.group(1)
    return None


def code_part(line):
    """The line without a trailing // comment (comments may name the instructions)."""
    return line.split("//", 1)[0]


def main(argv):
    expect = None
    if len(argv) >= 2 and argv[0] == "--expect":
        expect, argv = int(argv[1]), argv[2:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    bad = []
    for d in argv:
        for p in sorted(pathlib.Path(d).rglob("*")):
            if p.suffix not in (".cu", ".cuh"):
                continue
            lines = p.read_text().splitlines()
            for i, raw in enumerate(lines):
                line = code_part(raw)
                if "__ldg(" in line and not (p.name == "pdl.cuh" and enclosing_function(lines, i) == "ld_weight"):
                    bad.append(f"{p}:{i + 1}: __ldg outside ld_weight (weights: ld_weight; step-written data: a plain load)")
                if "ld.global.nc" in line and (p.name, enclosing_function(lines, i)) not in ALLOWED:
                    bad.append(f"{p}:{i + 1}: inline ld.global.nc outside the weight-streaming helpers {sorted(ALLOWED)}")
                if CONST_RESTRICT.search(line):
                    bad.append(f"{p}:{i + 1}: const pointer declared __restrict__ (nvcc reads it with ld.global.nc)")
    for line in bad:
        print(line, file=sys.stderr)
    if expect is not None:
        print(f"found {len(bad)} offending lines, expected {expect}", file=sys.stderr)
        return 0 if len(bad) == expect else 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
