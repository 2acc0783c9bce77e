#!/usr/bin/env bash
# The engine at real V4.1 widths with dummy weights (issue 13 / 15 measurements), on one GPU:
#   1. `flashseek run` on an 8,192-token prompt + 32 generated tokens: prefill tok/s, batch-1 decode tok/s;
#   2. `flashseek serve` + scripts/serve_load.py at several stream counts (decode tok/s per stream
#      and in aggregate);
#   3. `flashseek bench` layer slice at context 4096 for comparison.
# The config: scripts/realwidth_config.py (the release V4.1 config, Engram tables cut to ~1M rows,
# --experts N routed experts per layer; generating 384 experts x 8 layers takes minutes).
# --num-layers keeps every layer role.
# --engram-compare: the short-context decode run once with --engram-tables host and once with
# device (the per-step cost of gathering the Engram rows on the host and copying them up).
# --skip-8k / --skip-serve / --skip-bench leave out those parts.
# Usage: scripts/gpu-realwidth.sh [--layers N] [--experts N] [--streams 1,8,32] [--gpus 0]
#                                 [--engram-compare] [--skip-8k] [--skip-serve] [--skip-bench]
# FLASHSEEK_BIN selects the binary (default build/bin/flashseek).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${FLASHSEEK_BIN:-$here/../build/bin/flashseek}"
layers=8 streams=1,8,32 gpus=0 experts=384 engram_compare=0 skip8k=0 skipserve=0 skipbench=0
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers="$2"; shift 2 ;;
    --streams) streams="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --experts) experts="$2"; shift 2 ;;
    --engram-compare) engram_compare=1; shift ;;
    --skip-8k) skip8k=1; shift ;;
    --skip-serve) skipserve=1; shift ;;
    --skip-bench) skipbench=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
trap 'kill "${pid:-0}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
python3 -c "import random,json; random.seed(1); print(json.dumps([random.randrange(1000, 120000) for _ in range(8192)]))" >"$work/p8k.json"
python3 "$here/realwidth_config.py" --experts "$experts" "$work/config.json"
src=(--load-format dummy --config "$work/config.json" --num-layers "$layers")
if [ "$skip8k" = 0 ]; then
  echo "== run: 8192-token prompt, 32 tokens, dummy real-width V4.1, $layers layers"
  timeout 150 "$bin" run "${src[@]}" --gpus "$gpus" --prompt-ids @"$work/p8k.json" --max-tokens 32 --ignore-eos --speculative off \
    --max-context 16384 >"$work/run1.log" 2>&1 || echo "run exited $?"
  grep -E '^(prompt .* tok/s|loaded |memory plan|run exited)' "$work/run1.log" | tail -4
fi
short_run() {  # $1: --engram-tables value (empty: the default)
  local extra=()
  [ -n "$1" ] && extra=(--engram-tables "$1")
  echo "== run: 16-token prompt, 64 tokens (decode at short context)${1:+, --engram-tables $1}"
  timeout 100 "$bin" run "${src[@]}" --gpus "$gpus" "${extra[@]}" \
    --prompt-ids 1000,2000,3000,4000,5000,6000,7000,8000,9000,10000,11000,12000,13000,14000,15000,16000 \
    --max-tokens 64 --ignore-eos --speculative off --max-context 4096 >"$work/run2.log" 2>&1 || echo "run exited $?"
  grep -E '^(prompt .* tok/s|loaded |run exited)' "$work/run2.log" | tail -3
}
if [ "$engram_compare" = 1 ]; then short_run host; short_run device; else short_run ""; fi
if [ "$skipserve" = 0 ]; then
  echo "== serve: streams $streams"
  port=$((20000 + RANDOM % 20000))
  "$bin" serve "${src[@]}" --gpus "$gpus" --port "$port" --max-batch 64 --max-context 4096 --speculative off \
    >"$work/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { tail -20 "$work/serve.log"; exit 1; }
    sleep 0.2
  done
  grep -iE "memory plan|weights|plan|total for" "$work/serve.log" | head -12 || true
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "device memory in use (nvidia-smi, whole GPU): $(nvidia-smi --id="${gpus%%,*}" --query-gpu=memory.used --format=csv,noheader)"
  fi
  echo "-- the seed's streaming client (tetris prompt, 128 tokens, batch 1)"
  timeout 60 python3 "$here/stream_client.py" --url "http://127.0.0.1:$port" --max-tokens 128 2>&1 | tail -1 || true
  timeout 90 python3 "$here/serve_load.py" --url "http://127.0.0.1:$port" --streams "$streams" --max-tokens 32 || true
  kill "$pid"; wait "$pid" 2>/dev/null || true
fi
if [ "$skipbench" = 0 ]; then
  echo "== bench: layer slice, context 4096"
  timeout 90 "$bin" bench --tokens 1,6 --contexts 4096 --reps 3 2>&1 | grep -E "layer|copy|HBM|sum" | head -12 || true
fi
