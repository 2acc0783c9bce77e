#!/usr/bin/env bash
# Copies already-built GPU binaries of a build directory and their non-system shared libraries
# into <build>/pack (what scripts/gpu-check.sh pack does after its own build), for a carry to the
# GPU box. Usage: scripts/pack-gpu.sh BUILD_DIR BINARY...   (binary names under BUILD_DIR/tests or bin,
# or absolute paths of other programs the run needs, e.g. /usr/bin/redis-server)
set -euo pipefail
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
