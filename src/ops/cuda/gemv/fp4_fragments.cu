// The fragment orders on the device (ops/fp4_fragments.h). FP4: one thread per (row, 32-block),
// moving the block's four code words and its scale byte (the twin of ops::pack_fp4_fragments).
// FP8: one thread per (row, 32-block, 8-byte piece), either way (the twins of
// ops::pack_fp8_fragments / unpack_fp8_fragments; the scales keep their layout).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/gemv/gemv_kernels.h"
#include "ops/fp4_fragments.h"

namespace flashseek::ops::cuda::detail {
namespace {

__global__ void pack_fp4_fragments_kernel(const uint8_t* codes, const uint8_t* scales,
                                          int64_t n, int64_t k, uint8_t* out_codes,
                                          uint8_t* out_scales) {
  const int64_t nkb = k / 32, total = n * nkb;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / nkb, kb = i % nkb;
    out_scales[fp4_fragment_scale(row, kb, k)] = scales[i];
    const uint4 v = *reinterpret_cast<const uint4*>(codes + row * (k / 2) + kb * 16);  // 16-byte aligned
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) *reinterpret_cast<uint32_t*>(out_codes + fp4_fragment_word(row, kb, q, k)) = w[q];
  }
}

// kPack: row-major → fragment order; else back. Consecutive threads take consecutive 8-byte
// pieces of the row-major side (coalesced there; the fragment side's writes or reads are 8-byte
// pieces 32 bytes apart, four threads filling a lane's 32 bytes).
template <bool kPack>
__global__ void permute_fp8_fragments_kernel(const uint8_t* in, int64_t n, int64_t k,
                                             uint8_t* out) {
  const int64_t per_row = k / 8, total = n * per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row, piece = i % per_row;
    const int64_t rm = row * k + 8 * piece, fr = fp8_fragment_piece(row, piece / 4, int(piece % 4), k);
    const int64_t src = kPack ? rm : fr, dst = kPack ? fr : rm;
    *reinterpret_cast<uint2*>(out + dst) = *reinterpret_cast<const uint2*>(in + src);
  }
}

}  // namespace

cudaError_t launch_permute_fp8_fragments(const uint8_t* codes, int64_t n, int64_t k, bool pack, uint8_t* out,
                                         cudaStream_t stream) {
  const int64_t total = n * (k / 8);
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, 65535);
  if (pack) permute_fp8_fragments_kernel<true><<<unsigned(blocks), 256, 0, stream>>>(codes, n, k, out);
  else permute_fp8_fragments_kernel<false><<<unsigned(blocks), 256, 0, stream>>>(codes, n, k, out);
  return cudaGetLastError();
}

cudaError_t launch_pack_fp4_fragments(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k,
                                      uint8_t* out_codes, uint8_t* out_scales, cudaStream_t stream) {
  const int64_t total = n * (k / 32);
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, 65535);
  pack_fp4_fragments_kernel<<<unsigned(blocks), 256, 0, stream>>>(codes, scales, n, k, out_codes, out_scales);
  return cudaGetLastError();
}

}  // namespace flashseek::ops::cuda::detail
