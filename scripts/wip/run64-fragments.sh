#!/usr/bin/env bash
# (Branch-only: a copy of build-cuda/carry/run64.sh, after packing this branch with
# scripts/pack-gpu.sh --xz build-cuda/carry/c6.tar.xz build-cuda flashseek test_ops_cuda test_forward;
# run: tar xJf build-cuda/carry/c6.tar.xz -C build-cuda && bash scripts/wip/run64-fragments.sh)
# Session 48's first call (prepared in session 47): branch wip/fragments — the FP4 fragment order
# through the model (--gpu-fp4-fragments) and the FP8 GEMV order in the layer slice
# (--gemv-fp8-fragments): op and model tests (bitwise on vs off), the slice with neither / FP4 /
# FP4 + FP8 (alternating twice), the 384-expert model A/B, an 8k prefill chunk on vs off.
set -u
start=$(date +%s); BUDGET=${BUDGET:-420}
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
fits() { [ "$(left)" -gt "$1" ]; }
cap() { local l=$(( $(left) - $2 )); echo $(( l < $1 ? l : $1 )); }
B=build-cuda/pack/bin; F=$PWD/$B/flashseek
export LD_LIBRARY_PATH=$PWD/build-cuda/pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
S=$OUT/summary.txt
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } > $S
timeout 100 $B/test_ops_cuda --gtest_color=no --gtest_filter='CudaGemvPacked.*:CudaExpertGemv.*:CudaGemmFp8.*:CudaBlockLinear.*' > $OUT/tests_ops.txt 2>&1
echo "test_ops_cuda rc=$?" >> $S; grep -E '^\[  FAILED|tests ran|PASSED|Failure|Expected|Which is' $OUT/tests_ops.txt | head -16 >> $S
timeout 150 $B/test_forward --gtest_color=no --gtest_filter='*Fp4Fragments*' > $OUT/tests_fwd.txt 2>&1
echo "test_forward rc=$?" >> $S; grep -E '^\[  FAILED|tests ran|PASSED|Failure|max\|d\||Expected|Which is' $OUT/tests_fwd.txt | head -16 >> $S
i=0
for v in none fp4 both none fp4 both; do
  i=$((i+1))
  if fits 200; then
    A="--gpu-fp4-fragments off --gemv-fp8-fragments off"
    [ $v = fp4 ] && A="--gpu-fp4-fragments on --gemv-fp8-fragments off"
    [ $v = both ] && A="--gpu-fp4-fragments on --gemv-fp8-fragments on"
    timeout $(cap 70 30) $F bench --tokens 1,6 --contexts 4096 $A > $OUT/slice_${i}_$v.txt 2>&1
    echo "slice $i $v rc=$?" >> $S; grep -E '^\| (1|6) \| (wq|wo|shared|routed|[0-9.]+ \| [0-9.]+ \|)' $OUT/slice_${i}_$v.txt | cut -d'|' -f2-9 | head -24 >> $S
  fi
done
python3 scripts/realwidth_config.py --experts 384 /tmp/cfg384.json
if fits 150; then
  timeout $(cap 170 70) python3 scripts/gpu_ab.py --rounds 2 --experts 384 --shapes 1,v6,64 --reps 10 --prompt-tokens 1024 $F "$F::--gpu-fp4-fragments on" > $OUT/ab384.txt 2>&1
  echo "ab384 rc=$?" >> $S; grep -A4 "^shape" $OUT/ab384.txt >> $S
fi
for v in off on; do
  if fits 45; then
    timeout $(cap 60 3) $F bench --load-format dummy --config /tmp/cfg384.json --num-layers 8 --gpus 0 --reps 2 --prompt-tokens 8192 --prefill-reps 3 --gpu-fp4-fragments $v > $OUT/prefill_$v.txt 2>&1
    echo "prefill $v rc=$?" >> $S; grep -iE 'prefill|tok/s|ceiling' $OUT/prefill_$v.txt | head -6 >> $S
  fi
done
echo "done, left $(left) s" >> $S
