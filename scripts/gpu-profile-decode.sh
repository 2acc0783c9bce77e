#!/usr/bin/env bash
# Where a batch-1 decode step of the engine spends its GPU time at real V4.1 widths (dummy
# weights): `flashseek run` under Nsight Compute (ncu, kernel durations only, clocks left alone),
# the kernels split into forwards at each embedding kernel, the last decode forward summed by
# kernel (scripts/ncu_step_profile.py). CUDA graphs are off so that ncu sees every kernel.
# --context N: the prompt is N tokens (prefilled as one chunk), so the decode step profiled runs at
# context N (attention over the window and the compressed caches, indexer scores + top-k over them).
# --prefill: report the first forward (the N-token prefill chunk) instead of the last decode step.
# --chunk C (with --prefill, C < N): the prompt is prefilled in chunks of C tokens and the last
# chunk is reported (the one that runs at context N - C .. N; --max-tokens 1, so no decode step).
# --prefill-attention auto|staged: the run's prefill attention (auto, the default: the tensor-core
# kernel for chunks of 64+ rows; staged: the exact-order kernel), to compare the two.
# --extra "ARGS": more `run` options (e.g. "--moe-gemm-min-tokens 64"), word-split.
# --csv PATH: also keep ncu's CSV (every kernel of the run, in launch order) at PATH.
# --bench (with --prefill, no --chunk): profile the model bench's first forward (its untimed
# prefill of the same N tokens) instead of `run`'s: the bench does not refuse a model that `run`'s
# start-up memory plan rejects (e.g. 384 experts x 8 layers on an 80 GB card); ncu stops after
# the first forward's kernels.
# Usage: scripts/gpu-profile-decode.sh [--layers 8] [--experts 16] [--gpus 0] [--context 8] [--prefill]
#        [--chunk C] [--prefill-attention auto|staged] [--extra "ARGS"] [--csv PATH] [--bench]
# FLASHSEEK_BIN selects the binary (default build/bin/flashseek); needs ncu on the PATH.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${FLASHSEEK_BIN:-$here/../build/bin/flashseek}"
layers=8 experts=16 gpus=0 context=8 which=last pfattn=auto chunk=0 extra='' csv='' bench=0
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers="$2"; shift 2 ;;
    --experts) experts="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --context) context="$2"; shift 2 ;;
    --prefill) which=first; shift ;;
    --chunk) chunk="$2"; shift 2 ;;
    --prefill-attention) pfattn="$2"; shift 2 ;;
    --extra) extra="$2"; shift 2 ;;
    --csv) csv="$2"; shift 2 ;;
    --bench) bench=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$chunk" -gt 0 ] 2>/dev/null || chunk=$context
tokens=3
if [ "$which" = first ] && [ "$chunk" -lt "$context" ]; then which=last tokens=1; fi
command -v ncu >/dev/null || { echo "ncu not found" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$here/realwidth_config.py" --experts "$experts" "$work/config.json"
python3 -c "import json,sys; print(json.dumps([1000 + (i * 7919) % 100000 for i in range(int(sys.argv[1]))]))" "$context" >"$work/prompt.json"
maxctx=$(( context + 64 > 4096 ? context + 64 : 4096 ))
if [ "$bench" = 1 ]; then
  { [ "$which" = first ] && [ "$chunk" = "$context" ]; } || { echo "--bench needs --prefill without --chunk" >&2; exit 2; }
  # The bench's warm-up forward is the prompt's one-chunk prefill; 3000 kernels cover it with room
  # (a forward of 8 layers is ~600-1000) and the split at the second embedding ends it.
  # shellcheck disable=SC2086  # $extra is word-split on purpose
  ncu --clock-control none --launch-count 3000 --metrics gpu__time_duration.sum --csv --print-units base \
    "$bin" bench --load-format dummy --config "$work/config.json" --num-layers "$layers" --gpus "$gpus" \
    --prompt-tokens "$context" --reps 1 --prefill-reps 1 --prefill-attention "$pfattn" $extra >"$work/ncu.csv" \
    2>"$work/run.log" || { tail -20 "$work/run.log"; exit 1; }
  [ -z "$csv" ] || cp "$work/ncu.csv" "$csv"
  python3 "$here/ncu_step_profile.py" "$work/ncu.csv" first
  exit 0
fi
# shellcheck disable=SC2086  # $extra is word-split on purpose
ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  "$bin" run --load-format dummy --config "$work/config.json" --num-layers "$layers" --gpus "$gpus" \
  --prompt-ids @"$work/prompt.json" --max-tokens "$tokens" --ignore-eos --speculative off \
  --prefill-chunk "$chunk" --max-step-tokens "$chunk" --gpu-graphs off --max-context "$maxctx" --prefill-attention "$pfattn" $extra >"$work/ncu.csv" 2>"$work/run.log" || { tail -20 "$work/run.log"; exit 1; }
[ -z "$csv" ] || cp "$work/ncu.csv" "$csv"
python3 "$here/ncu_step_profile.py" "$work/ncu.csv" "$which"
