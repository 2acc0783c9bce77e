#!/usr/bin/env bash
# README command (1): sets up a fresh machine (packages, tokenizer data, build), writes the
# embedded `demo` checkpoint (tiny-v41 structure, full 129,280-token vocabulary, random weights)
# and serves it with the OpenAI-compatible API on port ${PORT:-8000} (CPU backend).
# Random weights: replies are noise by construction; every stage (tokenizer, chat encoding,
# engine, forward pass, sampling, streaming, output parsing) is the real one.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
[ -x build/bin/flashseek ] || bash scripts/setup.sh
[ -f models/demo/config.json ] || build/bin/flashseek make-tiny --config demo --seed 1 --out models/demo
exec build/bin/flashseek serve --ckpt models/demo --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}" --max-context 4096 "$@"
