#!/usr/bin/env bash
# Aggregate and per-stream decode throughput of `flashseek serve` under concurrent streams
# (scripts/serve_load.py), on the demo checkpoint (tiny-v41 layers, full 129,280-token vocabulary).
# Usage: scripts/gpu-serve-load.sh [--gpus 0] [--streams 1,8,32,64] [--max-tokens 64] [extra serve args...]
# FLASHSEEK_BIN selects the binary (default build/bin/flashseek).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${FLASHSEEK_BIN:-$here/../build/bin/flashseek}"
gpus=0 streams=1,8,32,64 max_tokens=64 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) gpus="$2"; shift 2 ;;
    --streams) streams="$2"; shift 2 ;;
    --max-tokens) max_tokens="$2"; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
work="$(mktemp -d)"
trap 'kill "${pid:-0}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
"$bin" make-tiny --config demo --seed 1 --out "$work/demo" >/dev/null
port=$((20000 + RANDOM % 20000))
"$bin" serve --ckpt "$work/demo" --gpus "$gpus" --port "$port" --max-batch 64 --max-context 4096 --speculative off \
  "${extra[@]}" >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.2
done
python3 "$here/serve_load.py" --url "http://127.0.0.1:$port" --streams "$streams" --max-tokens "$max_tokens"
curl -sf "http://127.0.0.1:$port/metrics" | grep -E "^flashseek_(gpu_graph|engine_step|batch)" | head -20 || true
