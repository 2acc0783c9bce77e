#!/usr/bin/env bash
# Issue 18's scripted-acceptance benchmark on one GPU: decode tokens/s of the real-width dummy
# V4.1 model (DSpark block 5) with `--speculative off` against `on` at a scripted acceptance of
# 2, 3.5 and 5.6 tokens per verification step (scripts/bench_spec.py --script-accept; the draft
# and the verify block run for real, only the acceptance is scripted: BENCHMARK ONLY, the output
# is not the model's). The config is scripts/realwidth_config.py's (release V4.1
# widths, Engram tables cut to ~1M rows, --experts routed experts per layer, --layers layers with
# every role).
# --mode auto: the scripted runs use `--speculative auto` (the policy decides from the measured
# costs and the scripted acceptance) instead of `on`.
# --extra "ARGS": more `run` options for every run (e.g. "--gpu-exact-linears draft" to A/B the
# draft's GEMV path, or "--gpu-branches on").
# Usage: scripts/gpu-spec-script.sh [--layers N] [--experts N] [--gpus 0] [--tokens 256] [--reps 3]
#        [--accept 2,3.5,5.6] [--mode on|auto] [--extra "ARGS"]
# FLASHSEEK_BIN selects the binary (default build/bin/flashseek).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${FLASHSEEK_BIN:-$here/../build/bin/flashseek}"
layers=8 experts=384 gpus=0 tokens=256 reps=3 accept=2,3.5,5.6 mode=on extra=
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers="$2"; shift 2 ;;
    --experts) experts="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --accept) accept="$2"; shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    --extra) extra="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$here/realwidth_config.py" --experts "$experts" "$work/config.json"
python3 "$here/bench_spec.py" --bin "$bin" --ckpt '' --modes off --script-accept "$accept" --script-mode "$mode" \
  --reps "$reps" --max-tokens "$tokens" --prompt-ids 1000,2000,3000,4000,5000,6000,7000,8000 --timeout 600 \
  --extra "--load-format dummy --config $work/config.json --num-layers $layers --gpus $gpus --max-context 4096${extra:+ $extra}"
