#!/usr/bin/env bash
# The full 40-layer V4.1 model at real widths on one GPU (issue 15's 40-layer figures): dummy
# weights from the release config with N routed experts per layer (384 in the release; a batch-1
# token reads 6 whatever N, so batch-1 decode bytes are the release's; at batch B the release reads
# up to min(384, 6B) distinct experts per layer where this model reads at most N) and the Engram
# tables cut to ~1M rows (a step reads 24 rows per token whatever the table size). Then the memory
# plans of the release itself (384 experts, full Engram tables) on one H200, with the Engram
# tables on the device and in host memory: what one GPU lacks says how many the release needs.
# Usage: scripts/gpu-full40.sh [--experts 48] [--gpus 0] [--prompt 4096] [--reps 20]
# FLASHSEEK_BIN selects the binary (default build/bin/flashseek).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${FLASHSEEK_BIN:-$here/../build/bin/flashseek}"
cfg="$here/../tests/model/data/v41-flash-config.json"
experts=48 gpus=0 prompt=4096 reps=20
while [ $# -gt 0 ]; do
  case "$1" in
    --experts) experts="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$here/realwidth_config.py" --experts "$experts" "$work/config.json"
src=(--load-format dummy --config "$work/config.json")
echo "== bench: all 40 layers, $experts routed experts each, batch 1, prompt $prompt, $reps decode steps"
timeout 240 "$bin" bench "${src[@]}" --gpus "$gpus" --batch 1 --prompt-tokens "$prompt" --reps "$reps" 2>&1 |
  grep -E '^(model bench|prefill|decode|loaded|memory plan|  weights|  total)|GB generated' || echo "bench exited $?"
echo "== bench: all 40 layers, batch 32, prompt 128"
timeout 180 "$bin" bench "${src[@]}" --gpus "$gpus" --batch 32 --prompt-tokens 128 --reps 10 2>&1 |
  grep -E '^(prefill|decode)' || echo "bench exited $?"
for where in device host; do
  echo "== memory plan of the release (384 experts, full Engram tables) on one GPU, --engram-tables $where"
  timeout 60 "$bin" run --load-format dummy --config "$cfg" --gpus "$gpus" --engram-tables "$where" --max-context 1048576 \
    --prompt-ids 1,2 --max-tokens 1 2>&1 | grep -E '^  (weights|host-resident|state per sequence|workspace|total)|error' | head -8 || true
done
