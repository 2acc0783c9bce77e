// Index scores on the integer tensor cores (IndexScoreArgs::kernel 4), for reference numerics,
// where both sides of every dot are FP4 values: the query heads come out of the e2m1 x E8M0
// (32-block) quant-dequant and the index keys are stored in that format (kFp4E8m0, block 32);
// head dims 32, 64, 96 or 128 (V4 / V4.1: 128; the tiny checkpoints: 32 or 128).
//
// Why integers: within a 32-block a value is (an integer of at most 4 bits) x (a power of two),
// so the block's share of q·k is an integer sum (at most 32 x 15 x 12) that the s8 MMA
// (m16n8k32, s32 accumulate) computes exactly, whatever its internal order. The block sums are
// then combined as I_g x 2^(eq_g + ek_g), block 0 first (one exact product and one FMA each).
// Every product and partial sum of ops::index_scores' FP32 dot is then exact as long as the
// dot's terms fit 24 bits at the smallest block's unit (block exponents within ~9 of each other,
// and nothing subnormal): in that case both sides compute the exact dot, so the scores are the
// CPU's bits. Outside it (block scales 2^10+ apart, or products under 2^-126) the two orders may
// round differently, by at most the reordering bound of an FP32 dot of 128 terms
// (docs/cuda.md, "Indexer scores"). The rest is the CPU's order: BF16 rounding of the dot,
// relu, x w, BF16 rounding, then the head sum h = 0, 1, ... in FP32, by one lane per key.
//
// Layout: index_q_pack_kernel turns each query row [nI, 128] into s8 A fragments in the MMA's
// register order (heads padded to MT x 16 with zeros) and one FP32 scale per (head, block).
// index_scores_imma_kernel: a block of 8 warps owns 256 keys, each warp 32 of them as B fragments
// in registers for the whole launch (with their scales), and loops over the query rows; per row
// and 16 heads it runs 4 x 4 MMAs, the epilogue writes relu·w per (head, key) to the warp's
// shared tile, and lane k sums key k's heads in order and stores its score.
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "ops/cuda/indexer/index_imma.h"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"
#include "ops/cuda/runtime/smem_limit.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

constexpr int kMaxDi = 128, kGroups = kMaxDi / 32;  // dims per head (at most), 32-blocks per head (at most)
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kNt = 4;                          // n8 key tiles per warp (32 keys)
constexpr int kWarpKeys = 8 * kNt, kBlockKeys = kWarps * kWarpKeys;
constexpr int kLd = kWarpKeys + 8;              // shared row of one head: 32 keys + pad (8 banks)

// ops::index_scores relu: std::max(d, 0.0f) keeps d unless d < 0 (a NaN dot stays NaN).
__device__ __forceinline__ float relu_cpu(float d) { return d < 0.0f ? 0.0f : d; }

// Twice an e2m1 code's value as an integer (sign in bit 3): 0, 1, 2, 3, 4, 6, 8, 12.
__device__ __forceinline__ int32_t e2m1_twice(uint32_t nib) {
  const int32_t m = int32_t((0xC8643210u >> (4 * (nib & 7u))) & 15u);
  return (nib & 8u) ? -m : m;
}

__device__ __forceinline__ uint32_t pack_s8(int32_t a, int32_t b, int32_t c, int32_t d) {
  return (uint32_t(a) & 255u) | ((uint32_t(b) & 255u) << 8) | ((uint32_t(c) & 255u) << 16) | (uint32_t(d) << 24);
}

__device__ __forceinline__ void imma16832(int32_t* c, const uint4& a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}

// grid (T, MT), block 16 warps: warp w packs head m*16 + w of row t (zeros past nI). Lane L holds
// dims 4L .. 4L+3 (block L / 8; lanes past dI idle). A value v of a block with |max| = M·2^e (M in [0.5, 1)) is
// i · 2^(e−4) with |i| <= 15 when v is an FP4 value (see the file comment); a non-finite block
// gets a NaN scale, so its scores are NaN as the CPU's would be non-finite. The step-written
// inputs here and below are not const __restrict__: nvcc turns such loads into ld.global.nc.
__global__ void __launch_bounds__(512) index_q_pack_kernel(const float* q, int64_t nI, int dI, int MT,
                                                          uint32_t* __restrict__ frag, float* __restrict__ qscale) {
  pdl_prologue();
  const int64_t t = blockIdx.x;
  const int m = int(blockIdx.y), w = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t h = int64_t(m) * 16 + w;
  if (4 * lane >= dI) return;  // blocks past dI are never read (whole 8-lane groups)
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (h < nI) v = reinterpret_cast<const float4*>(q + (t * nI + h) * dI)[lane];  // plain: q step-written
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  bool bad = !(isfinite(v.x) && isfinite(v.y) && isfinite(v.z) && isfinite(v.w));
  const unsigned lanes = __activemask();  // the 8-lane groups of blocks < dI / 32
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(lanes, amax, o));
    bad = __shfl_xor_sync(lanes, int(bad), o) != 0 || bad;
  }
  int e = 0;
  frexpf(amax, &e);  // amax = M · 2^e, M in [0.5, 1) (0 for an all-zero block: e = 0)
  const int32_t i0 = int32_t(rintf(ldexpf(v.x, 4 - e))), i1 = int32_t(rintf(ldexpf(v.y, 4 - e)));
  const int32_t i2 = int32_t(rintf(ldexpf(v.z, 4 - e))), i3 = int32_t(rintf(ldexpf(v.w, 4 - e)));
  // Fragment position of (head row hr, dims kk..kk+3 of block g): register rsel + 2·(kk / 16)
  // of lane (hr % 8)·4 + (kk % 16) / 4 (PTX m16n8k32 .s8 A layout).
  const int g = lane / 8, kk = (lane % 8) * 4, hr = w, rsel = hr / 8;
  const int flane = (hr % 8) * 4 + (kk % 16) / 4, reg = rsel + 2 * (kk / 16);
  const uint32_t packed = bad ? 0u : pack_s8(i0, i1, i2, i3);
  frag[((t * MT + m) * kGroups + g) * 128 + flane * 4 + reg] = packed;
  if (lane % 8 == 0) {
    const float s = bad ? __uint_as_float(0x7fc00000u) : h < nI ? ldexpf(1.0f, e - 4) : 0.0f;
    qscale[(((t * MT + m) * 2 + rsel) * 8 + hr % 8) * kGroups + g] = s;
  }
}

template <int MT>
__global__ void __launch_bounds__(kThreads, 2) index_scores_imma_kernel(IndexScoreArgs a, const uint4* frag,
                                                                        const float4* qscale) {
  pdl_prologue();
  extern __shared__ float imma_smem[];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), gq = lane / 4, tig = lane % 4;
  float* vs = imma_smem + warp * (MT * 16 * kLd);  // [head][kLd]: relu·w of this warp's keys
  const int64_t wk0 = int64_t(blockIdx.x) * kBlockKeys + warp * kWarpKeys;
  // This block's sequence (blockIdx.z of a multi-sequence launch): its keys, rows and scores.
  IndexSeg sg{a.keys, a.start, a.T, 0, 0};
  if (a.segs) sg = a.segs[blockIdx.z];
  const int64_t stride = a.segs ? sg.start + sg.T : a.stride;
  const int64_t clen_max = (sg.start + sg.T) / a.ratio;
  if (wk0 >= clen_max || !sg.keys) return;  // warp-uniform; no block-wide barrier below
  const int nI = int(a.nI), G = int(a.dI / 32);
  const uint8_t* keys = static_cast<const uint8_t*>(sg.keys);
  const int64_t rb = a.key_fmt.row_bytes(), so = a.key_fmt.scale_offset();

  // B fragments: key wk0 + 8·nt + gq, dims 32g + 4·tig .. +3 (b0) and 32g + 16 + 4·tig .. +3 (b1).
  uint32_t b[kNt][kGroups][2];
  // Scales of the epilogue's keys wk0 + 8·nt + 2·tig + c: 2^(E8M0 − 127) / 2 (the codes are 2 x e2m1).
  float sk[kNt][2][kGroups];
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    const int64_t key = wk0 + 8 * nt + gq;
    const bool in = key < clen_max;
    const uint8_t* row = keys + (in ? key : 0) * rb;
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int d = 32 * g + 16 * half + 4 * tig;
        const uint32_t c = in && g < G ? uint32_t(*reinterpret_cast<const uint16_t*>(row + d / 2)) : 0u;
        b[nt][g][half] = pack_s8(e2m1_twice(c), e2m1_twice(c >> 4), e2m1_twice(c >> 8), e2m1_twice(c >> 12));
      }
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t k2 = wk0 + 8 * nt + 2 * tig + c;
      const uint8_t* r2 = keys + (k2 < clen_max ? k2 : 0) * rb + so;
#pragma unroll
      for (int g = 0; g < kGroups; ++g) sk[nt][c][g] = k2 < clen_max && g < G ? 0.5f * dev_e8m0_value(r2[g]) : 0.0f;
    }
  }

  for (int64_t t = blockIdx.y; t < sg.T; t += gridDim.y) {
    const int64_t clen = (sg.start + t + 1) / a.ratio, r = sg.row0 + t;  // r: the launch's query row
    if (clen <= wk0) continue;  // warp-uniform
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      uint4 af[kGroups];
#pragma unroll
      for (int g = 0; g < kGroups; ++g)
        af[g] = g < G ? frag[((r * MT + m) * kGroups + g) * 32 + lane] : make_uint4(0, 0, 0, 0);
      // Plain loads: frag, qscale and w are written by this step (runtime/pdl.cuh).
      const float4 sq0 = qscale[((r * MT + m) * 2 + 0) * 8 + gq];
      const float4 sq1 = qscale[((r * MT + m) * 2 + 1) * 8 + gq];
      const float sq[2][kGroups] = {{sq0.x, sq0.y, sq0.z, sq0.w}, {sq1.x, sq1.y, sq1.z, sq1.w}};
      const int h0 = m * 16 + gq, h1 = h0 + 8;
      const float w0 = h0 < nI ? a.w[r * nI + h0] : 0.0f, w1 = h1 < nI ? a.w[r * nI + h1] : 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        if (wk0 + 8 * nt >= clen) break;  // warp-uniform
        int32_t acc[kGroups][4];
#pragma unroll
        for (int g = 0; g < kGroups; ++g)
          if (g < G) imma16832(acc[g], af[g], b[nt][g][0], b[nt][g][1]);
        float v[2][2];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float d = __fmul_rn(float(acc[0][2 * r + c]), __fmul_rn(sk[nt][c][0], sq[r][0]));
#pragma unroll
            for (int g = 1; g < kGroups; ++g)
              if (g < G) d = __fmaf_rn(float(acc[g][2 * r + c]), __fmul_rn(sk[nt][c][g], sq[r][g]), d);
            if (a.bf16) d = dev_round_bf16(d);
            float x = __fmul_rn(relu_cpu(d), r == 0 ? w0 : w1);
            if (a.bf16) x = dev_round_bf16(x);
            v[r][c] = x;
          }
        *reinterpret_cast<float2*>(vs + h0 * kLd + 8 * nt + 2 * tig) = make_float2(v[0][0], v[0][1]);
        *reinterpret_cast<float2*>(vs + h1 * kLd + 8 * nt + 2 * tig) = make_float2(v[1][0], v[1][1]);
      }
    }
    __syncwarp();
    const int64_t key = wk0 + lane;
    if (key < clen) {
      float s = 0.0f;
      for (int h = 0; h < nI; ++h) s = __fadd_rn(s, vs[h * kLd + lane]);
      a.scores[sg.off + t * stride + key] = a.bf16 ? dev_round_bf16(s) : s;
    }
    __syncwarp();  // the tile is rewritten by the next row
  }
}

int64_t pad_heads(int64_t nI) { return (nI + 15) / 16; }

// rows_max: the most query rows of one sequence (a.T for one); the grid's z: the sequences.
template <int MT>
cudaError_t launch_imma(const IndexScoreArgs& a, int64_t rows_max, const uint4* frag, const float4* qscale,
                        cudaStream_t s) {
  const int64_t clen_max = (a.segs ? a.stride : a.start + a.T) / a.ratio;
  const int64_t tiles = (clen_max + kBlockKeys - 1) / kBlockKeys, n_segs = a.segs ? a.n_segs : 1;
  // Query rows spread over blockIdx.y until the grid covers ~4 blocks per SM.
  int64_t splits = (4 * int64_t(device_sm_count()) + tiles * n_segs - 1) / (tiles * n_segs);
  splits = splits < 1 ? 1 : splits > rows_max ? rows_max : splits;
  if (splits > 65535) splits = 65535;
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  const size_t smem = size_t(kWarps) * MT * 16 * kLd * sizeof(float);  // a constant of MT
  static std::atomic<uint64_t> smem_done{0};
  if (smem > 48 * 1024) {
    const cudaError_t e =
        ensure_smem_limit(reinterpret_cast<const void*>(index_scores_imma_kernel<MT>), int(smem), smem_done);
    if (e != cudaSuccess) return e;
  }
  return launch_kernel(index_scores_imma_kernel<MT>, dim3(unsigned(tiles), unsigned(splits), unsigned(n_segs)), kThreads,
                       smem, s, a, frag, qscale);
}

}  // namespace

bool index_scores_imma_applies(const IndexScoreArgs& a) {
  return a.q_fp4 && a.key_fmt.codec == RowCodec::kFp4E8m0 && a.key_fmt.block == 32 && a.dI % 32 == 0 &&
         a.dI >= 32 && a.dI <= kMaxDi && a.key_fmt.dim == a.dI && a.key_fmt.coded == a.dI && a.nI >= 1 && a.nI <= 64;
}

size_t index_scores_imma_work_bytes(int64_t T, int64_t nI) {
  const int64_t MT = pad_heads(nI);
  return size_t(T * MT * (kGroups * 32 * 16 + 2 * 8 * kGroups * 4));
}

cudaError_t launch_index_scores_imma(const IndexScoreArgs& a, cudaStream_t s) {
  if (!index_scores_imma_applies(a) || !a.work || a.work_bytes < index_scores_imma_work_bytes(a.T, a.nI) ||
      (reinterpret_cast<uintptr_t>(a.work) & 15) != 0 || (reinterpret_cast<uintptr_t>(a.q) & 15) != 0 ||
      a.T > 65535 * 1024 || (a.segs && (a.n_segs < 1 || a.n_segs > 65535 || a.stride < 1)))
    return cudaErrorInvalidValue;
  const int64_t clen_max = (a.segs ? a.stride : a.start + a.T) / a.ratio;
  if (clen_max <= 0) return cudaSuccess;
  const int64_t rows_max = a.segs && a.seg_rows > 0 && a.seg_rows < a.T ? a.seg_rows : a.T;
  const int MT = int(pad_heads(a.nI));
  uint32_t* frag = static_cast<uint32_t*>(a.work);
  float* qscale = reinterpret_cast<float*>(frag + a.T * MT * kGroups * 128);
  if (a.T > INT32_MAX) return cudaErrorInvalidValue;
  cudaError_t e = launch_kernel(index_q_pack_kernel, dim3(unsigned(a.T), unsigned(MT)), 512, 0, s, a.q, a.nI,
                                int(a.dI), MT, frag, qscale);
  if (e != cudaSuccess) return e;
  const auto* f4 = reinterpret_cast<const uint4*>(frag);
  const auto* s4 = reinterpret_cast<const float4*>(qscale);
  switch (MT) {
    case 1: return launch_imma<1>(a, rows_max, f4, s4, s);
    case 2: return launch_imma<2>(a, rows_max, f4, s4, s);
    case 3: return launch_imma<3>(a, rows_max, f4, s4, s);
    default: return launch_imma<4>(a, rows_max, f4, s4, s);
  }
}

}  // namespace flashseek::ops::cuda::detail
