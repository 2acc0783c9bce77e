// The FP4 (e2m1) weight expansion of the block-scaled GEMVs (gemv.cu), in a header so that the
// operand-path probe (bench/cuda/probes/mma_f16_probe.cu) runs the kernels' own instructions.
#pragma once

#include <cstdint>

namespace flashseek::ops::cuda::detail {

// PTX prmt.b32 in its default mode: each selector nibble picks a byte of {b, a} (bits 2..0) and,
// with bit 3 set, replicates that byte's top bit over the result byte. (__byte_perm uses only
// bits 2..0.)
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Eight e2m1 nibbles (element 0 lowest) -> eight e4m3 bytes, exactly (e2m1 is a subset of e4m3):
// lo = elements 0..3, hi = elements 4..7. Magnitudes by table lookup (the 8 e4m3 magnitudes,
// selected by each nibble's low 3 bits); signs by prmt's sign-replicating selectors over v << 4
// (whose byte tops are the signs of elements 0, 2, 4, 6) and v (elements 1, 3, 5, 7). Nine
// instructions for eight values: the FP4 decode GEMVs issue as many instructions as they stream.
__device__ __forceinline__ void fp4x8_to_e4m3x8(uint32_t v, uint32_t& lo, uint32_t& hi) {
  const uint32_t m = v & 0x77777777u, a = v << 4;
  lo = prmt(0x3C383000u, 0x4C484440u, m) | (prmt(a, v, 0xD9C8u) & 0x80808080u);
  hi = prmt(0x3C383000u, 0x4C484440u, m >> 16) | (prmt(a, v, 0xFBEAu) & 0x80808080u);
}

}  // namespace flashseek::ops::cuda::detail
