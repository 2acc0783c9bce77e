// Internal interface between gemv.cpp (checks, Status) and gemv.cu (kernels). Kept free of
// core/status.h: nvcc's host pass cannot compile the fmt headers it pulls in.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashseek::ops::cuda::detail {

struct GemvArgs {
  const float* x;
  // Optional: x already quantised by launch_gemv_quantize (codes [rows, k], scales [rows, k/32]);
  // wide launches then read these instead of quantising x again in every block (same bits).
  const uint8_t* xq;
  const float* xs;
  bool tiled;  // with xq: the tiled kernel may run (else the GEMV's token passes over xq)
  const uint8_t *w, *ws, *wu, *wsu;  // wu/wsu: up matrix (gated) or null
  int64_t e_stride, e_sstride;       // bytes between experts
  const int32_t *group_expert, *group_start, *pair_row;  // group_start null: dense, m tokens
  const float* pair_weight;
  void* y;
  int64_t m;
  int64_t split_groups;  // grouped: groups assumed when choosing the k split (0: n_groups)
  int n, k, w_block, act_block;
  bool bf16_out;
  bool bf16_in;         // x rounded to BF16 (RNE) before its FP8 quantisation (not read with xq)
  bool bf16_round_out;  // y FP32, each value rounded to BF16 (RNE) and widened back (not with bf16_out)
  bool bf16_round_gu;   // gated: the gate and up sums rounded to BF16 (RNE) before the SwiGLU
  float limit;
  // (Last, so that the other fields keep the kernel-parameter offsets they had before.)
  // Stacked matrices (BlockLinearParams::y2): rows [ny, n) go to y2 ([m, n - ny]), rows [0, ny)
  // to y ([m, ny]). y2 null: every row to y ([m, n]), ny unused.
  void* y2;
  int ny;
  // The row count that picks the tuning (pick_tuning) instead of n; 0: n.
  int tune_n;
  // Set by launch_gemv (callers leave it 0): the launch's group count (dense: 1).
  int n_groups;
  // w / wu in the fragment order (ops/fp4_fragments.h; FP4: codes and scales, FP8: codes):
  // BlockLinearParams / ExpertGemvParams::w_packed.
  bool w_packed;
  // FP4 fragment order, decode passes (groups of at most 8 tokens on average) over xq with 2-block
  // chunks: the weights streamed through a shared-memory ring of this many stages by bulk copies
  // (1..8; 0: loaded into registers; the same bits). Where the ring does not apply (alignment,
  // other tunings) the register kernel runs.
  int ring;
};

// Launches the kernel for `n_groups` groups (1 when dense); returns the launch error.
cudaError_t launch_gemv(const GemvArgs& a, int n_groups, bool fp4, cudaStream_t stream);
// Launches of the ring kernel (GemvArgs::ring) since the process started: tests check that the
// ring ran where they expect it.
int64_t gemv_ring_launches();

// x [m, k] FP32 (16-byte aligned, k % 32 == 0, k % act_block == 0) → xq [m, k] e4m3 codes and
// xs [m, k/32] power-of-two scales (per act_block, repeated over its 32-blocks), bit for bit what
// the GEMV computes from x inside its kernel (with bf16_in: from x rounded to BF16 first, as the
// GEMV's GemvArgs::bf16_in does).
cudaError_t launch_gemv_quantize(const float* x, int64_t m, int64_t k, int act_block, bool bf16_in, uint8_t* xq,
                                 float* xs, cudaStream_t stream);

// codes [n, k/2] + scales [n, k/32] (row-major, codes 16-byte aligned) → the fragment order
// (ops/fp4_fragments.h; n % 32 == 0, k % 64 == 0; outputs not overlapping the inputs).
cudaError_t launch_pack_fp4_fragments(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k,
                                      uint8_t* out_codes, uint8_t* out_scales, cudaStream_t stream);
// e4m3 codes [n, k] (8-byte aligned) → the FP8 fragment order (pack) or back (n % 32 == 0,
// k % 32 == 0; out not overlapping codes).
cudaError_t launch_permute_fp8_fragments(const uint8_t* codes, int64_t n, int64_t k, bool pack, uint8_t* out,
                                         cudaStream_t stream);

// Benchmarking and tests only: force the k split (cluster size, clamped to 1..8) and the k blocks
// per warp iteration (1, 2 or 4; V4's act_block 128 always takes 4); 0 / 0 restore the
// automatic choice. Process-wide, not thread-safe.
void set_gemv_tuning(int split, int chunk);

// Process-wide: the FP4 GEMVs' k blocks per warp iteration, 2 or 4; anything else: automatic.
// set_gemv_tuning's chunk, where set, wins.
void set_gemv_fp4_chunk(int chunk);

}  // namespace flashseek::ops::cuda::detail
