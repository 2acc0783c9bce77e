#!/usr/bin/env bash
# Configures and builds flashseek into ./build (CUDA on when nvcc is found; archs from
# FLASHSEEK_CUDA_ARCHS, default 90a). Extra CMake args pass through: bash scripts/build.sh -DFLASHSEEK_CUDA=OFF
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
jobs="${FLASHSEEK_JOBS:-$(nproc)}"
# FLASHSEEK_QUICK_BUILD=1 (CI: a clean machine without a compiler cache): no debug information and
# precompiled test headers, a third less compile time; the same optimisation, so the same results.
quick=()
if [ "${FLASHSEEK_QUICK_BUILD:-0}" = 1 ]; then
  quick=(-DFLASHSEEK_TEST_PCH=ON "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG"
         "-DCMAKE_CUDA_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG")
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLASHSEEK_CUDA_ARCHS="${FLASHSEEK_CUDA_ARCHS:-90a}" "${quick[@]}" "$@"
cmake --build build -j "$jobs"
