#!/usr/bin/env bash
# Load GB/s against the disk (issue #15): makes a real-width checkpoint with make-tiny (the release
# V4.1 config's widths with fewer routed experts, a smaller vocabulary, no Engram tables (98 GB
# each at real size) and no draft, `--num-layers` layers), measures the read GB/s of its
# safetensors files with dd (cold page cache when the caches can be dropped, and warm; one file
# after the other, and nproc files at a time as the loader reads them), then the load GB/s that
# `flashseek run` reports on the CPU backend (and with --gpus 0 when a GPU is present), cold and
# warm, each as a percentage of the parallel dd's. Prints a Markdown table.
#
#   scripts/load-bench.sh [--bin build/bin/flashseek] [--config tests/model/data/v41-flash-config.json]
#                         [--layers 8] [--experts 2] [--vocab 16384] [--dir /tmp/fs-load-bench] [--keep]
#                         [--backends cpu,gpu0] [--repeat 3]
#
# Warm rows are the best of --repeat runs each (dd and the loader alike): the page-cache copy
# rate of a shared VM varies from run to run, and both sides get the same number of tries.
# The CPU backend dequantises every matrix to FP32 (4-8x the checkpoint's bytes in memory): keep
# the checkpoint a few GB there. 8 layers is the fewest the real V4.1 roles allow.
# Cold runs drop the page cache (echo 3 > /proc/sys/vm/drop_caches, root only); without that
# permission (e.g. in a container) each shard's cached pages are evicted instead with
# posix_fadvise(DONTNEED) (`dd iflag=nocache count=0`), which works on clean pages of files we can
# read. --backends picks what loads (default: cpu, plus gpu0 when a GPU is present; at real widths
# on a GPU box pass gpu0 alone: the CPU backend needs ~4x the checkpoint in host memory).
set -euo pipefail

BIN=build/bin/flashseek
CONFIG=tests/model/data/v41-flash-config.json
LAYERS=8
EXPERTS=2
VOCAB=16384
DIR=/tmp/fs-load-bench
KEEP=0
BACKENDS=""
REPEAT=3
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --experts) EXPERTS=$2; shift 2 ;;
    --vocab) VOCAB=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --backends) BACKENDS=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    *) echo "load-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "load-bench: $BIN not found (build flashseek first)" >&2; exit 1; }
[ -f "$CONFIG" ] || { echo "load-bench: $CONFIG not found" >&2; exit 1; }

CKPT="$DIR/ckpt"
mkdir -p "$DIR"
if [ "$KEEP" = 0 ]; then trap 'rm -rf "$DIR"' EXIT; fi

# The release config with fewer routed experts, a smaller vocabulary and no Engram layers (the
# layer count is reduced by make-tiny --num-layers, which keeps every layer role).
python3 - "$CONFIG" "$EXPERTS" "$VOCAB" "$DIR/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
t = c.get("text_config", c)
experts, vocab = int(sys.argv[2]), int(sys.argv[3])
for k in ("n_routed_experts", "dspark_n_routed_experts"):
    if k in t: t[k] = experts
for k in ("num_experts_per_tok", "dspark_num_experts_per_tok"):
    if k in t: t[k] = min(t[k], experts)
t["vocab_size"] = vocab
for k in [k for d in (c, t) for k in d if k.endswith("token_id")]:
    for d in (c, t):
        if isinstance(d.get(k), int) and d[k] >= vocab: d[k] = vocab - 1
if "engram_compressed_vocab_size" in t: t["engram_compressed_vocab_size"] = min(t["engram_compressed_vocab_size"], vocab)
t["engram_layer_ids"], t["engram_num_embeddings"] = [], []
json.dump(c, open(sys.argv[4], "w"), indent=1)
EOF

if [ ! -f "$CKPT/model.safetensors.index.json" ]; then
  t0=$(date +%s.%N)
  "$BIN" make-tiny --config "$DIR/config.json" --num-layers "$LAYERS" --no-draft --seed 1 --out "$CKPT" >/dev/null
  t1=$(date +%s.%N)
  sync
  echo "make-tiny: $(du -sh "$CKPT" | cut -f1) in $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
fi
BYTES=$(find "$CKPT" -name '*.safetensors' -printf '%s\n' | awk '{s += $1} END {print s}')
NFILES=$(find "$CKPT" -name '*.safetensors' | wc -l)

can_drop=0 drop_how=""
if [ -w /proc/sys/vm/drop_caches ] && sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
  can_drop=1 drop_how="drop_caches"
elif dd if="$(find "$CKPT" -name '*.safetensors' | head -1)" iflag=nocache count=0 status=none 2>/dev/null; then
  can_drop=2 drop_how="fadvise DONTNEED per shard"
fi
drop() {
  sync
  if [ "$can_drop" = 1 ]; then echo 3 > /proc/sys/vm/drop_caches
  else for f in "$CKPT"/*.safetensors; do dd if="$f" iflag=nocache count=0 status=none; done; fi
}

# dd of every shard: one after the other, or (par) $(nproc) at a time as the loader reads them
# (GB/s over all bytes).
dd_rate() {
  local t0 t1
  t0=$(date +%s.%N)
  if [ "${1:-seq}" = par ]; then
    find "$CKPT" -name '*.safetensors' -print0 | xargs -0 -P "$(nproc)" -I{} dd if={} of=/dev/null bs=16M status=none
  else
    for f in "$CKPT"/*.safetensors; do dd if="$f" of=/dev/null bs=16M status=none; done
  fi
  t1=$(date +%s.%N)
  python3 -c "print(f'{$BYTES / 1e9 / ($t1 - $t0):.2f}')"
}

# Best (highest GB/s; first field) of $REPEAT calls of the command for a warm cache, one call cold.
best_of() {
  local cache=$1 best="" r; shift
  local n=1
  [ "$cache" = warm ] && n=$REPEAT
  for _ in $(seq "$n"); do
    r=$("$@")
    if [ -z "$best" ] || python3 -c "import sys; sys.exit(0 if float('${r%% *}') > float('${best%% *}') else 1)"; then best=$r; fi
  done
  echo "$best"
}

# The load GB/s `flashseek run` prints ("loaded ...: X GB of weights in S s (R GB/s)").
load_rate() {
  local out
  out=$("$BIN" run --ckpt "$CKPT" "$@" --prompt-ids 1,2,3 --max-tokens 1 --temperature 0 --speculative off \
        --json 2>&1 >/dev/null) || { echo "load-bench: flashseek run failed:" >&2; echo "$out" >&2; exit 1; }
  echo "$out" | sed -n 's/^loaded .* in \([0-9.]*\) s (\([0-9.]*\) GB\/s)$/\2 \1/p' | tail -1
}

pct() { python3 -c "print(f'{100 * $1 / $2:.0f}')"; }

echo
echo "checkpoint: $CKPT, $NFILES files, $(python3 -c "print(f'{$BYTES / 1e9:.2f}')") GB (real V4.1 widths, $LAYERS layers, $EXPERTS routed experts, vocab $VOCAB, no Engram, no draft); $(nproc) cores"
echo
if [ -n "$BACKENDS" ]; then
  IFS=, read -r -a backends <<<"$BACKENDS"
else
  backends=("cpu")
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then backends+=("gpu0"); fi
fi
[ "$can_drop" != 0 ] && echo "cold page cache: $drop_how"
echo
# On a GPU the loader's copies go through pinned staging to the device: from a warm page cache the
# link, not the disk, can be the bound, so the GPU rows also show % of min(dd, host->device).
H2D=""
for b in "${backends[@]}"; do
  if [ "$b" = gpu0 ]; then
    H2D=$("$BIN" bench --kernels h2d --reps 5 2>/dev/null | awk -F'|' '/^\| [12] \|/ {g = $3 + 0; if (g > m) m = g} END {if (m > 0) printf "%.2f", m}')
    echo "host -> device copy (pinned, best of 1 and 2 streams): ${H2D:-?} GB/s"
  fi
done
echo
echo "| what | page cache | GB/s | seconds | % of dd | % of min(dd, host->device) |"
echo "|---|---|---|---|---|---|"
for cache in cold warm; do
  if [ "$cache" = cold ] && [ "$can_drop" = 0 ]; then
    echo "| (cold runs skipped: cannot drop the page cache here) | cold | - | - | - | - |"
    continue
  fi
  [ "$cache" = cold ] && drop
  [ "$cache" = warm ] && dd_rate >/dev/null  # fill the cache
  DD=$(dd_rate)
  echo "| dd, $NFILES files in turn | $cache | $DD | - | - | - |"
  [ "$cache" = cold ] && drop
  DD=$(best_of "$cache" dd_rate par)
  echo "| dd, $NFILES files, $(nproc) at a time$([ "$cache" = warm ] && echo ", best of $REPEAT") | $cache | $DD | - | 100 | - |"
  for b in "${backends[@]}"; do
    [ "$cache" = cold ] && drop
    args=()
    [ "$b" = gpu0 ] && args=(--gpus 0)
    read -r rate secs <<<"$(best_of "$cache" load_rate "${args[@]}")"
    bound="-"
    if [ "$b" = gpu0 ] && [ -n "$H2D" ]; then bound=$(pct "$rate" "$(python3 -c "print(min($DD, $H2D))")"); fi
    echo "| flashseek run load, $b$([ "$cache" = warm ] && echo ", best of $REPEAT") | $cache | $rate | $secs | $(pct "$rate" "$DD") | $bound |"
  done
done
