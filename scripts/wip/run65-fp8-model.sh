#!/usr/bin/env bash
# Session 48: branch wip/fp8-model (= wip/fragments + the dense FP8 matrices in the fragment order
# through the model, --gpu-fp8-fragments): op and model tests (bitwise on vs off), the layer slice
# with neither / the FP4 / both orders (alternating twice), the 384-expert model A/B (off, FP4 on,
# FP4 + FP8 on), an 8k prefill chunk (off, FP4, both).
set -u
start=$(date +%s); BUDGET=${BUDGET:-540}
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
timeout 200 $B/test_forward --gtest_color=no --gtest_filter='*Fp4Fragments*:*Fp8Fragments*' > $OUT/tests_fwd.txt 2>&1
echo "test_forward rc=$?" >> $S; grep -E '^\[  FAILED|^\[       OK|tests ran|PASSED|Failure|max\|d\||Expected|Which is' $OUT/tests_fwd.txt | head -24 >> $S
i=0
for v in none fp4 both none fp4 both; do
  i=$((i+1))
  if fits 260; then
    A="--gpu-fp4-fragments off --gemv-fp8-fragments off"
    [ $v = fp4 ] && A="--gpu-fp4-fragments on --gemv-fp8-fragments off"
    [ $v = both ] && A="--gpu-fp4-fragments on --gemv-fp8-fragments on"
    timeout $(cap 60 30) $F bench --tokens 1,6 --contexts 4096 $A > $OUT/slice_${i}_$v.txt 2>&1
    echo "slice $i $v rc=$?" >> $S; grep -E '^\| (1|6) \| (wq|wo|shared|routed|[0-9.]+ \| [0-9.]+ \|)' $OUT/slice_${i}_$v.txt | cut -d'|' -f2-9 | head -24 >> $S
  fi
done
if fits 330; then  # the forced k splits with both orders (sweep rows: name, tokens, split 1..8, chunk 2, 4)
  timeout $(cap 60 30) $F bench --tokens 1 --contexts 4096 --gemv-sweep --gpu-fp4-fragments on --gemv-fp8-fragments on > $OUT/sweep_both.txt 2>&1
  echo "sweep rc=$?" >> $S; grep -iE 'sweep|split' $OUT/sweep_both.txt | head -3 >> $S; grep -E '^\| 1 \| (wq|wo|shared|routed)' $OUT/sweep_both.txt | tail -8 >> $S
fi
python3 scripts/realwidth_config.py --experts 384 /tmp/cfg384.json
if fits 150; then
  timeout $(cap 200 70) python3 scripts/gpu_ab.py --rounds 2 --experts 384 --shapes 1,v6,64 --reps 10 --prompt-tokens 1024 $F "$F::--gpu-fp4-fragments on" "$F::--gpu-fp4-fragments on --gpu-fp8-fragments on" > $OUT/ab384.txt 2>&1
  echo "ab384 rc=$?" >> $S; grep -A5 "^shape" $OUT/ab384.txt >> $S
fi
for v in off fp4 both; do
  A="--gpu-fp4-fragments off"; [ $v = fp4 ] && A="--gpu-fp4-fragments on"; [ $v = both ] && A="--gpu-fp4-fragments on --gpu-fp8-fragments on"
  if fits 45; then
    timeout $(cap 60 3) $F bench --load-format dummy --config /tmp/cfg384.json --num-layers 8 --gpus 0 --reps 2 --prompt-tokens 8192 --prefill-reps 3 $A > $OUT/prefill_$v.txt 2>&1
    echo "prefill $v rc=$?" >> $S; grep -iE 'prefill|tok/s|ceiling' $OUT/prefill_$v.txt | head -6 >> $S
  fi
done
echo "done, left $(left) s" >> $S
