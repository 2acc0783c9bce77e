#!/usr/bin/env bash
# README command (1): sets up a fresh machine, writes the embedded `demo` checkpoint (tiny-v41
# structure, full 129,280-token vocabulary, random weights) and chats with it on the CPU backend.
# Random weights: the reply is gibberish by construction; what it shows is the whole path
# (tokenizer -> chat encoding -> engine -> forward -> sampling -> detokenizer) working end to end.
# Usage: bash scripts/demo.sh ["your message"]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
[ -x build/bin/flashseek ] || bash scripts/setup.sh
[ -f models/demo/config.json ] || build/bin/flashseek make-tiny --config demo --seed 1 --out models/demo
msg="${1:-Hello! Who are you?}"
exec build/bin/flashseek run --ckpt models/demo --prompt "$msg" --max-tokens 48 --temperature 0.8 --seed 1
