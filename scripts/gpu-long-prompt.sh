#!/usr/bin/env bash
# A long prompt through the engine at real V4.1 widths (dummy weights, one GPU; issue 17): one
# `flashseek run` per prompt length, the prompt prefilled in chunks, then a few decode steps at
# that context. Prints each run's memory plan (the sequence state in the compact formats), the
# prefill tok/s and the decode tok/s at that context.
# Usage: scripts/gpu-long-prompt.sh [--lengths 131072] [--chunk 8192] [--layers 8] [--experts 16]
#                                   [--tokens 16] [--gpus 0] [--timeout 300]
# --layers N (>= 8) keeps every layer role (--num-layers). FLASHSEEK_BIN selects the binary
# (default build/bin/flashseek).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${FLASHSEEK_BIN:-$here/../build/bin/flashseek}"
lengths=131072 chunk=8192 layers=8 experts=16 tokens=16 gpus=0 limit=300
while [ $# -gt 0 ]; do
  case "$1" in
    --lengths) lengths="$2"; shift 2 ;;
    --chunk) chunk="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --experts) experts="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --timeout) limit="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$here/realwidth_config.py" --experts "$experts" "$work/config.json"
for n in ${lengths//,/ }; do
  python3 -c "import random,json,sys; random.seed(1); print(json.dumps([random.randrange(1000, 120000) for _ in range(int(sys.argv[1]))]))" "$n" >"$work/p.json"
  echo "== run: $n-token prompt in chunks of $chunk, $tokens tokens, dummy real-width V4.1, $layers layers"
  timeout "$limit" "$bin" run --load-format dummy --config "$work/config.json" --num-layers "$layers" --gpus "$gpus" \
    --prompt-ids @"$work/p.json" --max-tokens "$tokens" --ignore-eos --speculative off \
    --prefill-chunk "$chunk" --max-step-tokens "$chunk" --max-context $((n + tokens + 64)) >"$work/run.log" 2>&1 \
    || { echo "run exited $?"; grep -iE 'error|refused|fits' "$work/run.log" | tail -5; }
  grep -E '^(prompt .* tok/s|  state per sequence|  total for|memory plan|run exited)' "$work/run.log" | tail -6
done
