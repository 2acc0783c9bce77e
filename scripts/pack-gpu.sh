#!/usr/bin/env bash
# Copies already-built GPU binaries of a build directory and their non-system shared libraries
# into <build>/pack (what scripts/gpu-check.sh pack does after its own build), for a carry to the
# GPU box. Usage: scripts/pack-gpu.sh [--xz FILE] BUILD_DIR BINARY...   (binary names under
# BUILD_DIR/tests or bin, or absolute paths of other programs the run needs, e.g.
# /usr/bin/redis-server, or another build's flashseek for an A/B)
# --xz FILE: also writes the pack as one xz tarball (unpack with `tar xJf FILE -C BUILD_DIR`).
# Its dictionary (128 MiB) spans several binaries: builds of one tree share most of their bytes,
# so a second flashseek costs only its differences (xz's default 8 MiB window is smaller than one
# binary, ~19 MB stripped; five binaries: 31.6 MB that way, 12.5 MB this way), which keeps an
# A/B's binaries within the device's carry limit.
set -euo pipefail
xz_out=""
if [ "${1:-}" = --xz ]; then xz_out="$2"; shift 2; fi
bdir="$1"; shift
rm -rf "$bdir/pack" && mkdir -p "$bdir/pack/bin" "$bdir/pack/lib"
for t in "$@"; do
  if [ "${t#/}" != "$t" ]; then cp -L "$t" "$bdir/pack/bin/"; continue; fi
  f=$(find "$bdir/tests" "$bdir/bin" "$bdir/bench" -maxdepth 1 -type f -name "$t" 2>/dev/null | head -1)
  [ -n "$f" ] || { echo "pack-gpu: $t not built in $bdir" >&2; exit 1; }
  strip -o "$bdir/pack/bin/$t" "$f"
done
for b in "$bdir"/pack/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux|libgcc_s|libstdc\+\+|libnccl)[.-]' || true
done | sort -u | xargs -r -I{} cp -L {} "$bdir/pack/lib/"
du -sh "$bdir/pack"
if [ -n "$xz_out" ]; then
  case "$xz_out" in /*) ;; *) xz_out="$PWD/$xz_out" ;; esac
  (cd "$bdir" && tar cf - pack | xz -T1 --lzma2=preset=6,dict=128MiB > "$xz_out")
  ls -l "$xz_out"
fi
