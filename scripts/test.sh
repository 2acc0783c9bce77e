#!/usr/bin/env bash
# Builds and runs every test (CPU; GPU tests skip visibly without a GPU). The README's command (2).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
if [ ! -f models/tokenizer/tokenizer.json ] || [ ! -d node_modules ]; then
  bash scripts/setup.sh --no-build
fi
bash scripts/build.sh
cd build
ctest --output-on-failure -j "${FLASHSEEK_TEST_JOBS:-$(nproc)}" "$@"
