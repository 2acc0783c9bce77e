#!/usr/bin/env python3
"""Every CUDA kernel defined in a file that launches through ops/cuda/runtime/launch.cuh must start
with pdl_prologue() (ops/cuda/runtime/pdl.cuh): launch_kernel* may launch it with programmatic
dependent launch, and a kernel that touched memory before waiting for its predecessor would race
with it. Exits 1 and names each kernel that lacks it; --fix inserts the call (and the include).

Usage: check_pdl_prologue.py [--fix] DIR...   (searched recursively for .cu / .cuh files)"""
import pathlib
import re
import sys

GLOBAL = re.compile(r"__global__\b")
PROLOGUE = "pdl_prologue();"
INCLUDE = '#include "ops/cuda/runtime/pdl.cuh"'


def kernels(text):
    """(name, index of the body's '{') of each __global__ definition (declarations skipped)."""
    out = []
    for m in GLOBAL.finditer(text):
        i, depth = m.end(), 0
        # Skip to the parameter list's end, then to '{' (definition) or ';' (declaration).
        while i < len(text):
            c = text[i]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif depth == 0 and c in "{;":
                break
            i += 1
        if i >= len(text) or text[i] == ";":
            continue
        head = text[m.end():i]
        names = re.findall(r"(\w+)\s*\(", head)
        names = [n for n in names if n not in ("__launch_bounds__", "__cluster_dims__", "alignas")]
        out.append((names[0] if names else "?", i))
    return out


def first_statement_is_prologue(text, brace):
    body = text[brace + 1:]
    body = re.sub(r"^\s*(//[^\n]*\n\s*)*", "", body)
    # pdl_prologue([...] { ... }), or a declaration initialised by it: a function that reads only
    # weights before the wait (pdl.cuh).
    with_function = r"((const\s+)?[\w:<>]+\s+\w+\s*=\s*)?pdl_prologue\(\["
    return body.startswith(PROLOGUE) or re.match(with_function, body) is not None


def main(argv):
    fix = "--fix" in argv
    dirs = [a for a in argv if a != "--fix"]
    if not dirs:
        print(__doc__, file=sys.stderr)
        return 2
    bad = []
    for d in dirs:
        for p in sorted(pathlib.Path(d).rglob("*")):
            if p.suffix not in (".cu", ".cuh") or p.name == "pdl.cuh":
                continue
            text = p.read_text()
            if "launch.cuh" not in text or "launch_kernel" not in text:
                continue
            ks = kernels(text)
            missing = [(n, b) for n, b in ks if not first_statement_is_prologue(text, b)]
            if not missing:
                continue
            if not fix:
                bad += [f"{p}: kernel {n} does not start with {PROLOGUE}" for n, _ in missing]
                continue
            for _, b in sorted(missing, key=lambda x: -x[1]):
                text = text[:b + 1] + "\n  " + PROLOGUE + text[b + 1:]
            if INCLUDE not in text:
                text = text.replace('#include "ops/cuda/runtime/launch.cuh"',
                                    '#include "ops/cuda/runtime/launch.cuh"\n' + INCLUDE, 1)
            p.write_text(text)
            print(f"{p}: added {PROLOGUE} to {', '.join(n for n, _ in missing)}")
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
