// The CUDA backend ops of the model flow (forward/backend.h; the CPU twins are CpuOps in
// forward/cpu_backend.cpp): every op is a kernel launch on the model's stream over device memory,
// weights as stored (or FP32 copies with --gpu-weights fp32), and the per-sequence device state
// (window rings, compressed KV, index keys, compressor partial groups).
#include "backends/cuda/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include <algorithm>
#include <cmath>

#include "backends/cuda/gpu_impl.h"
#include "forward/memory_plan.h"
#include "ops/cuda/cache/cache_rows.h"
#include "ops/cuda/gemm/gemm_fp8.h"
#include "ops/cuda/gemv/gemv.h"
#include "ops/cuda/indexer/index_imma.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/prefill_kernels.h"
#include "ops/cuda/model/small_kernels.h"

namespace flashseek::forward::gpu {
namespace cd = ops::cuda::detail;
constexpr int64_t kMaxGemvGroups = 65535;  // expert_gemv's grid limit (grid.y)

namespace {
cd::QuantSim to_cd(QuantSim k) {
  switch (k) {
    case QuantSim::kBf16: return cd::QuantSim::kBf16;
    case QuantSim::kFp8: return cd::QuantSim::kFp8;
    case QuantSim::kFp4E8m0: return cd::QuantSim::kFp4E8m0;
    case QuantSim::kFp4E4m3: return cd::QuantSim::kFp4E4m3;
  }
  return cd::QuantSim::kBf16;
}
}  // namespace

FlowParams GpuModel::flow_params() const { return make_flow_params(config(), w_, numerics_); }

Result<GpuModel::FfnDev> GpuModel::ffn_dev(const FfnWeights& F) const {
  for (size_t l = 0; l < w_.layers.size(); ++l)
    if (&w_.layers[l].ffn == &F) return FfnDev{&experts_[l], tid2eid_[l].get()};
  for (size_t s = 0; s < w_.dspark.stages.size() && s < dexperts_.size(); ++s)
    if (&w_.dspark.stages[s].ffn == &F) return FfnDev{&dexperts_[s], dtid2eid_[s].get()};
  if (w_.has_mtp && &w_.mtp.block.ffn == &F && mexperts_[0]) return FfnDev{&mexperts_, mtid2eid_.get()};  // gpu_mtp.cpp
  return internal_error("gpu: an FFN without device experts");
}

// ---- memory ----

Result<Tensor> GpuModel::scratch(const std::string& name, ElemType type, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) return invalid_argument("scratch {}: negative shape [{}, {}]", name, rows, cols);
  FS_ASSIGN_OR_RETURN(uint8_t* p, scratch<uint8_t>(name, rows * cols * int64_t(elem_size(type))));
  return Tensor{p, type, rows, cols};
}

Status GpuModel::copy(const Tensor& dst, const Tensor& src, size_t bytes) {
  if (bytes && dst.data != src.data)
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(dst.data, src.data, bytes, cudaMemcpyDeviceToDevice, stream_));
  return {};
}

Status GpuModel::copy_rows(const Tensor& dst, int64_t dst_stride, const Tensor& src, int64_t src_stride, int64_t rows,
                           int64_t cols) {
  const size_t es = elem_size(dst.type);
  if (rows > 0)
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy2d_async(dst.data, size_t(dst_stride) * es, src.data,
                                                      size_t(src_stride) * es, size_t(cols) * es, size_t(rows),
                                                      cudaMemcpyDeviceToDevice, stream_));
  return {};
}

Status GpuModel::zero(const Tensor& t) {
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memset_async(t.data, 0, t.bytes(), stream_));
  return {};
}

Status GpuModel::download_now(void* host, const Tensor& src, size_t bytes) {
  if (capture_guard().active) return internal_error("gpu: a synchronous download inside a graph capture");
  if (bytes) FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(host, src.data, bytes, cudaMemcpyDeviceToHost, stream_));
  FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return {};
}

// ---- row-wise math ----

Status GpuModel::embed(const Vec& table, const Tensor& tokens, const Tensor& X, int64_t T, int64_t hc, int64_t D) {
  return embed_rows(d(table), tokens.i32(), X.f32(), T, hc, D);
}

// The BF16 tensor-core linear (kernel 5) takes BF16-valued inputs only for wide matrices (the LM
// head): its CTAs of 16 outputs leave most SMs idle on the compressor and indexer projections
// (16-1024 outputs), which keep the exactness kernel at decode (a choice by shape only, so rows
// stay batch-invariant).
constexpr int64_t kTensorCoreLinearMinOut = 4096;

Status GpuModel::linear(const LinearCall& c) {
  FS_ASSIGN_OR_RETURN(const bool done, linear_gemm(c));
  if (done) return {};
  return linear(c.x.f32(), d(*c.w), c.rows, c.in, c.out, c.y.f32(), c.act_block, c.bf16_out, c.bf16_in, nullptr, 1,
                c.x_bf16 && c.out >= kTensorCoreLinearMinOut);
}

// wq_a + wkv stacked at load (GpuModel::stack_query_kv): one block-scaled GEMV launch over the
// stacked matrix, wq_a's rows to a.y and wkv's to b.y, for decode-sized steps (at most
// ops::kStackedLinearMaxRows rows, x quantised inside the launch). Wider steps (prefill chunks, many
// sequences) run the two matrices alone, in the same summation order (tune_n), as do two calls
// that differ in anything but matrix and output.
Result<bool> GpuModel::linear_pair(const LinearCall& a, const LinearCall& b) {
  if (!a.w || !b.w || a.rows > ops::kStackedLinearMaxRows || a.rows >= gemv_prequant_min_rows_ ||
      dense_gemm_takes_rows(a.rows))
    return false;
  const NativeMatrix* na = native(d(*a.w));
  const NativeMatrix* nb = native(d(*b.w));
  if (!na || !nb || na->stacked_with != nb || !na->fast || !nb->fast) return false;
  if (a.x.data != b.x.data || a.rows != b.rows || a.in != b.in || a.act_block != b.act_block ||
      a.bf16_out != b.bf16_out || a.bf16_in != b.bf16_in || a.act_block != na->act_block || a.in != na->k ||
      a.out != na->n || b.out != nb->n)
    return false;
  ops::BlockLinearParams p;
  p.x = a.x.f32(), p.w = na->cptr(), p.w_scale = na->sptr(), p.y = a.y.f32();
  p.y2 = b.y.f32(), p.n2 = nb->n, p.tune_n = na->tune_n;
  p.m = a.rows, p.n = na->n + nb->n, p.k = a.in, p.format = na->format, p.w_block = na->w_block;
  p.act_block = a.act_block, p.bf16_in = a.bf16_in, p.bf16_round_out = a.bf16_out;
  FS_RETURN_IF_ERROR(ops::cuda::block_linear_cuda(p, stream_));
  ++gstats_.paired_linears;
  return true;
}

// The prefill GEMM of a BF16 matrix over BF16-valued inputs (the compressor's and the indexer's
// projections in reference numerics: LinearCall::x_bf16 or bf16_in): rows [dense_row0_, T) packed
// to BF16 (exact, or the bf16_in rounding) through gemm_fp8_cuda with w_bf16 (the exact products
// summed in FP32: 32-block partial sums on the tensor core, or with prefill_gemm_direct the whole
// of k there); rows before it through the exactness kernel as at decode.
Result<bool> GpuModel::linear_gemm_bf16(const LinearCall& c, const NativeMatrix& nw) {
  if (c.act_block != 0 || !(c.x_bf16 || c.bf16_in)) return false;
  if (nw.dtype != cd::WeightDtype::kBf16 || nw.count != 1 || nw.k != c.in || nw.n != c.out || c.in % 128 != 0)
    return false;
  const int64_t r0 = dense_row0_, m = c.rows - r0, in = c.in, out = c.out;
  if (r0 > 0)
    FS_RETURN_IF_ERROR(linear(c.x.f32(), d(*c.w), r0, in, out, c.y.f32(), 0, c.bf16_out, c.bf16_in, nullptr, 1,
                              c.x_bf16 && out >= kTensorCoreLinearMinOut));
  FS_ASSIGN_OR_RETURN(uint8_t* xb, scratch<uint8_t>("dense_gemm_xb", m * in * 2));  // BF16 values
  FS_RETURN_IF_ERROR(ops::cuda::gemm_bf16_pack_cuda(c.x.f32() + r0 * in, m * in, reinterpret_cast<uint16_t*>(xb), stream_));
  ops::GemmFp8Params g;
  g.xq = xb, g.x_bf16 = true, g.w_bf16 = true, g.bf16_direct = prefill_gemm_direct_;
  g.w = nw.cptr(), g.y = c.y.f32() + r0 * out, g.bf16_round_out = c.bf16_out;
  g.m = m, g.n = out, g.k = in;
  FS_RETURN_IF_ERROR(ops::cuda::gemm_fp8_cuda(g, stream_));
  ++gstats_.dense_gemm_linears;
  return true;
}

// The prefill FP8 GEMM (GpuLoadOptions::dense_gemm_min_tokens) of a step's token linear: rows
// [dense_row0_, T) belong to sequences with enough rows and run through gemm_fp8_cuda in its
// x_f16 mode (x quantised once with f16 codes, BF16 input / output roundings as the GEMV does
// them); rows [0, dense_row0_) through the kernel decode uses (the GEMV, or the exactness kernel
// for the draft's matrices), so each sequence's numbers depend only on its own row count.
Result<bool> GpuModel::linear_gemm(const LinearCall& c) {
  if (!dense_gemm_takes_rows(c.rows) || !c.w) return false;
  switch (c.key.op) {  // the FP8-activation linears over the step's token rows
    case DotOp::kWqA: case DotOp::kWqB: case DotOp::kWkv: case DotOp::kWoB: case DotOp::kIdxWqB:
    case DotOp::kEngramWkv: case DotOp::kMainProj:  // kMainProj, the DSpark stages' kWkv: the draft rings' writes
      break;
    case DotOp::kW1: case DotOp::kW2: case DotOp::kW3:
      if (c.key.expert >= 0) return false;  // routed experts: moe_native
      break;
    default:
      if (const NativeMatrix* nb = native(d(*c.w)); nb && !nb->fast) return linear_gemm_bf16(c, *nb);
      return false;
  }
  const NativeMatrix* nw = native(d(*c.w));
  if (!nw || nw->format != ops::WeightFormat::kFp8 || nw->count != 1) return false;
  // The block-scaled GEMVs' matrices (fast), or FP8 matrices that decode runs through the exactness
  // kernels (the DSpark draft's main_proj and wkv, act_block 0) in the GEMM's tile-scale layout.
  if (nw->fast ? c.act_block != nw->act_block
               : nw->dtype != cd::WeightDtype::kFp8 || nw->block_rows != nw->w_block || nw->block_cols != nw->w_block ||
                     nw->code_bytes != ops::weight_code_bytes(nw->format, nw->n, nw->k) ||
                     nw->scale_bytes != ops::weight_scale_bytes(nw->format, nw->n, nw->k, nw->w_block))
    return false;
  if (c.in != nw->k || c.out != nw->n || c.in % 128 != 0) return false;
  if (c.act_block != 32 && c.act_block != 128) return false;
  if (nw->w_block != 32 && nw->w_block != 128) return false;
  const int64_t r0 = dense_row0_, m = c.rows - r0, in = c.in, out = c.out;
  if (r0 > 0 && nw->fast)
    FS_RETURN_IF_ERROR(linear_native(*nw, c.x.f32(), r0, in, out, c.y.f32(), c.act_block, c.bf16_out, c.bf16_in,
                                     nullptr, 1));
  if (r0 > 0 && !nw->fast)  // the exactness kernel, as these rows run at decode
    FS_RETURN_IF_ERROR(linear(c.x.f32(), d(*c.w), r0, in, out, c.y.f32(), c.act_block, c.bf16_out, c.bf16_in, nullptr, 1));
  constexpr int64_t kValueBytes = 2;  // f16 values of the e4m3 codes, or BF16 values code · scale
  const bool bv = prefill_gemm_bf16_;
  FS_ASSIGN_OR_RETURN(uint8_t* xq, scratch<uint8_t>("dense_gemm_xq", m * in * kValueBytes));
  FS_ASSIGN_OR_RETURN(float* xs, scratch<float>("dense_gemm_xs", m * (in / 32)));
  FS_RETURN_IF_ERROR(ops::cuda::gemm_fp8_quantize_cuda(c.x.f32() + r0 * in, ops::ActDtype::kF32, m, in, c.act_block,
                                                       xq, xs, stream_, /*f16_codes=*/!bv,
                                                       /*bf16_round_in=*/c.bf16_in, /*bf16_values=*/bv));
  ops::GemmFp8Params g;
  g.xq = xq, g.xs = bv ? nullptr : xs, g.x_f16 = !bv, g.x_bf16 = bv, g.bf16_direct = bv && prefill_gemm_direct_;
  FS_ASSIGN_OR_RETURN(g.w, row_major_codes(*nw, "dense_gemm_wrows"));  // GpuLoadOptions::fp8_fragments
  g.w_scale = nw->sptr();
  if (prefill_gemm_expand_w_) {
    FS_ASSIGN_OR_RETURN(g.w, expand_weight(*nw, 0, 1, nullptr, "dense_gemm_wexp", g.w));
    g.w_scale = nullptr, g.w_bf16 = true;
  }
  g.y = c.y.f32() + r0 * out, g.bf16_round_out = c.bf16_out;
  g.m = m, g.n = out, g.k = in, g.w_block = nw->w_block, g.act_block = c.act_block;
  FS_RETURN_IF_ERROR(ops::cuda::gemm_fp8_cuda(g, stream_));
  ++gstats_.dense_gemm_linears;
  return true;
}

Status GpuModel::grouped_linear(const Tensor& x, const Vec& w, int64_t rows, int64_t groups, int64_t in, int64_t out,
                                const Tensor& z, bool bf16) {
  const int64_t width = groups * in;
  // Rows [r_gemm, rows): the sequences that take the prefill GEMMs (dense_gemm_min_tokens, as
  // linear_gemm) with a stored FP8 matrix: the x_f16 GEMM per group on x's f16 block codes (exact
  // for BF16 values), the same products in another FP32 order.
  const NativeMatrix* nw = native(d(w));
  int64_t r_gemm = rows;
  if (bf16 && dense_gemm_min_tokens_ > 0 && sm90a_ && rows == step_rows_ && dense_row0_ < rows && nw &&
      nw->dtype == cd::WeightDtype::kFp8 && nw->count == 1 && nw->block_rows == nw->block_cols &&
      (nw->block_rows == 32 || nw->block_rows == 128) && nw->k == in && nw->n == groups * out && in % 128 == 0 &&
      out % nw->block_rows == 0 && nw->scale_bytes == (nw->n / nw->block_rows) * (in / nw->block_rows))
    r_gemm = dense_row0_;
  // BF16 inputs (the reference's BF16 GEMM): x holds BF16 values already (Backend::grouped_linear:
  // the attention output after its BF16 inverse RoPE), which the exactness and tensor-core
  // linears and the f16 / BF16 GEMM codes below take exactly, so no rounding pass.
  if (r_gemm > 0) {
    // One launch for every group: group g uses rows [g·out, (g+1)·out) of the FP32 copy or the
    // stored matrix.
    cd::LinearArgs la;
    la.x = x.f32(), la.x_stride = width, la.x_group = in;
    la.y = z.f32(), la.y_stride = groups * out, la.y_group = out;
    la.rows = r_gemm, la.in = in, la.out = out, la.bf16_out = bf16, la.groups = groups;
    la.x_bf16 = bf16 && tensor_core_linears_;  // BF16 values: the BF16 tensor-core linear applies (kernel 5)
    la.mma_decode_tiles = mma_decode_tiles_;
    set_weight(la, d(w), 0);
    FS_CUDA_RETURN_IF_ERROR(cd::launch_linear(la, stream_));
  }
  if (r_gemm < rows) {
    // x_bf16: x packed to BF16 (exact); x_f16: f16 block codes of x (exact for BF16 values).
    const int64_t m = rows - r_gemm, wb = nw->block_rows;
    const bool bv = prefill_gemm_bf16_;
    FS_ASSIGN_OR_RETURN(uint8_t* xq, scratch<uint8_t>("grouped_gemm_xq", m * width * 2));
    FS_ASSIGN_OR_RETURN(float* xs, scratch<float>("grouped_gemm_xs", m * (width / 32)));
    if (bv)
      FS_RETURN_IF_ERROR(ops::cuda::gemm_bf16_pack_cuda(x.f32() + r_gemm * width, m * width,
                                                        reinterpret_cast<uint16_t*>(xq), stream_));
    else
      FS_RETURN_IF_ERROR(ops::cuda::gemm_f16_quantize_cuda(x.f32() + r_gemm * width, m, width,
                                                           reinterpret_cast<uint16_t*>(xq), xs, stream_));
    FS_ASSIGN_OR_RETURN(const uint8_t* w_rows, row_major_codes(*nw, "dense_gemm_wrows"));
    const uint8_t* wexp = nullptr;  // prefill_gemm_expand_w: the whole matrix in BF16, group g from row g · out
    if (prefill_gemm_expand_w_) {
      FS_ASSIGN_OR_RETURN(wexp, expand_weight(*nw, 0, 1, nullptr, "dense_gemm_wexp", w_rows));
    }
    for (int64_t g = 0; g < groups; ++g) {
      ops::GemmFp8Params p;
      p.xq = xq + g * in * 2, p.xs = bv ? nullptr : xs + g * (in / 32), p.x_f16 = !bv, p.x_bf16 = bv;
      p.bf16_direct = bv && prefill_gemm_direct_;
      p.x_stride = width;
      p.w = w_rows + g * out * in, p.w_scale = nw->sptr() + (g * out / wb) * (in / wb);
      if (wexp) p.w = wexp + g * out * in * 2, p.w_scale = nullptr, p.w_bf16 = true;
      p.y = z.f32() + r_gemm * groups * out + g * out, p.y_stride = groups * out, p.bf16_round_out = bf16;
      p.m = m, p.n = out, p.k = in, p.w_block = wb, p.act_block = 32;
      FS_RETURN_IF_ERROR(ops::cuda::gemm_fp8_cuda(p, stream_));
    }
    ++gstats_.dense_gemm_linears;
  }
  return {};
}

Status GpuModel::rms_norm(const Tensor& x, const Vec* w, const Tensor& y, int64_t rows, int64_t dim, float eps,
                          bool bf16) {
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(x.f32(), w ? d(*w) : nullptr, y.f32(), rows, dim, eps, bf16, stream_));
  return {};
}

Status GpuModel::rms_norm_bf16_heads(const Tensor& x, int64_t rows, int64_t dim, float eps) {
  FS_CUDA_RETURN_IF_ERROR(cd::launch_rms_norm_bf16_heads(x.f32(), rows, dim, eps, stream_));
  return {};
}

Status GpuModel::rope(const Tensor& x, const Tensor& pos, const Vec& inv_freq, int64_t rows, int64_t n_vec,
                      int64_t vec, int64_t rope_dim, bool inverse, bool bf16) {
  FS_CUDA_RETURN_IF_ERROR(
      cd::launch_rope(x.f32(), pos.i64(), d(inv_freq), rows, n_vec, vec, rope_dim, inverse, bf16, stream_));
  return {};
}

Status GpuModel::quant_sim(const Tensor& x, int64_t rows, int64_t cols, int64_t prefix, int64_t block, QuantSim kind) {
  FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(x.f32(), rows, cols, prefix, block, to_cd(kind), stream_));
  return {};
}

// One launch where the kernel takes the shape (ops/cuda/model/small_kernels.h), else the three ops.
Status GpuModel::norm_rope_quant(const NormRopeQuantCall& c) {
  if (!row_fusion_ || !c.inv_freq || !cd::norm_rope_quant_supports(c.x.f32(), c.dim, c.rope_dim, c.quant_prefix,
                                                                  c.quant_block))
    return Backend::norm_rope_quant(c);
  const float* w = c.w ? d(*c.w) : nullptr;
  if (w && (reinterpret_cast<uintptr_t>(w) & 15) != 0) return Backend::norm_rope_quant(c);
  FS_CUDA_RETURN_IF_ERROR(cd::launch_norm_rope_quant(c.x.f32(), w, c.pos.i64(), d(*c.inv_freq), c.rows, c.dim,
                                                     c.rope_dim, c.eps, c.bf16, c.quant_prefix, c.quant_block,
                                                     stream_));
  return {};
}

Status GpuModel::hadamard(const Tensor& x, int64_t rows, int64_t dim) {
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hadamard(x.f32(), rows, dim, stream_));
  return {};
}

Status GpuModel::scale(const Tensor& x, int64_t n, float s, bool bf16) {
  FS_CUDA_RETURN_IF_ERROR(cd::launch_scale(x.f32(), n, s, bf16, stream_));
  return {};
}

Status GpuModel::add_ape(const Tensor& z, const Vec& ape, const Tensor& pos, int64_t rows, int64_t width,
                         int64_t ratio) {
  FS_CUDA_RETURN_IF_ERROR(cd::launch_add_ape(z.f32(), d(ape), pos.i64(), rows, width, ratio, stream_));
  return {};
}

Status GpuModel::hc_mixes(const HcMixCall& c) {
  cd::HcMixArgs m;
  m.x = c.x.f32(), m.fn = d(*c.fn), m.base = d(*c.base), m.scale = d(*c.scale), m.rows = c.rows, m.hc = c.hc;
  m.dim = c.dim, m.norm_eps = c.norm_eps, m.hc_eps = c.hc_eps, m.sinkhorn_iters = c.sinkhorn_iters;
  m.pre = c.pre.f32(), m.post = c.post.f32(), m.comb = c.comb.f32();
  FS_ASSIGN_OR_RETURN(m.work, scratch<float>("hc_mix_work", cd::hc_mixes_work_floats(m)));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_mixes(m, stream_));
  return {};
}

Status GpuModel::hc_head_pre(const HcMixCall& c) {
  cd::HcMixArgs a;
  a.x = c.x.f32(), a.fn = d(*c.fn), a.base = d(*c.base), a.scale = d(*c.scale);
  a.rows = c.rows, a.hc = c.hc, a.dim = c.dim, a.norm_eps = c.norm_eps, a.hc_eps = c.hc_eps, a.head_only = true;
  a.pre = c.pre.f32();
  FS_ASSIGN_OR_RETURN(a.work, scratch<float>("hc_mix_work", cd::hc_mixes_work_floats(a)));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_mixes(a, stream_));
  return {};
}

Status GpuModel::hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& y, int64_t rows, int64_t hc,
                             int64_t dim, bool bf16) {
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_collapse(X.f32(), pre.f32(), y.f32(), rows, hc, dim, bf16, stream_));
  return {};
}

Status GpuModel::hc_collapse_norm(const Tensor& X, const Tensor& pre, const Vec* w, const Tensor& u,
                                  const Tensor& y, int64_t rows, int64_t hc, int64_t dim, float eps, bool bf16) {
  if (!collapse_norm_fusion_ || !cd::hc_collapse_norm_supported(hc, dim))
    return Backend::hc_collapse_norm(X, pre, w, u, y, rows, hc, dim, eps, bf16);
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_collapse_norm(X.f32(), pre.f32(), w ? d(*w) : nullptr, y.f32(), rows, hc, dim,
                                                      eps, bf16, stream_));
  ++gstats_.collapse_norm_fused;
  return {};
}

Status GpuModel::hc_post(const Tensor& f, const Tensor& X, const Tensor& post, const Tensor& comb, int64_t rows,
                         int64_t hc, int64_t dim, bool bf16) {
  FS_CUDA_RETURN_IF_ERROR(
      cd::launch_hc_post(f.f32(), X.f32(), post.f32(), comb.f32(), rows, hc, dim, bf16, stream_));
  return {};
}

bool GpuModel::fuses_post_mixes(int64_t rows) const {
  return post_mixes_fusion_ && rows >= 1 && rows <= kGpuGraphMaxTokens && on_lane_ < 0;
}

// One launch where the kernel takes the call (cd::hc_post_mixes_supported); false: not taken.
// `combine` (optional): f is that MoE combine (moe_combine_post's), else `f`.
Result<bool> GpuModel::post_mixes_launch(const Tensor& f, const MoeCombineCall* combine, const Tensor& X,
                                         const Tensor& post, const Tensor& comb, int64_t rows, int64_t hc, int64_t dim,
                                         bool bf16, const HcMixCall& next) {
  if (!fuses_post_mixes(rows) || next.rows != rows || next.hc != hc || next.dim != dim || next.x.data != X.data)
    return false;
  cd::HcPostMixArgs p;
  p.x = X.f32(), p.post = post.f32(), p.comb = comb.f32(), p.bf16 = bf16;
  if (combine) {
    if (!row_fusion_ || combine->T != rows || combine->D != dim) return false;
    p.y = combine->ybuf.f32(), p.ys = combine->ys.f32(), p.out = combine->out.f32(), p.K = combine->K;
    p.row_of = combine->row_of.empty() ? nullptr : combine->row_of.i32(), p.combine_bf16 = combine->bf16;
  } else {
    p.f = f.f32();
  }
  cd::HcMixArgs& m = p.mix;
  m.x = X.f32(), m.fn = d(*next.fn), m.base = d(*next.base), m.scale = d(*next.scale), m.rows = rows, m.hc = hc;
  m.dim = dim, m.norm_eps = next.norm_eps, m.hc_eps = next.hc_eps, m.sinkhorn_iters = next.sinkhorn_iters;
  m.pre = next.pre.f32(), m.post = next.post.f32(), m.comb = next.comb.f32();
  p.tickets = hcpm_tickets_.get();
  const int64_t n_tickets = int64_t(hcpm_tickets_.capacity());
  FS_ASSIGN_OR_RETURN(p.work, scratch<float>("hc_post_mix_work", cd::hc_post_mixes_work_floats(rows, dim)));
  if (!cd::hc_post_mixes_supported(p, n_tickets)) return false;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_post_mixes(p, n_tickets, stream_));
  ++gstats_.post_mixes_fused;
  return true;
}

Status GpuModel::hc_post_mixes(const Tensor& f, const Tensor& X, const Tensor& post, const Tensor& comb, int64_t rows,
                               int64_t hc, int64_t dim, bool bf16, const HcMixCall& next) {
  FS_ASSIGN_OR_RETURN(const bool fused, post_mixes_launch(f, nullptr, X, post, comb, rows, hc, dim, bf16, next));
  return fused ? Status{} : Backend::hc_post_mixes(f, X, post, comb, rows, hc, dim, bf16, next);
}

Status GpuModel::moe_combine_post_mixes(const MoeCombineCall& c, const Tensor& X, const Tensor& post,
                                        const Tensor& comb, int64_t hc, bool bf16, const HcMixCall& next) {
  FS_ASSIGN_OR_RETURN(const bool fused, post_mixes_launch(c.out, &c, X, post, comb, c.T, hc, c.D, bf16, next));
  return fused ? Status{} : Backend::moe_combine_post_mixes(c, X, post, comb, hc, bf16, next);
}

// The mean is an hc collapse with weights 1/hc (exactly the CPU's sum / hc when hc is a power of
// two), into a [rows, dim] buffer, then copied to rows of stride y_stride.
Status GpuModel::hc_mean(const Tensor& X, const Tensor& y, int64_t y_stride, int64_t rows, int64_t hc, int64_t dim,
                         bool bf16) {
  FS_ASSIGN_OR_RETURN(float* w, scratch<float>("hc_mean_w", rows * hc));
  FS_ASSIGN_OR_RETURN(float* m, scratch<float>("hc_mean", rows * dim));
  const std::vector<float> mean(size_t(rows * hc), 1.0f / float(hc));
  FS_RETURN_IF_ERROR(upload(w, mean.data(), mean.size() * 4));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_collapse(X.f32(), w, m, rows, hc, dim, bf16, stream_));
  return copy_rows(y, y_stride, Tensor{m, ElemType::kF32, rows, dim}, dim, rows, dim);
}

Status GpuModel::swiglu(const Tensor& g, const Tensor& u, const Tensor& h, const Tensor& weights, int64_t rows,
                        int64_t inter, float limit, bool bf16) {
  FS_CUDA_RETURN_IF_ERROR(
      cd::launch_swiglu(g.f32(), u.f32(), h.f32(), weights.empty() ? nullptr : weights.f32(), rows, inter, limit, bf16,
                        stream_));
  return {};
}

// The shared expert's gate and up as one gated GEMV (ops::BlockLinearParams::w_up): the sums of
// the two linear_native launches, rounded as they round them, and the swiglu kernel's SwiGLU, in
// one pass over both matrices. Steps whose rows take the prefill GEMM (linear_gemm), and matrices
// the GEMV does not run, go the unfused way.
Status GpuModel::gated_linear(const LinearCall& gc, const LinearCall& uc, const Tensor& h, int64_t rows,
                              int64_t inter, float limit, bool bf16) {
  const NativeMatrix* ng = gc.w ? native(d(*gc.w)) : nullptr;
  const NativeMatrix* nu = uc.w ? native(d(*uc.w)) : nullptr;
  const bool fused = ng && nu && ng->fast && nu->fast && !dense_gemm_takes_rows(gc.rows) && ng->format == nu->format &&
                     ng->w_block == nu->w_block && ng->n == nu->n && ng->k == nu->k && ng->n == inter &&
                     ng->k == gc.in && gc.act_block == ng->act_block && ng->act_block == nu->act_block &&
                     gc.x.f32() == uc.x.f32() && gc.rows == rows && uc.rows == rows && gc.out == inter &&
                     uc.out == inter && uc.in == gc.in && gc.bf16_out == uc.bf16_out && !gc.bf16_in && !uc.bf16_in &&
                     ng->fragments == nu->fragments;
  if (!fused) return Backend::gated_linear(gc, uc, h, rows, inter, limit, bf16);
  ops::BlockLinearParams p;
  p.x = gc.x.f32(), p.w = ng->cptr(), p.w_scale = ng->sptr(), p.y = h.f32();
  p.w_up = nu->cptr(), p.w_up_scale = nu->sptr();
  p.m = rows, p.n = inter, p.k = gc.in, p.format = ng->format, p.w_block = ng->w_block, p.act_block = gc.act_block;
  p.swiglu_limit = limit, p.bf16_round_gate_up = gc.bf16_out, p.bf16_round_out = bf16;
  FS_RETURN_IF_ERROR(prequantize(p));
  bool packed_up = false;
  const bool tiled = p.xq && p.tiled;  // BlockLinearParams::tiled means something with xq only
  FS_RETURN_IF_ERROR(read_fragments(*ng, p.w, p.w_packed, tiled, "linear_w_rows"));
  FS_RETURN_IF_ERROR(read_fragments(*nu, p.w_up, packed_up, tiled, "linear_wu_rows"));
  return ops::cuda::block_linear_cuda(p, stream_);
}

// ---- MoE ----

Status GpuModel::route(const FfnWeights& F, const Tensor& logits, const Tensor& tokens, int64_t T, int64_t E, int64_t K,
                       const Tensor& sel, const Tensor& wt) {
  const auto& c = config();
  FS_ASSIGN_OR_RETURN(FfnDev fd, ffn_dev(F));
  FS_ASSIGN_OR_RETURN(float* rs, scratch<float>("route_scratch", T * 2 * E));
  cd::RouteArgs r;
  r.logits = logits.f32(), r.bias = d(F.bias), r.scratch = rs, r.T = T, r.E = E, r.K = K;
  if (fd.tid2eid) r.tid2eid = fd.tid2eid, r.tokens = tokens.i32();
  r.gate_temp = float(c.gate_temp), r.route_scale = float(c.route_scale);
  r.sqrtsoftplus = c.scoring_func == "sqrtsoftplus";
  r.norm_topk = c.norm_topk_prob;
  r.renorm_eps = c.is_v41();
  r.sel = sel.i32(), r.weight = wt.f32();
  FS_CUDA_RETURN_IF_ERROR(cd::launch_route(r, stream_));
  return {};
}

Status GpuModel::routed_experts(const FfnWeights& F, const Tensor& m, const Tensor& sel, const Tensor& wt, int64_t T,
                                int64_t E, int64_t K, const Tensor& ybuf, Tensor* row_of) {
  const auto& c = config();
  const bool R = ref();
  const int64_t D = c.hidden_size, I = c.moe_inter_dim, TK = T * K;
  FS_ASSIGN_OR_RETURN(FfnDev fd, ffn_dev(F));
  const auto& ek = *fd.experts;  // w1, w2, w3: FP32 stacks or as stored
  *row_of = Tensor{};
  if (const NativeMatrix* n1 = native(ek[0]); n1 && n1->fast) {  // block-scaled expert GEMV (reference)
    // The step's rows from moe_row0_ on belong to sequences that take the grouped GEMMs
    // (GpuLoadOptions::moe_gemm_min_tokens); a step with both kinds runs them as two parts, the
    // first by the GEMV, and merges their row positions.
    const int64_t r0 = T == step_rows_ && moe_gemm_min_tokens_ > 0 ? moe_row0_ : T;
    const int32_t* rows = nullptr;
    if (r0 <= 0 || r0 >= T) {
      FS_RETURN_IF_ERROR(moe_native(ek, T, E, K, m.f32(), sel.i32(), wt.f32(), ybuf.f32(), &rows, r0 <= 0));
      if (rows) *row_of = Tensor{const_cast<int32_t*>(rows), ElemType::kI32, TK, 1};
      return {};
    }
    const int32_t* rows_b = nullptr;
    const int64_t Tb = T - r0;
    FS_RETURN_IF_ERROR(moe_native(ek, r0, E, K, m.f32(), sel.i32(), wt.f32(), ybuf.f32(), &rows, false));
    FS_RETURN_IF_ERROR(moe_native(ek, Tb, E, K, m.f32() + r0 * D, sel.i32() + r0 * K, wt.f32() + r0 * K,
                                  ybuf.f32() + r0 * K * D, &rows_b, true, "moe_grp_pos_b"));
    FS_ASSIGN_OR_RETURN(int32_t* merged, scratch<int32_t>("moe_row_of", TK));
    FS_CUDA_RETURN_IF_ERROR(
        cd::launch_merge_row_of(rows, r0 * K, rows_b, Tb * K, int32_t(r0 * K), merged, stream_));
    *row_of = Tensor{merged, ElemType::kI32, TK, 1};
    return {};
  }
  // The exactness kernels over the [T·K] (row, slot) pairs, stacked weights selected by sel.
  FS_ASSIGN_OR_RETURN(float* g, scratch<float>("moe_g", TK * I));
  FS_ASSIGN_OR_RETURN(float* u, scratch<float>("moe_u", TK * I));
  FS_ASSIGN_OR_RETURN(float* h, scratch<float>("moe_h", TK * I));
  const int64_t act = expert_act_block_;
  FS_RETURN_IF_ERROR(linear(m.f32(), ek[0], TK, D, I, g, act, R, false, sel.i32(), K));
  FS_RETURN_IF_ERROR(linear(m.f32(), ek[2], TK, D, I, u, act, R, false, sel.i32(), K));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_swiglu(g, u, h, wt.f32(), TK, I, float(c.swiglu_limit), R, stream_));
  return linear(h, ek[1], TK, I, D, ybuf.f32(), act, R, false, sel.i32(), 1);
}

// Routed experts in the checkpoint's format through the grouped expert GEMV (ops/cuda/gemv.h),
// with the rounding points of the FP32 path (BF16 gate/up, clamped SwiGLU with the routing
// weight, BF16 h, BF16 expert outputs). Few pairs (decode): every (token, slot) pair is its own group in slot order.
// More pairs than experts (batches, prefill chunks): the pairs are grouped by expert on the device
// (ops::group_pairs_by_expert) so each expert's matrices are read once for all its tokens, and the
// combine reads each pair's row from its sorted position. Fewer pairs than experts from several
// tokens, where two pairs likely share an expert (GpuLoadOptions::moe_compact_groups): the same
// grouping in compact form (ops::compact_expert_groups), TK groups of which the experts with pairs
// come first and the rest are empty, so the launch spans TK groups rather than E. All give the
// same bits for a pair: its dot products run in the same order (the k split is fixed by
// split_groups, tokens are independent MMA columns).
Status GpuModel::moe_native(const std::array<const float*, 3>& ek, int64_t T, int64_t E, int64_t K, const float* m,
                            const int32_t* sel, const float* wt, float* ybuf, const int32_t** row_of, bool gemm,
                            const char* tag) {
  const auto& c = config();
  const bool R = ref();
  const int64_t D = c.hidden_size, I = c.moe_inter_dim, TK = T * K;
  const NativeMatrix &n1 = *native(ek[0]), &n2 = *native(ek[1]), &n3 = *native(ek[2]);
  FS_ASSIGN_OR_RETURN(float* h, scratch<float>("moe_h", TK * I));
  const bool grouped = TK > E;
  // The birthday bound: with (T·K)² >= 2E a repeated expert is expected among T·K uniform picks.
  // One token's K pairs never repeat an expert, so T = 1 stays ungrouped.
  const bool compact = !grouped && moe_compact_groups_ && T > 1 && TK * TK >= 2 * E;
  const int32_t *gstart = nullptr, *gexpert = nullptr, *prow = nullptr;
  const float* pw = wt;
  int64_t n_groups = TK;
  *row_of = nullptr;
  if (grouped || compact) {
    FS_ASSIGN_OR_RETURN(int32_t* d_gstart, scratch<int32_t>("moe_grp_start", E + 1));
    FS_ASSIGN_OR_RETURN(int32_t* d_prow, scratch<int32_t>("moe_grp_row", TK));
    FS_ASSIGN_OR_RETURN(float* d_w, scratch<float>("moe_grp_w", TK));
    FS_ASSIGN_OR_RETURN(int32_t* d_pos, scratch<int32_t>(tag, TK));
    if (expert_ids_.capacity() < size_t(E)) return internal_error("moe: expert id table not uploaded");
    // The route kernel only emits ids in [0, E): no range flag to read back.
    if (compact) {
      // TK slots: at least the experts with pairs (TK < E here).
      FS_ASSIGN_OR_RETURN(int32_t* c_start, scratch<int32_t>("moe_cmp_start", TK + 1));
      FS_ASSIGN_OR_RETURN(int32_t* c_expert, scratch<int32_t>("moe_cmp_expert", TK));
      const cd::MoeCompactGroups cg{c_start, c_expert, TK};
      FS_CUDA_RETURN_IF_ERROR(
          cd::launch_moe_group(sel, wt, TK, E, K, d_gstart, d_prow, d_w, d_pos, nullptr, stream_, nullptr, &cg));
      gstart = c_start, gexpert = c_expert, n_groups = TK;
      ++gstats_.moe_compact_groupings;
    } else {
      FS_ASSIGN_OR_RETURN(int32_t* d_counts, scratch<int32_t>("moe_grp_counts", cd::moe_group_scratch_ints(TK, E)));
      FS_CUDA_RETURN_IF_ERROR(
          cd::launch_moe_group(sel, wt, TK, E, K, d_gstart, d_prow, d_w, d_pos, nullptr, stream_, d_counts));
      gstart = d_gstart, gexpert = expert_ids_.get(), n_groups = E;
    }
    prow = d_prow, pw = d_w;
    *row_of = d_pos;
  } else {
    std::vector<int32_t> hstart(static_cast<size_t>(TK + 1)), hrow(static_cast<size_t>(TK));
    for (int64_t i = 0; i <= TK; ++i) hstart[size_t(i)] = int32_t(i);
    for (int64_t i = 0; i < TK; ++i) hrow[size_t(i)] = int32_t(i / K);
    FS_ASSIGN_OR_RETURN(int32_t* d_gstart, scratch<int32_t>("moe_nat_gstart", TK + 1));
    FS_ASSIGN_OR_RETURN(int32_t* d_prow, scratch<int32_t>("moe_nat_prow", TK));
    FS_RETURN_IF_ERROR(upload(d_gstart, hstart.data(), hstart.size() * 4));
    FS_RETURN_IF_ERROR(upload(d_prow, hrow.data(), hrow.size() * 4));
    gstart = d_gstart, gexpert = sel, prow = d_prow;
  }
  // Each input is quantised once (one launch for gate and up, one for down; the same bits as
  // quantising inside the GEMV), not by every CTA of the expert launches over again: at decode
  // the FP4 GEMVs issue about as many instructions as they stream bytes. From
  // gemv_tiled_min_rows_ pairs per group on average they take the tiled GEMV, below it the
  // GEMV's token passes.
  const bool tiled = TK >= gemv_tiled_min_rows_ * n_groups;
  auto quantize = [&](const char* tag, const float* x, int64_t rows, int64_t k, int64_t act,
                      std::pair<const uint8_t*, const float*>& out) -> Status {
    FS_ASSIGN_OR_RETURN(uint8_t* xq, scratch<uint8_t>(std::string(tag) + "_q8", rows * k));
    FS_ASSIGN_OR_RETURN(float* xs, scratch<float>(std::string(tag) + "_qs", rows * (k / 32)));
    FS_RETURN_IF_ERROR(ops::cuda::gemv_quantize_cuda(x, rows, k, act, /*bf16_in=*/false, xq, xs, stream_));
    out = {xq, xs};
    return {};
  };
  std::pair<const uint8_t*, const float*> xq_cur{nullptr, nullptr};
  // y[s] = fq8(x[row(s)]) · W[expert of s]ᵀ for every (sorted) pair s.
  // With `up`: w is the gate and y = swiglu(gate, up) · routing weight, the gate and up sums
  // rounded to BF16 first in reference numerics: the bits of the gate and up launches followed by
  // the swiglu kernel (the gated GEMV keeps each matrix's summation order), in one pass.
  auto run = [&](const NativeMatrix& w, const float* x, const int32_t* rows, int64_t n_out, int64_t k, float* y,
                 const NativeMatrix* up = nullptr) -> Status {
    ops::ExpertGemvParams q;
    q.x = x, q.w = w.cptr(), q.w_scale = w.sptr();
    if (up) {
      q.w_up = up->cptr(), q.w_up_scale = up->sptr();
      q.pair_weight = pw, q.swiglu_limit = float(c.swiglu_limit), q.bf16_round_gate_up = R;
    }
    q.xq = xq_cur.first, q.xs = xq_cur.second, q.tiled = tiled;
    q.w_packed = w.fragments;  // the gated launch: gate and up are packed together (up_experts)
    q.ring_stages = gemv_ring_stages_;
    q.expert_stride = w.code_bytes, q.expert_scale_stride = w.scale_bytes;
    q.group_expert = gexpert, q.group_start = gstart, q.pair_row = rows;
    q.y = y;
    q.n_groups = n_groups, q.n_pairs = TK, q.n_experts = E, q.n = n_out, q.k = k;
    q.format = w.format, q.w_block = w.w_block, q.act_block = w.act_block;
    q.split_groups = K;  // the k split of a one-token step, whatever the batch (batch invariance)
    q.bf16_round_out = R;  // reference numerics: each output rounded to BF16 in the GEMV's epilogue
    return ops::cuda::expert_gemv_cuda(q, stream_);
  };
  // (Experts in the fragment order: the GEMM takes whole 128-row tiles of them.)
  if (grouped && gemm && moe_gemm_path(n1, n2, n3, E) && (!n1.fragments || (n1.n % 128 == 0 && n2.n % 128 == 0))) {
    // Prefill chunks (GpuLoadOptions::moe_gemm_min_tokens): the same function through the grouped
    // FP8 GEMM over the FP4 experts. x quantised once per token (fq8, the expert GEMV's
    // act_block), rows gathered into the expert-sorted pair order, gate and up GEMMs, the BF16
    // roundings and SwiGLU with the routing weight as below, h quantised (the down GEMV's fq8),
    // the down GEMM; ybuf rows in sorted order (row_of). The GEMM's x_f16 mode (codes as f16
    // values, f16 tensor-core steps with FP32 accumulation per 32-block): the e4m3 wgmma keeps
    // only ~14 bits below each 32-block's largest product (mean 5e-5 · Σ|x·w| per dot, 500x the
    // 1e-7 of the parity bound's reordering model), the f16 steps sum the exact products at FP32
    // precision, as the GEMV's MMA does; only the FP32 order of the block sums differs
    // (docs/cuda.md, "Whole-model parity").
    const int64_t act = n1.act_block;
    constexpr int64_t kCodeBytes = 2;  // f16 values of the e4m3 codes, or BF16 values code · scale
    const bool bv = prefill_gemm_bf16_;
    FS_ASSIGN_OR_RETURN(uint8_t* xq_t, scratch<uint8_t>("moe_gemm_xq_t", T * D * kCodeBytes));
    FS_ASSIGN_OR_RETURN(float* xs_t, scratch<float>("moe_gemm_xs_t", T * D / 32));
    FS_ASSIGN_OR_RETURN(uint8_t* xq, scratch<uint8_t>("moe_gemm_xq", TK * std::max(D, I) * kCodeBytes));
    FS_ASSIGN_OR_RETURN(float* xs, scratch<float>("moe_gemm_xs", TK * std::max(D, I) / 32));
    FS_RETURN_IF_ERROR(ops::cuda::gemm_fp8_quantize_cuda(m, ops::ActDtype::kF32, T, D, act, xq_t, xs_t, stream_,
                                                         /*f16_codes=*/!bv, false, /*bf16_values=*/bv));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_gather_fp8_rows(xq_t, xs_t, prow, TK, D, xq, xs, stream_, int(kCodeBytes)));
    // Reference numerics: gate, up and each expert's output rounded to BF16 in the GEMM's epilogue
    // (bf16_round_out: the RNE rounding a kBf16 quant_sim would apply afterwards).
    auto gemm = [&](const NativeMatrix& w, int64_t n_out, int64_t k, float* y) -> Status {
      ops::GemmFp8GroupedParams q;
      q.xq = xq, q.xs = xs, q.w = w.cptr(), q.w_scale = w.sptr(), q.row_start = gstart, q.y = y;
      q.groups = E, q.rows = TK, q.n = n_out, q.k = k, q.w_block = 32, q.w_format = ops::WeightFormat::kFp4;
      q.x_f16 = !bv, q.x_bf16 = bv, q.bf16_round_out = R, q.bf16_direct = bv && prefill_gemm_direct_;
      if (bv) q.xs = nullptr;
      // Few rows per expert (GpuLoadOptions::moe_expand_min_rows): each tile expanded in the GEMM.
      const bool expand = prefill_gemm_expand_w_ && (moe_expand_min_rows_ == 0 || TK >= moe_expand_min_rows_ * E);
      q.w_fragments = w.fragments;  // GpuLoadOptions::fp4_fragments (both routes read the order)
      if (!expand) {
        q.w_in_registers = moe_w_in_registers_;
        return ops::cuda::gemm_fp8_grouped_cuda(q, stream_);
      }
      // The experts in chunks of whole matrices (at most kMoeExpandChunkBytes of BF16 values), each
      // chunk expanded (the experts without rows skipped) and run as its own grouped GEMM: groups
      // [e0, e0 + ce) through row_start + e0 (the rows stay absolute).
      const int64_t ce = std::max<int64_t>(1, kMoeExpandChunkBytes / (w.n * w.k * 2));
      for (int64_t e0 = 0; e0 < E; e0 += ce) {
        const int64_t cnt = std::min(ce, E - e0);
        FS_ASSIGN_OR_RETURN(q.w, expand_weight(w, e0, cnt, gstart, "moe_gemm_wexp"));
        q.w_scale = nullptr, q.w_bf16 = true, q.w_fragments = false, q.row_start = gstart + e0, q.groups = cnt;
        FS_RETURN_IF_ERROR(ops::cuda::gemm_fp8_grouped_cuda(q, stream_));
      }
      return {};
    };
    ++gstats_.moe_gemm_layers;
    FS_ASSIGN_OR_RETURN(float* g, scratch<float>("moe_g", TK * I));
    FS_ASSIGN_OR_RETURN(float* u, scratch<float>("moe_u", TK * I));
    FS_RETURN_IF_ERROR(gemm(n1, I, D, g));
    FS_RETURN_IF_ERROR(gemm(n3, I, D, u));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_swiglu(g, u, h, pw, TK, I, float(c.swiglu_limit), R, stream_));
    FS_RETURN_IF_ERROR(ops::cuda::gemm_fp8_quantize_cuda(h, ops::ActDtype::kF32, TK, I, n2.act_block, xq, xs, stream_,
                                                         !bv, false, bv));
    FS_RETURN_IF_ERROR(gemm(n2, D, I, ybuf));
    return {};
  }
  if (n_groups > kMaxGemvGroups) return invalid_argument("moe: {} routed pairs in one step (at most {})", TK, kMaxGemvGroups);
  if (n1.act_block != n3.act_block) return internal_error("moe: gate and up projections with different act blocks");
  FS_RETURN_IF_ERROR(quantize("moe_x", m, T, D, n1.act_block, xq_cur));
  if (n1.format != n3.format || n1.w_block != n3.w_block || n1.code_bytes != n3.code_bytes ||
      n1.scale_bytes != n3.scale_bytes)
    return internal_error("moe: gate and up projections stored differently");
  // h = swiglu(gate, up) · routing weight in one gated launch; reference numerics round gate and
  // up to BF16 before the SwiGLU and h after it (bf16_round_gate_up / bf16_round_out in `run`).
  FS_RETURN_IF_ERROR(run(n1, m, prow, I, D, h, &n3));
  xq_cur = {nullptr, nullptr};
  FS_RETURN_IF_ERROR(quantize("moe_h", h, TK, I, n2.act_block, xq_cur));
  // Each expert's output rounded to BF16 before the combine (bf16_round_out in `run`), as the
  // CPU (linear_raw bf16_out) and the exactness path (linear bf16_out) do. Without it the routed
  // experts were the one role off the parity bound (GpuParityDiag).
  FS_RETURN_IF_ERROR(run(n2, h, nullptr, D, I, ybuf));
  return {};
}

Result<const uint8_t*> GpuModel::expand_weight(const NativeMatrix& w, int64_t e0, int64_t count,
                                               const int32_t* row_start, const std::string& name,
                                               const uint8_t* row_major) {
  const int64_t values = count * w.n * w.k;
  auto& a = scratch_[name];
  FS_RETURN_IF_ERROR(a.reserve(size_t(values) * 2, false, /*geometric=*/false));
  ops::GemmExpandBf16Params p;
  const bool fp8_frag = w.fragments && w.format == ops::WeightFormat::kFp8;  // read through row_major
  if (fp8_frag && !row_major) return internal_error("expand_weight: FP8 codes in the fragment order need a row-major copy");
  p.w = (fp8_frag ? row_major : w.cptr()) + e0 * w.code_bytes, p.w_scale = w.sptr() + e0 * w.scale_bytes;
  p.y = reinterpret_cast<uint16_t*>(a.get());
  p.count = count, p.n = w.n, p.k = w.k, p.w_format = w.format;
  p.w_block = w.w_block;
  if (w.format == ops::WeightFormat::kFp8 && (w.block_rows != w.w_block || w.block_cols != w.w_block))
    return internal_error("expand_weight: FP8 scales of {}x{} blocks are not w_block tiles", w.block_rows, w.block_cols);
  p.row_start = row_start ? row_start + e0 : nullptr;
  p.w_fragments = w.fragments && !fp8_frag;
  FS_RETURN_IF_ERROR(ops::cuda::gemm_expand_bf16_cuda(p, stream_));
  ++gstats_.weight_expansions;
  return reinterpret_cast<const uint8_t*>(a.get());
}

// The grouped-GEMM route of moe_native: an sm_90a device, MXFP4 experts (every expert here,
// unpadded [n, k/2] codes and [n, k/32] scales, one activation block of 32 or 128), widths the
// GEMM takes (multiples of 128), at most the GEMM's 1024 groups.
bool GpuModel::moe_gemm_path(const NativeMatrix& n1, const NativeMatrix& n2, const NativeMatrix& n3,
                             int64_t E) const {
  if (!sm90a_) return false;
  if (E > 1024) return false;
  for (const NativeMatrix* w : {&n1, &n2, &n3}) {
    if (w->format != ops::WeightFormat::kFp4 || w->count != E || w->k % 128 != 0 || w->n <= 0) return false;
    if (w->code_bytes != w->n * (w->k / 2) || w->scale_bytes != w->n * (w->k / 32)) return false;
    if (w->act_block != 32 && w->act_block != 128) return false;
  }
  return n1.n == n3.n && n1.k == n3.k && n2.k == n1.n && n2.n == n1.k && n1.act_block == n3.act_block;
}

Status GpuModel::moe_combine(const Tensor& ybuf, const Tensor& ys, const Tensor& out, int64_t T, int64_t K, int64_t D,
                             bool bf16, const Tensor& row_of) {
  FS_CUDA_RETURN_IF_ERROR(cd::launch_moe_combine(ybuf.f32(), ys.f32(), out.f32(), T, K, D, bf16, stream_,
                                                 row_of.empty() ? nullptr : row_of.i32()));
  return {};
}

// One launch for hc = 4 (ops/cuda/model/model_kernels.h), else the two ops.
Status GpuModel::moe_combine_post(const MoeCombineCall& c, const Tensor& X, const Tensor& post, const Tensor& comb,
                                  int64_t hc, bool bf16) {
  if (!row_fusion_ || !cd::moe_combine_post_supports(c.T, hc, c.D))
    return Backend::moe_combine_post(c, X, post, comb, hc, bf16);
  FS_CUDA_RETURN_IF_ERROR(cd::launch_moe_combine_post(c.ybuf.f32(), c.ys.f32(), c.out.f32(), c.T, c.K, c.D, c.bf16,
                                                      c.row_of.empty() ? nullptr : c.row_of.i32(), X.f32(),
                                                      post.f32(), comb.f32(), hc, bf16, stream_));
  return {};
}

// ---- Engram ----

// The table on the device as stored (--engram-tables device): the row ids go up (int32: load
// checked the row count) and the typed row gather expands each code with its E8M0 scale, as the
// host decoder does. Otherwise (host, the default) rows are gathered on the host from the
// checkpoint straight into pinned staging, then uploaded on the stream (under graph capture the
// gather runs at capture time and the graph's copy node reads the staged rows when it is launched).
Status GpuModel::engram_rows(const EngramWeights& E, std::span<const int64_t> ids, const Tensor& e) {
  const int64_t de = config().engram_head_dim, n = int64_t(ids.size());
  if (n == 0) return {};
  int layer = -1;
  for (size_t l = 0; l < w_.layers.size(); ++l)
    if (&w_.layers[l].engram == &E) layer = int(l);
  if (auto it = engram_dev_.find(layer); layer >= 0 && it != engram_dev_.end()) {
    const NativeMatrix& t = it->second;
    FS_ASSIGN_OR_RETURN(int32_t* h_ids, staging<int32_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = ids[size_t(i)];
      if (id < 0 || id >= t.n) return out_of_range("engram layer {}: row {} outside [0, {})", layer, id, t.n);
      h_ids[i] = int32_t(id);
    }
    FS_ASSIGN_OR_RETURN(int32_t* d_ids, scratch<int32_t>("engram_ids", n));
    FS_RETURN_IF_ERROR(upload_staged(d_ids, h_ids, size_t(n) * 4));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_embed_w(t.ref(), d_ids, e.f32(), n, 1, de, stream_));
    return {};
  }
  FS_ASSIGN_OR_RETURN(float* h, staging<float>(n * de));
  FS_RETURN_IF_ERROR(ck_->dequant_row_list(E.table, ids, std::span<float>(h, size_t(n * de))));
  return upload_staged(e.data, h, size_t(n * de) * 4);
}

Status GpuModel::engram_gate(const Tensor& X, const Tensor& kv, const Vec& wqk, int64_t rows, int64_t hc, int64_t D,
                             float eps, bool bf16) {
  FS_CUDA_RETURN_IF_ERROR(cd::launch_engram_gate(X.f32(), kv.f32(), d(wqk), rows, hc, D, eps, bf16, stream_));
  return {};
}

// ---- per-sequence state ----

// Plans the rows v/z [T, width] of one sequence into `cs`: each completed group's slot rows go to
// the pool tables (rows of earlier chunks from the state, new rows from v / z), the last previous
// window (overlap) and the open group's rows become copies into the state.
Status GpuModel::plan_feed(GpuCompState& cs, const float* v, const float* z, const FwdSeg& seg, int64_t ratio,
                           int64_t c, bool overlap, FeedPlan& plan, std::vector<int64_t>& groups) {
  const int64_t width = overlap ? 2 * c : c, T = seg.T;
  FS_RETURN_IF_ERROR(cs.v.reserve(size_t(ratio * width), true));
  FS_RETURN_IF_ERROR(cs.z.reserve(size_t(ratio * width), true));
  FS_RETURN_IF_ERROR(cs.prev_v.reserve(size_t(ratio * width), true));
  FS_RETURN_IF_ERROR(cs.prev_z.reserve(size_t(ratio * width), true));
  std::vector<const float*> cur_v, cur_z, prev_v, prev_z;
  for (int64_t i = 0; i < cs.n_pend; ++i) cur_v.push_back(cs.v.get() + i * width), cur_z.push_back(cs.z.get() + i * width);
  if (cs.has_prev)
    for (int64_t s = 0; s < ratio; ++s)
      prev_v.push_back(cs.prev_v.get() + s * width), prev_z.push_back(cs.prev_z.get() + s * width);
  bool new_prev = false;
  for (int64_t t = 0; t < T; ++t) {
    cur_v.push_back(v + t * width);
    cur_z.push_back(z + t * width);
    if (int64_t(cur_v.size()) < ratio) continue;
    if (overlap)
      for (int64_t s = 0; s < ratio; ++s) {
        plan.tab_v.push_back(prev_v.empty() ? nullptr : prev_v[size_t(s)]);
        plan.tab_z.push_back(prev_z.empty() ? nullptr : prev_z[size_t(s)]);
      }
    for (int64_t s = 0; s < ratio; ++s) {
      plan.tab_v.push_back(cur_v[size_t(s)] + (overlap ? c : 0));
      plan.tab_z.push_back(cur_z[size_t(s)] + (overlap ? c : 0));
    }
    groups.push_back(seg.pos[size_t(t)] / ratio);
    if (overlap) prev_v = cur_v, prev_z = cur_z, new_prev = true;
    cur_v.clear();
    cur_z.clear();
  }
  // Pass a: the previous window (its rows may sit in the open-group buffer, which pass b rewrites).
  if (new_prev)
    for (int64_t s = 0; s < ratio; ++s) {
      plan.a_src.push_back(prev_v[size_t(s)]), plan.a_dst.push_back(cs.prev_v.get() + s * width);
      plan.a_src.push_back(prev_z[size_t(s)]), plan.a_dst.push_back(cs.prev_z.get() + s * width);
    }
  // Pass b: the open group's new rows (old pending rows are already in place).
  for (size_t i = 0; i < cur_v.size(); ++i) {
    if (cur_v[i] == cs.v.get() + i * width) continue;
    plan.b_src.push_back(cur_v[i]), plan.b_dst.push_back(cs.v.get() + i * width);
    plan.b_src.push_back(cur_z[i]), plan.b_dst.push_back(cs.z.get() + i * width);
  }
  cs.n_pend = int64_t(cur_v.size());
  cs.has_prev = cs.has_prev || new_prev;
  return {};
}

// Every sequence at once: one upload of the tables, one pool launch for all completed groups (to
// FP32 staging rows: cache_commit packs them into the caches), two copy launches.
Result<PooledRows> GpuModel::compressor_feed(FwdChunk& ctx, int layer, Compressor which, const Tensor& v,
                                             const Tensor& z, int64_t ratio, int64_t c, bool overlap) {
  const bool kv = which == Compressor::kKv;
  const int64_t width = overlap ? 2 * c : c, n_slots = overlap ? 2 * ratio : ratio;
  FeedPlan plan;
  PooledRows out;
  for (FwdSeg& g : ctx.segs) {
    GpuLayerState& LS = layer_state(g, layer);
    GpuCompState& cs = kv ? LS.comp : LS.icomp;
    const float* sv = v.f32() + g.row0 * width;
    const float* sz = z.f32() + g.row0 * width;
    FS_RETURN_IF_ERROR(plan_history(cs, sv, sz, g, width, ratio, plan));  // rollback
    const size_t n0 = out.groups.size();
    FS_RETURN_IF_ERROR(plan_feed(cs, sv, sz, g, ratio, c, overlap, plan, out.groups));
    out.seg_n.push_back(int64_t(out.groups.size() - n0));
  }
  const int64_t n = int64_t(out.groups.size()), na = int64_t(plan.a_src.size()), nb = int64_t(plan.b_src.size());
  const std::string tag = kv ? "cmp" : "icmp";
  // One table: pool v slots, pool z slots, a sources, a destinations, b sources, b destinations.
  std::vector<const void*> tab;
  tab.reserve(size_t(2 * n * n_slots + 2 * na + 2 * nb));
  tab.insert(tab.end(), plan.tab_v.begin(), plan.tab_v.end());
  tab.insert(tab.end(), plan.tab_z.begin(), plan.tab_z.end());
  tab.insert(tab.end(), plan.a_src.begin(), plan.a_src.end());
  tab.insert(tab.end(), plan.a_dst.begin(), plan.a_dst.end());
  tab.insert(tab.end(), plan.b_src.begin(), plan.b_src.end());
  tab.insert(tab.end(), plan.b_dst.begin(), plan.b_dst.end());
  float* rows = nullptr;
  if (!tab.empty()) {
    FS_ASSIGN_OR_RETURN(const float** d_tab, scratch<const float*>(tag + "_tab", int64_t(tab.size())));
    FS_RETURN_IF_ERROR(upload(d_tab, tab.data(), tab.size() * sizeof(void*)));
    const float* const* t = d_tab;
    if (n > 0) {
      FS_ASSIGN_OR_RETURN(rows, scratch<float>(tag + "_stage", n * c));
      FS_CUDA_RETURN_IF_ERROR(cd::launch_softmax_pool(t, t + n * n_slots, n, n_slots, c, rows, stream_));
    }
    t += 2 * n * n_slots;
    FS_CUDA_RETURN_IF_ERROR(cd::launch_copy_rows_table(t, const_cast<float* const*>(t + na), na, width, stream_));
    t += 2 * na;
    FS_CUDA_RETURN_IF_ERROR(cd::launch_copy_rows_table(t, const_cast<float* const*>(t + nb), nb, width, stream_));
  }
  stage_[kv ? 0 : 1] = rows;
  out.rows = Tensor{rows, ElemType::kF32, n, c};
  return out;
}

// New cache rows are FP32 staging rows (the flow finishes them in place); cache_commit packs them
// into the cache's row format (exactly representable: the flow quantised them to that format).
Result<Tensor> GpuModel::cache_reserve(FwdChunk&, int, Cache which, std::span<const int64_t> seg_n) {
  const bool kv = which == Cache::kCkv;
  const int64_t width = kv ? config().head_dim : config().index_head_dim;
  int64_t n = 0;
  for (const int64_t k : seg_n) n += k;
  FS_ASSIGN_OR_RETURN(float* rows, scratch<float>(kv ? "cmp_stage" : "icmp_stage", n * width));
  stage_[kv ? 0 : 1] = rows;
  return Tensor{rows, ElemType::kF32, n, width};
}

// Each sequence's rows at the end of its cache: one launch (a table of row addresses when the rows
// go to several caches).
Status GpuModel::cache_commit(FwdChunk& ctx, int layer, Cache which, std::span<const int64_t> seg_n) {
  if (seg_n.size() != ctx.segs.size())
    return internal_error("cache_commit: {} row counts for {} sequences", seg_n.size(), ctx.segs.size());
  const bool kv = which == Cache::kCkv;
  const ops::CacheRowFormat& f = kv ? cache_fmt_.ckv : cache_fmt_.ikeys;
  const int64_t rb = f.row_bytes();
  std::vector<uint8_t*> dst_rows;
  uint8_t* single = nullptr;
  int64_t n = 0, segs_with_rows = 0;
  for (size_t s = 0; s < seg_n.size(); ++s) {
    const int64_t k = seg_n[s];
    if (k <= 0) continue;
    GpuLayerState& LS = layer_state(ctx.segs[s], layer);
    DevArray<uint8_t>& dst = kv ? LS.ckv : LS.ikeys;
    int64_t& count = kv ? LS.n_ckv : LS.n_ikeys;
    FS_RETURN_IF_ERROR(dst.reserve(size_t((count + k) * rb), true));
    single = dst.get() + count * rb;
    for (int64_t i = 0; i < k; ++i) dst_rows.push_back(dst.get() + (count + i) * rb);
    count += k;
    n += k;
    ++segs_with_rows;
  }
  if (n == 0) return {};
  const float* src = stage_[kv ? 0 : 1];
  if (segs_with_rows == 1) {  // contiguous rows of one cache
    FS_CUDA_RETURN_IF_ERROR(cd::launch_cache_pack_rows(f, src, n, single, nullptr, stream_));
    return {};
  }
  FS_ASSIGN_OR_RETURN(uint8_t** d_rows, scratch<uint8_t*>(kv ? "ckv_rows" : "ikeys_rows", n));
  FS_RETURN_IF_ERROR(upload(d_rows, dst_rows.data(), dst_rows.size() * sizeof(void*)));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_cache_pack_rows_table(f, src, n, d_rows, nullptr, stream_));
  return {};
}

// Scores over the keys of this layer's own kv source (v41 §9.x), rows strided by start + T, and
// the top-k of one sequence. The scores, block maxima and kept-block flags take 9 bytes per (row,
// visible key, kGpuIndexEntryBytes): the rows go through in slices that keep them within
// kGpuIndexScratchBytes (forward/memory_plan.h, which the plan counts; one slice
// up to ~29k context at 8192 rows; an 8192-row chunk at 1M context would need 77 GB at once).
// Every row is computed alone by both kernels, so the slicing does not change a bit.
// Several sequences whose rows all fit the scratch at once, with the integer tensor-core scores
// and one block per top-k row (what each one alone would run): one q pack, one scores and one top-k
// launch for all of them (IndexScoreArgs::segs), the same bits as a launch per sequence. Else a
// launch per sequence.
Status GpuModel::index_topk(int l, FwdChunk& ctx, const Tensor& iq, const Tensor& wts, const Tensor& out,
                            const Tensor& out_n) {
  const auto& c = config();
  const auto& role = c.role(l);
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim, K = c.index_topk, T = ctx.T;
  int64_t total = 0, max_len = 0, max_T = 0;
  for (const FwdSeg& g : ctx.segs) {
    total += g.T * (g.start + g.T);
    max_len = std::max(max_len, g.start + g.T);
    max_T = std::max(max_T, g.T);
  }
  cd::IndexScoreArgs s;
  s.key_fmt = cache_fmt_.ikeys, s.nI = nI, s.dI = dI, s.ratio = role.ratio, s.bf16 = ref();
  s.kernel = index_scores_kernel_, s.q_fp4 = ref(), s.T = T;
  const bool batched = ctx.segs.size() > 1 && !ctx.row_seq.empty() && total * kGpuIndexEntryBytes <= kGpuIndexScratchBytes &&
                       (s.kernel == 0 || s.kernel == 4) && cd::index_scores_imma_applies(s) &&
                       cd::index_topk_segs_applies(max_len, role.ratio);
  if (!batched) {
    for (FwdSeg& g : ctx.segs)
      FS_RETURN_IF_ERROR(index_topk_seg(l, g, iq.rows_from(g.row0, g.T), wts.rows_from(g.row0, g.T),
                                        out.rows_from(g.row0, g.T), out_n.rows_from(g.row0, g.T)));
    return {};
  }
  // Regions of every sequence back to back, as the flow lays out its candidate masks.
  const bool has_cand = role.candidate_source || role.candidate_filtered;
  std::vector<cd::IndexSeg> segs;
  int64_t off = 0;
  for (FwdSeg& g : ctx.segs) {
    if (has_cand && g.cand.u8() != ctx.segs.front().cand.u8() + off)
      return internal_error("layer {}: candidate masks are not laid out back to back", l);
    segs.push_back({layer_state(g, role.kv_src).ikeys.get(), g.start, g.T, g.row0, off});
    off += g.T * (g.start + g.T);
  }
  FS_ASSIGN_OR_RETURN(float* sc, scratch<float>("idx_scores", total));
  FS_ASSIGN_OR_RETURN(float* bs, scratch<float>("idx_blocks", total));
  FS_ASSIGN_OR_RETURN(uint8_t* taken, scratch<uint8_t>("idx_taken", total));
  FS_ASSIGN_OR_RETURN(uint8_t* d_segs, scratch<uint8_t>("idx_segs", int64_t(segs.size() * sizeof(cd::IndexSeg))));
  FS_RETURN_IF_ERROR(upload(d_segs, segs.data(), segs.size() * sizeof(cd::IndexSeg)));
  const auto* ds = reinterpret_cast<const cd::IndexSeg*>(d_segs);
  s.q = iq.f32(), s.w = wts.f32(), s.scores = sc, s.stride = max_len;
  s.segs = ds, s.n_segs = int64_t(segs.size()), s.seg_rows = max_T;
  const size_t wb = cd::index_scores_work_bytes(s);
  FS_ASSIGN_OR_RETURN(uint8_t* work, scratch<uint8_t>("idx_qpack", int64_t(wb)));
  s.work = work, s.work_bytes = wb;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_index_scores(s, stream_));
  cd::IndexTopkArgs t;
  t.scores = sc, t.block_scratch = bs, t.taken = taken;
  t.cand = has_cand ? ctx.segs.front().cand.u8() : nullptr;
  t.ratio = role.ratio, t.stride = max_len, t.k = K, t.T = T;
  t.cand_block = c.candidate_block_size, t.cand_top = c.candidate_topk_blocks;
  t.mode = role.candidate_source ? 1 : role.candidate_filtered ? 2 : 0;
  t.out = out.i32(), t.out_n = out_n.i32();
  t.segs = ds, t.row_seg = ctx.row_seq.i32(), t.n_segs = int64_t(segs.size());
  FS_CUDA_RETURN_IF_ERROR(cd::launch_index_topk(t, stream_));
  return {};
}

Status GpuModel::index_topk_seg(int l, FwdSeg& seg, const Tensor& iq, const Tensor& wts, const Tensor& out,
                                const Tensor& out_n) {
  const auto& c = config();
  const auto& role = c.role(l);
  const int64_t T = seg.T, stride = seg.start + T, nI = c.index_n_heads, dI = c.index_head_dim, K = c.index_topk;
  const int64_t rows = std::clamp<int64_t>(kGpuIndexScratchBytes / (kGpuIndexEntryBytes * stride), 1, T);
  FS_ASSIGN_OR_RETURN(float* sc, scratch<float>("idx_scores", rows * stride));
  FS_ASSIGN_OR_RETURN(float* bs, scratch<float>("idx_blocks", rows * stride));
  FS_ASSIGN_OR_RETURN(uint8_t* taken, scratch<uint8_t>("idx_taken", rows * stride));
  cd::IndexScoreArgs s;
  s.keys = layer_state(seg, role.kv_src).ikeys.get(), s.scores = sc, s.key_fmt = cache_fmt_.ikeys;
  s.nI = nI, s.dI = dI, s.ratio = role.ratio, s.stride = stride, s.bf16 = ref();
  s.kernel = index_scores_kernel_;  // GpuLoadOptions::index_scores_kernel (0: automatic)
  // Reference numerics quantise the index queries to FP4 (flow.cpp index_select): the integer
  // tensor-core kernel can score them against FP4 keys, with its packed queries in scratch.
  s.q_fp4 = ref();
  s.T = rows;
  if (const size_t wb = cd::index_scores_work_bytes(s); wb > 0) {
    FS_ASSIGN_OR_RETURN(uint8_t* work, scratch<uint8_t>("idx_qpack", int64_t(wb)));
    s.work = work, s.work_bytes = wb;
  }
  cd::IndexTopkArgs t;
  t.scores = sc, t.block_scratch = bs, t.taken = taken;
  t.ratio = role.ratio, t.stride = stride, t.k = K;
  t.cand_block = c.candidate_block_size, t.cand_top = c.candidate_topk_blocks;
  t.mode = role.candidate_source ? 1 : role.candidate_filtered ? 2 : 0;
  for (int64_t r0 = 0; r0 < T; r0 += rows) {
    const int64_t n = std::min(rows, T - r0);
    s.q = iq.f32() + r0 * nI * dI, s.w = wts.f32() + r0 * nI, s.T = n, s.start = seg.start + r0;
    if (s.keys) FS_CUDA_RETURN_IF_ERROR(cd::launch_index_scores(s, stream_));
    t.cand = seg.cand.data ? seg.cand.u8() + r0 * stride : nullptr, t.out = out.i32() + r0 * K, t.out_n = out_n.i32() + r0;
    t.T = n, t.start = seg.start + r0;
    FS_CUDA_RETURN_IF_ERROR(cd::launch_index_topk(t, stream_));
  }
  return {};
}

// Each sequence over its own ring, compressed KV and top-k lists: one launch for the step (the
// sequences as descriptors), or the plain launch for a single sequence; same bits either way.
Status GpuModel::attention(int l, FwdChunk& ctx, const Tensor& q, const Tensor& kv, const Vec& sink, const Tensor& o,
                           int64_t H, bool bf16) {
  bool unroped = false;
  return attention_impl(l, ctx, q, kv, sink, o, H, bf16, nullptr, nullptr, 0, &unroped);
}

// With row fusion: the rotation inside the decode attention's launch where every row takes it.
Status GpuModel::attention_unrope(int l, FwdChunk& ctx, const Tensor& q, const Tensor& kv, const Vec& sink,
                                  const Tensor& o, int64_t H, int64_t Dh, bool bf16, const Vec& inv_freq,
                                  int64_t rope_dim) {
  if (!row_fusion_ || rope_dim <= 0)
    return Backend::attention_unrope(l, ctx, q, kv, sink, o, H, Dh, bf16, inv_freq, rope_dim);
  bool unroped = false;
  FS_RETURN_IF_ERROR(attention_impl(l, ctx, q, kv, sink, o, H, bf16, ctx.pos.i64(), d(inv_freq), rope_dim, &unroped));
  return unroped ? Status{} : rope(o, ctx.pos, inv_freq, ctx.T, H, Dh, rope_dim, true, bf16);
}

Status GpuModel::attention_impl(int l, FwdChunk& ctx, const Tensor& q, const Tensor& kv, const Vec& sink,
                                const Tensor& o, int64_t H, bool bf16, const int64_t* unrope_pos,
                                const float* unrope_inv_freq, int64_t unrope_dim, bool* unroped) {
  *unroped = false;
  const auto& c = config();
  const auto& role = c.role(l);
  const int64_t W = c.window, Dh = c.head_dim;
  cd::ModelAttnArgs p;
  p.q = q.f32(), p.kv_chunk = kv.f32(), p.sink = d(sink), p.out = o.f32();
  p.T = ctx.T, p.H = H, p.Dh = Dh, p.window = W;
  p.scale = 1.0f / std::sqrt(float(Dh));
  p.bf16 = bf16;
  p.ring_fmt = cache_fmt_.ring, p.ckv_fmt = cache_fmt_.ckv;
  std::vector<cd::ModelAttnSeq> seqs;
  for (const FwdSeg& g : ctx.segs) {
    const auto* st = static_cast<const GpuSequenceState*>(g.st);
    cd::ModelAttnSeq sq;
    sq.ring = st->layers[size_t(l)].ring.get(), sq.start = g.start, sq.row0 = g.row0, sq.T = g.T;
    sq.ring_size = st->ring_size;
    int64_t keys = W;
    if (role.ratio > 0) {
      sq.ckv = st->layers[size_t(role.kv_src)].ckv.get();
      keys += role.idx_src >= 0 ? c.index_topk : (g.start + g.T) / role.ratio;  // V4 HCA: every visible entry
    }
    p.max_keys = std::max(p.max_keys, keys);
    seqs.push_back(sq);
  }
  if (role.ratio > 0) {
    p.ratio = role.ratio;
    if (role.idx_src >= 0) {
      const FwdSeg& g0 = ctx.segs.front();  // row 0: the lists' base
      p.topk = g0.topk[size_t(role.idx_src)].i32();
      p.topk_n = g0.topk_n[size_t(role.idx_src)].i32();
      p.topk_stride = c.index_topk;
      if (!p.topk) return internal_error("layer {}: index source {} published no top-k", l, role.idx_src);
    }
    p.ckv = seqs.front().ckv ? seqs.front().ckv : kv.f32();  // non-null: the layer has compressed rows
  }
  attn_seqs_ = nullptr;
  attn_seqs_layer_ = -1;
  if (seqs.size() > 1) {  // ring_write reads the descriptors too
    const int64_t bytes = int64_t(seqs.size() * sizeof(cd::ModelAttnSeq));
    FS_ASSIGN_OR_RETURN(uint8_t* ds, scratch<uint8_t>("attn_seqs", bytes));
    FS_RETURN_IF_ERROR(upload(ds, seqs.data(), size_t(bytes)));
    attn_seqs_ = reinterpret_cast<const cd::ModelAttnSeq*>(ds);
    attn_seqs_layer_ = l;
  }
  // Prefill chunks on the tensor cores (GpuLoadOptions::prefill_attention, gpu_model.h): each
  // segment of kGpuPrefillAttnMinRows+ rows (never part of a graph step) in reference numerics,
  // with shapes the kernel has and a BF16 key pool no larger than the (row, key) pairs it serves,
  // runs alone; a segment's bits then depend on itself only (not on the other segments of the
  // step). The other segments of such a step run the staged kernel one by one (the bits of the
  // several-sequence launch: launch_model_attention_seqs computes each row as its sequence alone).
  static_assert(kGpuPrefillAttnMinRows > kGpuGraphMaxTokens, "graph steps never take the tensor-core path");
  // The rows no prefill-chunk launch takes: the tensor-core kernel row by row
  // (GpuLoadOptions::decode_attention_tensor), or the staged kernel.
  const bool rows_tc = decode_attention_tensor_ && bf16 && cd::model_prefill_attn_supports(p);
  auto run_rows = [&](const cd::ModelAttnArgs& b, const cd::ModelAttnSeq* dseqs, const int32_t* row_seq) -> Status {
    if (rows_tc) {
      // Key rows of at most kGpuDecodeAttnPoolBytes at a time (forward/memory_plan.h, which the plan counts).
      const size_t bytes = cd::model_decode_attn_workspace(b, kGpuDecodeAttnPoolBytes);
      FS_ASSIGN_OR_RETURN(uint8_t* w, scratch<uint8_t>("decode_attn_ws", int64_t(bytes)));
      FS_CUDA_RETURN_IF_ERROR(
          cd::launch_model_decode_attention(b, dseqs, row_seq, kGpuDecodeAttnPoolBytes, w, bytes, stream_));
    } else if (dseqs) {
      FS_CUDA_RETURN_IF_ERROR(cd::launch_model_attention_seqs(b, dseqs, row_seq, stream_));
    } else {
      FS_CUDA_RETURN_IF_ERROR(cd::launch_model_attention(b, stream_));
    }
    return {};
  };
  if (prefill_attention_ == GpuPrefillAttention::kAuto && bf16 && cd::model_prefill_attn_supports(p)) {
    // The args of segment i alone (rows [row0, row0 + T) of the step).
    auto seg_args = [&](size_t i) {
      const cd::ModelAttnSeq& sq = seqs[i];
      cd::ModelAttnArgs b = p;
      b.q = p.q + sq.row0 * H * Dh, b.out = p.out + sq.row0 * H * Dh, b.kv_chunk = p.kv_chunk + sq.row0 * Dh;
      if (b.topk) b.topk += sq.row0 * b.topk_stride, b.topk_n += sq.row0;
      b.T = sq.T, b.ring = sq.ring, b.ring_size = sq.ring_size, b.start = sq.start;
      if (b.ckv) b.ckv = sq.ckv ? sq.ckv : static_cast<const void*>(b.kv_chunk);  // none yet: never read
      return b;
    };
    std::vector<size_t> ws(seqs.size(), 0);  // > 0: the segment runs on the tensor cores
    bool any = false;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].T < kGpuPrefillAttnMinRows) continue;
      cd::ModelAttnSeq one = seqs[i];
      one.row0 = 0;
      int64_t pool_rows = 0, n_idx = 0;
      const size_t bytes = cd::model_prefill_attn_workspace(seg_args(i), &one, 1, &pool_rows, &n_idx);
      if (bytes > 0 && pool_rows <= seqs[i].T * n_idx) ws[i] = bytes, any = true;
    }
    if (any) {
      for (size_t i = 0; i < seqs.size(); ++i) {
        cd::ModelAttnArgs b = seg_args(i);
        if (ws[i] == 0) {
          if (rows_tc && b.ckv)  // the segment's own largest key count (the decode path's slots)
            b.max_keys = W + (role.idx_src >= 0 ? c.index_topk : (seqs[i].start + seqs[i].T) / role.ratio);
          FS_RETURN_IF_ERROR(run_rows(b, nullptr, nullptr));
          continue;
        }
        cd::ModelAttnSeq one = seqs[i];
        one.row0 = 0;
        FS_ASSIGN_OR_RETURN(uint8_t* w, scratch<uint8_t>("prefill_attn_ws", int64_t(ws[i])));
        FS_CUDA_RETURN_IF_ERROR(cd::launch_model_prefill_attention(b, &one, 1, w, ws[i], stream_));
      }
      return {};
    }
  }
  if (unrope_pos && rows_tc) {  // every row below takes launch_model_decode_attention: the rotation in it
    p.unrope_pos = unrope_pos, p.unrope_inv_freq = unrope_inv_freq, p.unrope_dim = unrope_dim;
    *unroped = true;
  }
  if (seqs.size() == 1) {
    p.ring = seqs[0].ring, p.ring_size = seqs[0].ring_size, p.start = seqs[0].start;
    return run_rows(p, nullptr, nullptr);
  }
  return run_rows(p, attn_seqs_, ctx.row_seq.i32());
}

Status GpuModel::ring_write(int l, FwdChunk& ctx, const Tensor& kv) {
  if (ctx.segs.size() > 1) {
    if (attn_seqs_layer_ != l || !attn_seqs_) return internal_error("ring_write: layer {} ran no attention first", l);
    FS_CUDA_RETURN_IF_ERROR(cd::launch_cache_pack_ring_seqs(cache_fmt_.ring, attn_seqs_, ctx.row_seq.i32(), kv.f32(),
                                                            ctx.pos.i64(), ctx.T, nullptr, stream_));
    return {};
  }
  const FwdSeg& g = ctx.segs.front();
  auto* st = static_cast<GpuSequenceState*>(g.st);
  const int64_t rs = st->ring_size;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_cache_pack_ring(cache_fmt_.ring, st->layers[size_t(l)].ring.get(), kv.f32(),
                                                     g.pos_d.i64(), std::max<int64_t>(0, g.T - rs), g.T, rs, nullptr,
                                                     stream_));
  return {};
}

// With row fusion, one sequence whose rows fit the ring's spare slots (ring_size >= window + T − 1:
// no slot written here is one this layer's attention reads, whose window keys before the chunk
// come from the ring and the chunk's own from kv): the rows' norm, RoPE, FP8 simulation and ring
// write in one launch (ring_write's bytes). Otherwise the rows alone; ring_write follows.
Result<bool> GpuModel::window_kv_rows(int l, FwdChunk& ctx, const NormRopeQuantCall& c) {
  const FwdSeg* g = ctx.segs.size() == 1 ? &ctx.segs.front() : nullptr;
  auto* st = g ? static_cast<GpuSequenceState*>(g->st) : nullptr;
  void* ring = st && size_t(l) < st->layers.size() ? st->layers[size_t(l)].ring.get() : nullptr;
  const float* w = c.w ? d(*c.w) : nullptr;
  const bool fuse = row_fusion_ && ring && c.inv_freq && g->T == c.rows && g->row0 == 0 &&
                    st->ring_size >= config().window + g->T - 1 && cache_fmt_.ring.dim == c.dim &&
                    cd::cache_row_packable(cache_fmt_.ring) && (!w || (reinterpret_cast<uintptr_t>(w) & 15) == 0) &&
                    cd::norm_rope_quant_supports(c.x.f32(), c.dim, c.rope_dim, c.quant_prefix, c.quant_block);
  if (!fuse) {
    FS_RETURN_IF_ERROR(norm_rope_quant(c));
    return false;
  }
  cd::NormRopeQuantRing r;
  r.ring = ring, r.ring_size = st->ring_size, r.format = cache_fmt_.ring;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_norm_rope_quant(c.x.f32(), w, g->pos_d.i64(), d(*c.inv_freq), c.rows, c.dim,
                                                     c.rope_dim, c.eps, c.bf16, c.quant_prefix, c.quant_block,
                                                     stream_, &r));
  return true;
}

// ---- DSpark ----

// Every sequence's rows into its ring of the stage: one launch (sequence descriptors) for several.
Status GpuModel::draft_ring_write(int stage, FwdChunk& ctx, const Tensor& kv) {
  const int64_t Dh = config().head_dim;
  std::vector<cd::ModelAttnSeq> seqs;
  for (const FwdSeg& g : ctx.segs) {
    auto* st = static_cast<GpuSequenceState*>(g.st);
    if (st->draft_rings.size() <= size_t(stage)) return internal_error("GPU state has no DSpark draft rings");
    cd::ModelAttnSeq sq;
    sq.ring = st->draft_rings[size_t(stage)].get(), sq.start = g.start, sq.row0 = g.row0, sq.T = g.T;
    sq.ring_size = st->ring_size;
    seqs.push_back(sq);
  }
  if (seqs.size() == 1) {
    const cd::ModelAttnSeq& q = seqs.front();
    FS_CUDA_RETURN_IF_ERROR(cd::launch_ring_write(static_cast<float*>(q.ring), kv.f32(), ctx.pos.i64(),
                                                  std::max<int64_t>(0, q.T - q.ring_size), q.T, q.ring_size, Dh,
                                                  stream_));
    return {};
  }
  const int64_t bytes = int64_t(seqs.size() * sizeof(cd::ModelAttnSeq));
  FS_ASSIGN_OR_RETURN(uint8_t* ds, scratch<uint8_t>("draft_ring_seqs" + std::to_string(stage), bytes));
  FS_RETURN_IF_ERROR(upload(ds, seqs.data(), size_t(bytes)));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_ring_write_seqs(reinterpret_cast<const cd::ModelAttnSeq*>(ds), ctx.row_seq.i32(),
                                                     kv.f32(), ctx.pos.i64(), ctx.T, Dh, stream_));
  return {};
}

// One stage's attention over B block rows (positions a+1 … a+B, a = last committed): keys are
// the ring rows max(0, a−W+1) … a then every block row (no causal mask), as the CPU. Runs the
// model attention kernel with a one-key "window" (the oldest ring row, replicated per query row)
// and the remaining keys as a gathered "compressed" list selected in full.
Status GpuModel::draft_attention(int stage, FwdSeg& seg, const Tensor& q, const Tensor& kv, const Vec& sink,
                                 const Tensor& o, int64_t H, bool bf16) {
  const auto& c = config();
  const auto* st = static_cast<const GpuSequenceState*>(seg.st);
  const int64_t B = seg.T, Dh = c.head_dim, ring = st->ring_size, last = seg.start - 1;
  const int64_t nw = std::min(last + 1, c.window), first = last - nw + 1, n = nw + B;
  const float* rg = st->draft_rings[size_t(stage)].get();
  FS_ASSIGN_OR_RETURN(float* keys, scratch<float>("dr_keys", n * Dh));     // ring rows first+1 … a, block rows
  FS_ASSIGN_OR_RETURN(float* k0, scratch<float>("dr_k0", B * Dh));         // ring row `first`, per query row
  FS_ASSIGN_OR_RETURN(int32_t* sel, scratch<int32_t>("dr_sel", B * n));
  FS_ASSIGN_OR_RETURN(int32_t* sel_n, scratch<int32_t>("dr_sel_n", B));
  for (int64_t j = 0; j < B; ++j)
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(k0 + j * Dh, rg + (first % ring) * Dh, size_t(Dh) * 4, cudaMemcpyDeviceToDevice, stream_));
  for (int64_t p = first + 1; p <= last;) {  // at most two contiguous runs of the ring
    const int64_t slot = p % ring, cnt = std::min(last + 1 - p, ring - slot);
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(keys + (p - first - 1) * Dh, rg + slot * Dh, size_t(cnt * Dh) * 4,
                                                    cudaMemcpyDeviceToDevice, stream_));
    p += cnt;
  }
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(keys + (nw - 1) * Dh, kv.f32(), size_t(B * Dh) * 4, cudaMemcpyDeviceToDevice, stream_));
  std::vector<int32_t> hsel(size_t(B * (n - 1))), hn(size_t(B), int32_t(n - 1));
  for (int64_t j = 0; j < B; ++j)
    for (int64_t i = 0; i < n - 1; ++i) hsel[size_t(j * (n - 1) + i)] = int32_t(i);
  FS_RETURN_IF_ERROR(upload(sel, hsel.data(), hsel.size() * 4));
  FS_RETURN_IF_ERROR(upload(sel_n, hn.data(), hn.size() * 4));
  cd::ModelAttnArgs p;
  p.q = q.f32(), p.kv_chunk = k0, p.ring = k0, p.ckv = keys, p.topk = sel, p.topk_n = sel_n, p.topk_stride = n - 1;
  p.ratio = 1, p.sink = d(sink), p.out = o.f32();
  p.T = B, p.H = H, p.Dh = Dh, p.window = 1, p.ring_size = B, p.start = seg.start, p.max_keys = n;
  p.scale = 1.0f / std::sqrt(float(Dh));
  p.bf16 = bf16;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_attention(p, stream_));
  return {};
}

// The Markov head's [V, r] GEMV on the device (the same dot order as the CPU's ops::linear); the
// row comes to the host for the chooser.
Status GpuModel::markov_logits(int32_t prev, std::span<float> logits) {
  const auto& c = config();
  const int64_t V = c.vocab_size, r = c.dspark_markov_rank;
  FS_ASSIGN_OR_RETURN(float* ml, scratch<float>("dr_markov", V));
  FS_ASSIGN_OR_RETURN(float* me, scratch<float>("dr_markov_e", r));
  FS_ASSIGN_OR_RETURN(int32_t* zero_id, scratch<int32_t>("dr_zero", 1));
  const float* x = me;
  if (const NativeMatrix* me_stored = native(markov_embed_key_)) {  // row `prev` expanded (token 0 + row0)
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memset_async(zero_id, 0, 4, stream_));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_embed_w(me_stored->ref(prev), zero_id, me, 1, 1, r, stream_));
  } else {  // FP32 copy: the row itself
    x = markov_embed_key_ + int64_t(prev) * r;
  }
  FS_RETURN_IF_ERROR(linear(x, markov_head_key_, 1, r, V, ml, 0, false));
  return download_now(logits.data(), Tensor{ml, ElemType::kF32, 1, V}, size_t(V) * 4);
}

// The confidence dot's embedding row, read from the checkpoint on the host.
Status GpuModel::markov_embed_row(int32_t prev, std::span<float> e) {
  const std::string name = fmt::format("mtp.{}.markov_head.embed.weight", w_.dspark.stages.size() - 1);
  return ck_->dequant_rows(name, prev, prev + 1, e);
}

}  // namespace flashseek::forward::gpu
#endif
