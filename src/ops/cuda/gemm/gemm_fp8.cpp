// Host side of the large-M FP8 GEMM: shape, alignment and device checks, Status; kernels live in
// gemm_fp8.cu.
#include "ops/cuda/gemm/gemm_fp8.h"

#include <cstdint>

#include "ops/cuda/runtime/cuda_check.h"
#include "ops/cuda/runtime/device_caps.h"
#include "ops/cuda/gemm/gemm_fp8_kernels.h"

namespace flashseek::ops::cuda {

namespace {
// Default kernel (bench/RESULTS.md, gemm_fp8 sections, H200): kernel 6 (TMA producer warp,
// overlapped promotion, persistent) is the fastest at every benchmarked shape: 514-633 TFLOP/s
// at m = 8192 (1.7-1.9x kernel 4) and 118-138 at m = 128 (1.6-1.8x kernel 3); kernel 8 (the
// same without persistence) ties it at m = 128.
int default_kernel(int64_t /*m*/) { return 6; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The wgmma kernel exists only for compute capability 9.0 (built for sm_90a).
Status check_device() {
  if (detail::current_device_is_sm90a()) return {};
  int dev = 0, major = 0, minor = 0;
  FS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  FS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0)
    return Status(StatusCode::kUnimplemented,
                  "gemm_fp8: the wgmma kernel needs an sm_90a device, this one is sm_" +
                      std::to_string(major * 10 + minor) + " (use block_linear_cuda)");
  return {};
}
}  // namespace

Status gemm_fp8_quantize_cuda(const void* x, ActDtype x_dtype, int64_t m, int64_t k,
                              int64_t act_block, uint8_t* xq, float* xs, cudaStream_t stream,
                              bool f16_codes, bool bf16_round_in, bool bf16_values) {
  if (!x || !xq || !xs) return invalid_argument("gemm_fp8_quantize: x, xq and xs must be set");
  if (f16_codes && bf16_values) return invalid_argument("gemm_fp8_quantize: f16_codes and bf16_values exclude each other");
  if (m <= 0 || k <= 0 || k % 128 != 0)
    return invalid_argument("gemm_fp8_quantize: m={} must be positive, k={} a multiple of 128", m,
                            k);
  if (act_block != 32 && act_block != 128)
    return invalid_argument("gemm_fp8_quantize: act_block={} must be 32 or 128", act_block);
  if (!aligned16(x) || !aligned16(xq) || !aligned16(xs))
    return invalid_argument("gemm_fp8_quantize: x, xq and xs must be 16-byte aligned");
  return cuda_status(detail::launch_quantize_fp8(x, x_dtype == ActDtype::kBf16, m, k,
                                                 int(act_block), xq, xs, stream, f16_codes,
                                                 bf16_round_in && x_dtype == ActDtype::kF32, bf16_values),
                     "gemm_fp8_quantize kernel launch");
}

Status gemm_fp8_cuda(const GemmFp8Params& p, cudaStream_t stream) {
  FS_RETURN_IF_ERROR(validate(p));
  if (!aligned16(p.w) || (p.x && !aligned16(p.x)) ||
      (p.xq && (!aligned16(p.xq) || !aligned16(p.xs))))
    return invalid_argument("gemm_fp8: x/xq/xs and w must be 16-byte aligned");
  FS_RETURN_IF_ERROR(check_device());
  const uint8_t* xq = p.xq;
  const float* xs = p.xs;
  if (p.x) {
    const int64_t need = gemm_fp8_workspace_bytes(p.m, p.k);
    if (!p.workspace || p.workspace_bytes < need || !aligned16(p.workspace))
      return invalid_argument("gemm_fp8: x needs a 16-byte aligned workspace of {} bytes, got {}",
                              need, p.workspace ? p.workspace_bytes : 0);
    auto* ws = static_cast<uint8_t*>(p.workspace);
    auto* q = ws;
    auto* s = reinterpret_cast<float*>(ws + (p.m * p.k + 15) / 16 * 16);
    FS_RETURN_IF_ERROR(gemm_fp8_quantize_cuda(p.x, p.x_dtype, p.m, p.k, p.act_block, q, s, stream));
    xq = q, xs = s;
  }
  detail::GemmFp8Args a{};
  a.xq = xq, a.xs = xs, a.w = p.w, a.ws = p.w_scale, a.y = p.y;
  a.m = int(p.m), a.n = int(p.n), a.k = int(p.k), a.w_block = int(p.w_block);
  a.bf16_out = p.bf16_out, a.bf16_round_out = p.bf16_round_out, a.x_f16 = p.x_f16, a.x_bf16 = p.x_bf16;
  a.w_bf16 = p.w_bf16, a.bf16_direct = p.bf16_direct;
  a.ldx = int(p.x_stride), a.ldy = int(p.y_stride);
  a.variant = p.kernel == 0 || p.x_f16 || p.x_bf16 ? default_kernel(p.m) : p.kernel;
  a.desc_swap = 0, a.skip_promote = 0;
  return cuda_status(detail::launch_gemm_fp8(a, stream), "gemm_fp8 kernel launch");
}

Status gemm_f16_quantize_cuda(const float* x, int64_t m, int64_t k, uint16_t* xq, float* xs, cudaStream_t stream) {
  if (!x || !xq || !xs) return invalid_argument("gemm_f16_quantize: x, xq and xs must be set");
  if (m <= 0 || k <= 0 || k % 32 != 0)
    return invalid_argument("gemm_f16_quantize: m={} must be positive, k={} a multiple of 32", m, k);
  if (!aligned16(x) || !aligned16(xq) || !aligned16(xs))
    return invalid_argument("gemm_f16_quantize: x, xq and xs must be 16-byte aligned");
  return cuda_status(detail::launch_quantize_f16(x, m, k, xq, xs, stream), "gemm_f16_quantize kernel launch");
}

Status gemm_expand_bf16_cuda(const GemmExpandBf16Params& p, cudaStream_t stream) {
  FS_RETURN_IF_ERROR(validate(p));
  const bool fp4 = p.w_format == WeightFormat::kFp4;
  if ((reinterpret_cast<uintptr_t>(p.w) & (fp4 ? 3 : 7)) != 0 || !aligned16(p.y))
    return invalid_argument("gemm_expand_bf16: w must be {}-byte and y 16-byte aligned", fp4 ? 4 : 8);
  FS_RETURN_IF_ERROR(check_device());
  detail::GemmExpandArgs a{};
  a.w = p.w, a.ws = p.w_scale, a.y = p.y, a.count = p.count, a.n = p.n, a.k = p.k;
  a.w_block = int(p.w_block), a.fp4 = fp4, a.row_start = p.row_start, a.fragments = p.w_fragments;
  return cuda_status(detail::launch_expand_bf16(a, stream), "gemm_expand_bf16 kernel launch");
}

Status gemm_bf16_pack_cuda(const float* x, int64_t n, uint16_t* y, cudaStream_t stream) {
  if (!x || !y) return invalid_argument("gemm_bf16_pack: x and y must be set");
  if (n < 0 || n % 4 != 0) return invalid_argument("gemm_bf16_pack: n={} must be a multiple of 4", n);
  if (!aligned16(x) || (reinterpret_cast<uintptr_t>(y) & 7) != 0)
    return invalid_argument("gemm_bf16_pack: x must be 16-byte and y 8-byte aligned");
  return cuda_status(detail::launch_pack_bf16(x, n, y, stream), "gemm_bf16_pack kernel launch");
}

Status gemm_fp8_grouped_cuda(const GemmFp8GroupedParams& p, cudaStream_t stream) {
  FS_RETURN_IF_ERROR(validate(p));
  if (!aligned16(p.xq) || !aligned16(p.xs) || !aligned16(p.w))
    return invalid_argument("gemm_fp8_grouped: xq, xs and w must be 16-byte aligned");
  const bool fp4 = p.w_format == WeightFormat::kFp4 && !p.w_bf16;
  // FP4: the kernel reads a stage's four E8M0 scales of a row as one 4-byte word.
  if (fp4 && (reinterpret_cast<uintptr_t>(p.w_scale) & 3) != 0)
    return invalid_argument("gemm_fp8_grouped: FP4 w_scale must be 4-byte aligned");
  FS_RETURN_IF_ERROR(check_device());
  if (p.rows == 0) return {};
  detail::GemmFp8Args a{};
  a.xq = p.xq, a.xs = p.xs, a.w = p.w, a.ws = p.w_scale, a.y = p.y;
  a.m = int(p.rows), a.n = int(p.n), a.k = int(p.k), a.w_block = int(p.w_block);
  a.bf16_out = p.bf16_out, a.bf16_round_out = p.bf16_round_out, a.variant = 6, a.desc_swap = 0, a.skip_promote = 0;
  a.row_start = p.row_start, a.groups = int(p.groups), a.w_fp4 = fp4 && !p.w_bf16, a.x_f16 = p.x_f16, a.x_bf16 = p.x_bf16;
  a.w_bf16 = p.w_bf16, a.bf16_direct = p.bf16_direct, a.w_in_registers = p.w_in_registers && fp4;
  a.w_fragments = p.w_fragments;
  return cuda_status(detail::launch_gemm_fp8(a, stream), "gemm_fp8_grouped kernel launch");
}

}  // namespace flashseek::ops::cuda
