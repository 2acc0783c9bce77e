// Host side of the small-M GEMV launchers: shape checks and Status; kernels live in gemv.cu.
#include "ops/cuda/gemv/gemv.h"

#include "ops/cuda/runtime/cuda_check.h"
#include "ops/cuda/gemv/gemv_kernels.h"
#include "ops/fp4_fragments.h"

namespace flashseek::ops::cuda {

namespace {
Status check_int_dims(const char* op, int64_t n, int64_t k) {
  if (n >= (int64_t(1) << 30) || k >= (int64_t(1) << 30))
    return out_of_range("{}: n={} or k={} beyond 2^30", op, n, k);
  return {};
}
}  // namespace

Status gemv_quantize_cuda(const float* x, int64_t m, int64_t k, int64_t act_block, bool bf16_in, uint8_t* xq,
                          float* xs, cudaStream_t stream) {
  if (!x || !xq || !xs) return invalid_argument("gemv_quantize: x, xq and xs must be set");
  if (m <= 0 || k <= 0 || k % 32 != 0) return invalid_argument("gemv_quantize: m={}, k={} (k a multiple of 32)", m, k);
  if (act_block != 32 && act_block != 128) return invalid_argument("gemv_quantize: act_block={} must be 32 or 128", act_block);
  if (k % act_block != 0) return invalid_argument("gemv_quantize: k={} is not a multiple of act_block {}", k, act_block);
  if ((reinterpret_cast<uintptr_t>(x) & 15) || (reinterpret_cast<uintptr_t>(xq) & 7) || (reinterpret_cast<uintptr_t>(xs) & 3))
    return invalid_argument("gemv_quantize: x must be 16-byte, xq 8-byte and xs 4-byte aligned");
  if (m >= (int64_t(1) << 31) / 32) return out_of_range("gemv_quantize: m={} too large", m);
  return cuda_status(detail::launch_gemv_quantize(x, m, k, int(act_block), bf16_in, xq, xs, stream),
                     "gemv_quantize kernel launch");
}

Status block_linear_cuda(const BlockLinearParams& p, cudaStream_t stream) {
  FS_RETURN_IF_ERROR(validate(p));
  FS_RETURN_IF_ERROR(check_int_dims("block_linear", p.n, p.k));
  // Stacked matrices: decode-sized launches of one FP8 matrix only (the GEMV's one-pass kernels
  // carry the split store; wider launches run the two matrices alone with tune_n, the same bits).
  if (p.y2 && (p.format != WeightFormat::kFp8 || p.w_up || p.xq || p.m > kStackedLinearMaxRows))
    return invalid_argument("block_linear: a stacked launch (y2) takes one FP8 matrix, at most {} token rows and "
                            "no pre-quantised x (m={})", kStackedLinearMaxRows, p.m);
  detail::GemvArgs a{};
  a.x = p.x, a.w = p.w, a.ws = p.w_scale, a.y = p.y, a.m = p.m;
  a.n = int(p.n), a.k = int(p.k), a.w_block = int(p.w_block), a.act_block = int(p.act_block);
  a.bf16_out = p.bf16_out, a.bf16_in = p.bf16_in, a.bf16_round_out = p.bf16_round_out;
  a.wu = p.w_up, a.wsu = p.w_up_scale, a.limit = p.swiglu_limit, a.bf16_round_gu = p.bf16_round_gate_up;
  a.xq = p.xq, a.xs = p.xs, a.tiled = p.tiled;
  a.y2 = p.y2, a.ny = int(p.n - p.n2), a.tune_n = int(p.tune_n), a.w_packed = p.w_packed;
  return cuda_status(detail::launch_gemv(a, 1, p.format == WeightFormat::kFp4, stream),
                     "block_linear kernel launch");
}

Status expert_gemv_cuda(const ExpertGemvParams& p, cudaStream_t stream) {
  FS_RETURN_IF_ERROR(validate(p));
  FS_RETURN_IF_ERROR(check_int_dims("expert_gemv", p.n, p.k));
  detail::GemvArgs a{};
  a.x = p.x, a.w = p.w, a.ws = p.w_scale, a.wu = p.w_up, a.wsu = p.w_up_scale;
  a.e_stride = p.expert_stride, a.e_sstride = p.expert_scale_stride;
  a.group_expert = p.group_expert, a.group_start = p.group_start, a.pair_row = p.pair_row;
  a.pair_weight = p.pair_weight, a.y = p.y, a.m = p.n_pairs;
  a.n = int(p.n), a.k = int(p.k), a.w_block = int(p.w_block), a.act_block = int(p.act_block);
  a.limit = p.swiglu_limit;
  a.split_groups = p.split_groups;
  a.bf16_round_out = p.bf16_round_out, a.bf16_round_gu = p.bf16_round_gate_up;
  a.xq = p.xq, a.xs = p.xs, a.tiled = p.tiled, a.w_packed = p.w_packed, a.ring = p.ring_stages;
  return cuda_status(detail::launch_gemv(a, int(p.n_groups), p.format == WeightFormat::kFp4, stream),
                     "expert_gemv kernel launch");
}

Status pack_fp4_fragments_cuda(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k, uint8_t* out_codes,
                               uint8_t* out_scales, cudaStream_t stream) {
  if (!codes || !scales || !out_codes || !out_scales)
    return invalid_argument("pack_fp4_fragments_cuda: codes, scales and both outputs must be set");
  if (!fp4_fragment_shape_ok(n, k))
    return invalid_argument("pack_fp4_fragments_cuda: n={} must be a positive multiple of 32 and k={} of 64", n, k);
  if ((reinterpret_cast<uintptr_t>(codes) | reinterpret_cast<uintptr_t>(out_codes)) % 16 != 0)
    return invalid_argument("pack_fp4_fragments_cuda: codes must be 16-byte aligned");
  const uintptr_t cb = uintptr_t(n * (k / 2)), sb = uintptr_t(n * (k / 32));
  auto overlap = [](const void* a, uintptr_t na, const void* b, uintptr_t nb) {
    return uintptr_t(a) < uintptr_t(b) + nb && uintptr_t(b) < uintptr_t(a) + na;
  };
  if (overlap(codes, cb, out_codes, cb) || overlap(scales, sb, out_scales, sb) || overlap(out_codes, cb, out_scales, sb))
    return invalid_argument("pack_fp4_fragments_cuda: the outputs overlap the inputs or each other");
  return cuda_status(detail::launch_pack_fp4_fragments(codes, scales, n, k, out_codes, out_scales, stream),
                     "pack_fp4_fragments kernel launch");
}

namespace {
Status permute_fp8(const char* what, const uint8_t* codes, int64_t n, int64_t k, bool pack, uint8_t* out,
                   cudaStream_t stream) {
  FS_RETURN_IF_ERROR(check_fp8_fragment_args(what, codes, n, k, out));
  if ((reinterpret_cast<uintptr_t>(codes) | reinterpret_cast<uintptr_t>(out)) % 8 != 0)
    return invalid_argument("{}: codes must be 8-byte aligned", what);
  return cuda_status(detail::launch_permute_fp8_fragments(codes, n, k, pack, out, stream), what);
}
}  // namespace

Status pack_fp8_fragments_cuda(const uint8_t* codes, int64_t n, int64_t k, uint8_t* out_codes, cudaStream_t stream) {
  return permute_fp8("pack_fp8_fragments_cuda", codes, n, k, true, out_codes, stream);
}

Status unpack_fp8_fragments_cuda(const uint8_t* codes, int64_t n, int64_t k, uint8_t* out_codes, cudaStream_t stream) {
  return permute_fp8("unpack_fp8_fragments_cuda", codes, n, k, false, out_codes, stream);
}

void set_gemv_fp4_chunk(int chunk) { detail::set_gemv_fp4_chunk(chunk); }

}  // namespace flashseek::ops::cuda
