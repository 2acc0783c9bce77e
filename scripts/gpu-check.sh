#!/usr/bin/env bash
# GPU check: build, run the CUDA tests and `flashseek bench`, write a results table.
#
#   scripts/gpu-check.sh            on the GPU box: configure + build (Release, archs 90a, ninja
#                                   -j16) when the build dependencies are installed there; else
#                                   run the binaries packed by `pack` (build-cuda/pack).
#   scripts/gpu-check.sh pack       on a dev machine with the dependencies: build the test and
#                                   flashseek binaries into build-cuda and copy them with their
#                                   non-system shared libraries to build-cuda/pack (the GPU image
#                                   may lack nlohmann-json/fmt/spdlog/GTest/PCRE2...).
#                                   FLASHSEEK_GPU_PREBUILT=1 skips the build and uses the pack.
#   scripts/gpu-check.sh archs      compile-only check of the CUDA code for 90a;100a;103a.
#
# Results go to $OUT (if set) else build-gpu/results: log, tests.txt, bench.md, model.md, results.md.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
export PATH="/usr/local/cuda/bin:$PATH"
mode="${1:-run}"

# FLASHSEEK_CUDA_BUILD: the build directory of `pack` (default build-cuda); the pack is
# <build>/pack. FLASHSEEK_PACK_TARGETS: extra ninja targets whose binaries join the pack.
bdir="${FLASHSEEK_CUDA_BUILD:-build-cuda}"
if [ "$mode" = pack ]; then
  set -e
  cmake -S . -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHSEEK_CUDA_ARCHS=90a >/dev/null
  ninja -C "$bdir" -j"${FLASHSEEK_JOBS:-2}" test_ops_cuda test_forward flashseek gemv_stream_probe ${FLASHSEEK_PACK_TARGETS:-}
  rm -rf "$bdir/pack" && mkdir -p "$bdir/pack/bin" "$bdir/pack/lib"
  cp "$bdir/tests/test_ops_cuda" "$bdir/tests/test_forward" "$bdir/bin/flashseek" "$bdir/bench/cuda/gemv_stream_probe" \
    "$bdir/pack/bin/"
  for t in ${FLASHSEEK_PACK_TARGETS:-}; do
    f=$(find "$bdir/tests" "$bdir/bin" "$bdir/bench" -maxdepth 1 -type f -name "$t" 2>/dev/null | head -1)
    [ -n "$f" ] && cp "$f" "$bdir/pack/bin/"
  done
  # Shared libraries outside glibc/libstdc++ travel with the binaries; NCCL is not packed (too
  # large): the GPU image has it in python's nvidia-nccl package (see nccl_libdir below).
  for b in "$bdir"/pack/bin/*; do
    ldd "$b" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux|libgcc_s|libstdc\+\+|libnccl)[.-]' || true
  done | sort -u | xargs -r -I{} cp -L {} "$bdir/pack/lib/"
  du -sh "$bdir/pack"
  exit 0
fi
# On the GPU box: where libnccl.so.2 lives (CUDA toolkit or python's nvidia-nccl-cu13).
nccl_libdir() {
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -e "$d/libnccl.so.2" ] && { echo "$d"; return; }; done
  python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null
}
export NCCL_NVLS_ENABLE=0

if [ "$mode" = archs ]; then
  set -e
  cmake -S . -B build-cuda-archs -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFLASHSEEK_CUDA_ARCHS="90a;100a;103a" >/dev/null
  ninja -C build-cuda-archs -j"${FLASHSEEK_JOBS:-2}" fs_ops_cuda
  echo "archs 90a;100a;103a: fs_ops_cuda compiled"
  exit 0
fi

out="${OUT:-$here/build-gpu/results}"
mkdir -p "$out"
log="$out/log"
exec > >(tee -a "$log") 2>&1
echo "== gpu-check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true

bin_dir=""
if [ "${FLASHSEEK_GPU_PREBUILT:-0}" = 1 ]; then
  echo "FLASHSEEK_GPU_PREBUILT=1: skipping the build here"
elif cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHSEEK_CUDA_ARCHS=90a \
     >"$out/configure.txt" 2>&1; then
  if ninja -C build-gpu -j16 test_ops_cuda test_forward flashseek gemv_stream_probe >"$out/build.txt" 2>&1; then
    bin_dir=build-gpu
    # Kernel tests (Cuda*) and the whole-model GPU parity tests (GpuParity*, GpuModel*).
    (cd build-gpu && ctest -R 'Cuda|Gpu' --output-on-failure) 2>&1 | tee "$out/tests.txt"
    test_rc=${PIPESTATUS[0]}
    fs_bin=build-gpu/bin/flashseek
    probe_bin=build-gpu/bench/cuda/gemv_stream_probe
  else
    echo "build on this machine failed (see build.txt)"; tail -20 "$out/build.txt"
  fi
else
  echo "configure failed here (missing build dependencies?): $(grep -m1 -i 'could not\|error' "$out/configure.txt")"
fi
if [ -z "$bin_dir" ]; then
  pack="$bdir/pack"
  [ -x "$pack/bin/test_ops_cuda" ] || { echo "no build and no $pack: run 'scripts/gpu-check.sh pack' first"; exit 1; }
  echo "using packed binaries from $pack"
  export LD_LIBRARY_PATH="$here/$pack/lib:$(nccl_libdir)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  "$pack/bin/test_ops_cuda" --gtest_color=no 2>&1 | tee "$out/tests.txt"
  test_rc=${PIPESTATUS[0]}
  FLASHSEEK_BIN="$here/$pack/bin/flashseek" "$pack/bin/test_forward" --gtest_color=no \
    --gtest_filter='*Gpu*' 2>&1 | tee -a "$out/tests.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || test_rc=1
  fs_bin="$pack/bin/flashseek"
  probe_bin="$pack/bin/gemv_stream_probe"
fi

"$fs_bin" bench ${FLASHSEEK_BENCH_ARGS:-} --out "$out/bench.md"
bench_rc=$?
# The routed experts' grouped GEMM at the release's 384 experts (in-kernel FP4 expansion against
# the expansion once per GEMM: --moe-expand-min-rows' crossover) and the prefill attention's
# warpgroup kernel against its m16n8k16 one (time, equal bits) -> bench.md.
"$fs_bin" bench --kernels moe >> "$out/bench.md" || bench_rc=1
"$fs_bin" bench --kernels attn >> "$out/bench.md" || bench_rc=1
# The decode GEMVs' access pattern streamed with no model math (bench/cuda/probes/gemv_stream_probe.cu).
if [ -x "${probe_bin:-}" ]; then "$probe_bin" >> "$out/bench.md" || bench_rc=1; fi
# The engine's model at real V4.1 widths (dummy weights, 8 layers of every role, 16 experts, the
# CLI's defaults): decode steps at 4k context for batch 1, a 6-token verify block and batch 8, and
# at 1k context for batch 16 and 64 (bench/RESULTS.md's batch sweeps), each with the HBM floor of
# the bytes it reads -> model.md. FLASHSEEK_MODEL_BENCH=0 skips it.
model_rc=0
if [ "${FLASHSEEK_MODEL_BENCH:-1}" = 1 ]; then
  python3 scripts/realwidth_config.py --experts 16 "$out/realwidth.json" >/dev/null || model_rc=1
  for shape in "--prompt-tokens 4096 --batch 1" "--prompt-tokens 4096 --step-tokens 6" "--prompt-tokens 4096 --batch 8" \
               "--prompt-tokens 1024 --batch 16" "--prompt-tokens 1024 --batch 64"; do
    echo "model bench $shape:"
    # shellcheck disable=SC2086  # $shape is several words
    "$fs_bin" bench --load-format dummy --config "$out/realwidth.json" --num-layers 8 --gpus 0 --reps 20 \
      $shape >"$out/model_run.txt" 2>&1 || model_rc=1
    grep -E 'prefill:|decode:|step bytes|HBM floor' "$out/model_run.txt" | sed 's/^/    /'
  done >"$out/model.md"
fi
# Issue 13's measure: the engine's marginal batch-1 layer ((step at 12 layers - step at 8) / 4, per
# round and of the medians) against the layer slice's in the same rounds, the CLI's defaults against
# one stream without row fusion (scripts/gpu_ab.py) -> marginal.md. FLASHSEEK_MARGINAL_ROUNDS rounds (0, the
# default: skipped; 10 rounds of shapes 1 and v6 take ~4-5 min on an H100).
if [ "${FLASHSEEK_MARGINAL_ROUNDS:-0}" -gt 0 ]; then
  python3 scripts/gpu_ab.py --rounds "$FLASHSEEK_MARGINAL_ROUNDS" --layers 8,12 --shapes 1,v6 --prompt-tokens 4096 \
    --slice "$fs_bin" "$fs_bin" "$fs_bin::--gpu-row-fusion off --gpu-branches off" >"$out/marginal_run.txt" 2>&1 || model_rc=1
  sed -n '/^shape /,$p' "$out/marginal_run.txt" >"$out/marginal.md"
fi
# Baseline in the same run: transformers' DeepseekV4ForCausalLM (or the torch bf16 layer when
# this transformers lacks it), decode step per layer at 4k context -> baseline.md.
# FLASHSEEK_BASELINE=0 skips it.
if [ "${FLASHSEEK_BASELINE:-1}" = 1 ]; then
  python3 scripts/bench_transformers.py --out "$out" ${FLASHSEEK_BASELINE_ARGS:-} || echo "baseline failed (rc=$?)"
fi
{
  echo "# gpu-check $(date -u +%F) $(git rev-parse --short HEAD 2>/dev/null || true)"
  echo "tests rc=$test_rc, bench rc=$bench_rc, model bench rc=$model_rc"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/tests.txt" || grep -E 'tests passed|tests failed' "$out/tests.txt"
  echo
  cat "$out/bench.md" 2>/dev/null
  echo
  cat "$out/model.md" 2>/dev/null
  echo
  cat "$out/marginal.md" 2>/dev/null
  echo
  cat "$out/baseline.md" 2>/dev/null
} > "$out/results.md"
cat "$out/results.md"
[ "$test_rc" = 0 ] && [ "$bench_rc" = 0 ] && [ "$model_rc" = 0 ]
