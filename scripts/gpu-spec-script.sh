#!/usr/bin/env bash
# Issue 18's scripted-acceptance benchmark on one GPU: decode tokens/s of the real-width dummy
# V4.1 model (DSpark block 5) with `--speculative off` against `on` at a scripted acceptance of
# 2, 3.5 and 5.6 tokens per verification step (scripts/bench_spec.py --script-accept; the draft
# and the verify block run for real, only the acceptance is scripted: BENCHMARK ONLY, the output
# is not the model's). The config is built as scripts/gpu-realwidth.sh builds it (release V4.1
# widths, Engram tables cut to ~1M rows, --experts routed experts per layer, --layers layers with
# every role).
# Usage: scripts/gpu-spec-script.sh [--layers N] [--experts N] [--gpus 0] [--tokens 256] [--reps 3]
#        [--accept 2,3.5,5.6]
# FLASHSEEK_BIN selects the binary (default build/bin/flashseek).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${FLASHSEEK_BIN:-$here/../build/bin/flashseek}"
cfg="$here/../tests/model/data/v41-flash-config.json"
layers=8 experts=384 gpus=0 tokens=256 reps=3 accept=2,3.5,5.6
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers="$2"; shift 2 ;;
    --experts) experts="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --accept) accept="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -c "
import json, sys
c = json.load(open(sys.argv[1]))
t = c['text_config']
t['engram_vocab_size'] = 40000  # the prime layout then gives these rows (ops::engram_layouts)
t['engram_num_embeddings'] = [963078, 970134]
t['n_routed_experts'] = int(sys.argv[3])
t['dspark_n_routed_experts'] = min(t['dspark_n_routed_experts'], int(sys.argv[3]))
json.dump(c, open(sys.argv[2], 'w'))" "$cfg" "$work/config.json" "$experts"
python3 "$here/bench_spec.py" --bin "$bin" --ckpt '' --modes off --script-accept "$accept" \
  --reps "$reps" --max-tokens "$tokens" --prompt-ids 1000,2000,3000,4000,5000,6000,7000,8000 --timeout 600 \
  --extra "--load-format dummy --config $work/config.json --num-layers $layers --gpus $gpus --max-context 4096"
