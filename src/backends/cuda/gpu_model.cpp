// Model-level flow of the CUDA backend (mirrors cpu_model.cpp step for step): weight upload,
// sequence state, embedding, the per-layer mHC data flow, Engram, the final collapse/norm/head.
#include "backends/cuda/gpu_model.h"

#include <charconv>

#include "backends/cuda/gpu_tp.h"

namespace flashseek::forward {

Result<std::unique_ptr<Model>> load_model_for(const std::string& dir, Numerics numerics, const std::string& gpus) {
  if (gpus.empty()) return load_model(dir, numerics);
  if (gpus.find(',') != std::string::npos) {  // several devices: tensor + expert parallel (gpu_tp.h)
    FS_ASSIGN_OR_RETURN(std::vector<int> devices, parse_gpu_list(gpus));
    return load_model_tp(dir, numerics, devices);
  }
  int device = -1;
  const auto [end, ec] = std::from_chars(gpus.data(), gpus.data() + gpus.size(), device);
  if (ec != std::errc() || end != gpus.data() + gpus.size() || device < 0)
    return invalid_argument("--gpus {}: expected a device number such as 0 (or a list such as 0,1)", gpus);
  return load_model_gpu(dir, numerics, device);
}

}  // namespace flashseek::forward

#if FLASHSEEK_HAVE_CUDA
#include <algorithm>
#include <chrono>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/gpu_impl.h"
#include "model/weights.h"
#include "ops/cuda/comm.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/model_kernels.h"
#include "ops/cuda/small_kernels.h"
#include "ops/engram.h"

namespace flashseek::forward {

bool gpu_backend_built() { return true; }

Result<uint64_t> gpu_memory_free(int device) {
  std::string why;
  if (!ops::cuda::cuda_device_available(&why)) return Status(StatusCode::kUnavailable, fmt::format("--gpus {}: {}", device, why));
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  FS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  return uint64_t(free_b);
}

Result<std::unique_ptr<Model>> load_model_gpu(const std::string& dir, Numerics numerics, int device,
                                              const GpuLoadOptions& opts) {
  FS_ASSIGN_OR_RETURN(auto m, gpu::GpuModel::load(dir, numerics, device, nullptr, nullptr, opts));
  return std::unique_ptr<Model>(std::move(m));
}

namespace gpu {
namespace cd = ops::cuda::detail;

std::unique_ptr<SequenceState> GpuSequenceState::clone() const {
  auto c = std::make_unique<GpuSequenceState>();
  c->len = len;
  c->ring_size = ring_size;
  c->engram_hist = engram_hist;
  c->error = error;
  c->layers.resize(layers.size());
  auto copy_comp = [&](const GpuCompState& s, GpuCompState& d) -> Status {
    d.n_pend = s.n_pend;
    d.has_prev = s.has_prev;
    d.hist_lo = s.hist_lo;
    FS_RETURN_IF_ERROR(d.hist_v.copy_from(s.hist_v));
    FS_RETURN_IF_ERROR(d.hist_z.copy_from(s.hist_z));
    FS_RETURN_IF_ERROR(d.v.copy_from(s.v));
    FS_RETURN_IF_ERROR(d.z.copy_from(s.z));
    FS_RETURN_IF_ERROR(d.prev_v.copy_from(s.prev_v));
    return d.prev_z.copy_from(s.prev_z);
  };
  for (size_t l = 0; l < layers.size() && c->error.ok(); ++l) {
    const GpuLayerState& s = layers[l];
    GpuLayerState& d = c->layers[l];
    d.n_ckv = s.n_ckv;
    d.n_ikeys = s.n_ikeys;
    Status st = d.ring.copy_from(s.ring);
    if (st.ok()) st = d.ckv.copy_from(s.ckv);
    if (st.ok()) st = d.ikeys.copy_from(s.ikeys);
    if (st.ok()) st = copy_comp(s.comp, d.comp);
    if (st.ok()) st = copy_comp(s.icomp, d.icomp);
    if (!st.ok()) c->error = st;
  }
  c->draft_rings.resize(draft_rings.size());
  for (size_t i = 0; i < draft_rings.size() && c->error.ok(); ++i)
    if (Status st = c->draft_rings[i].copy_from(draft_rings[i]); !st.ok()) c->error = st;
  return c;
}

namespace {

// Native weights when the options or FLASHSEEK_GPU_WEIGHTS ask for them (opt-in for now).
Result<bool> native_weights_wanted(const GpuLoadOptions& o) {
  if (o.native_weights) return *o.native_weights;
  const char* e = std::getenv("FLASHSEEK_GPU_WEIGHTS");
  if (!e || !*e) return false;
  const std::string v(e);
  if (v == "native") return true;
  if (v == "fp32") return false;
  return invalid_argument("FLASHSEEK_GPU_WEIGHTS={}: expected native or fp32", v);
}

// Whether tensor `name` can stay in its stored format for the block-scaled kernels with
// activation block `act`: fills m's shape/format and the stored codes and scales; otherwise the
// reason (the matrix then takes the FP32 path).
std::string plan_native(const model::Checkpoint& ck, const std::string& name, bool expert, int64_t act,
                        NativeMatrix& m, std::span<const uint8_t>& codes, std::span<const uint8_t>& scales) {
  auto t = ck.find(name);
  if (!t.ok()) return "not in the checkpoint";
  const model::TensorView& tv = t.value();
  const bool fp8 = tv.dtype == DType::kF8E4M3;
  const bool fp4 = expert && (tv.dtype == DType::kI8 || tv.dtype == DType::kU8);
  if (!fp8 && !fp4) return fmt::format("stored as {}", dtype_name(tv.dtype));
  if (tv.shape.size() != 2) return fmt::format("shape {} is not 2-D", shape_to_string(tv.shape));
  const std::string sname = model::scale_name_for(name);
  if (!ck.has(sname)) return "no block scale";
  auto s = ck.find(sname);
  if (!s.ok()) return "no block scale";
  const model::TensorView& sv = s.value();
  if (sv.dtype != DType::kF8E8M0 || sv.shape.size() != 2) return "scale is not a 2-D E8M0 tensor";
  m.format = fp4 ? ops::WeightFormat::kFp4 : ops::WeightFormat::kFp8;
  m.n = tv.shape[0];
  m.k = fp4 ? 2 * tv.shape[1] : tv.shape[1];
  m.w_block = fp4 ? 32 : ck.config().weight_block_size;
  m.act_block = act;
  if (fp8 && (sv.shape[0] != (m.n + m.w_block - 1) / m.w_block || sv.shape[1] != (m.k + m.w_block - 1) / m.w_block))
    return fmt::format("scale {} is not {}x{} blocks", shape_to_string(sv.shape), m.w_block, m.w_block);
  if (fp4 && (sv.shape[0] != m.n || sv.shape[1] * 32 != m.k))
    return fmt::format("FP4 scale {} is not one per 32 inputs", shape_to_string(sv.shape));
  ops::BlockLinearParams bp;  // the kernels' shape rules (k multiple of 32, act_block, w_block)
  float dummy = 0;
  bp.x = &dummy, bp.w = tv.data.data(), bp.w_scale = sv.data.data(), bp.y = &dummy;
  bp.m = 1, bp.n = m.n, bp.k = m.k, bp.format = m.format, bp.w_block = m.w_block, bp.act_block = act;
  if (Status st = ops::validate(bp); !st.ok()) return st.message();
  m.code_bytes = ops::weight_code_bytes(m.format, m.n, m.k);
  m.scale_bytes = ops::weight_scale_bytes(m.format, m.n, m.k, m.w_block);
  if (int64_t(tv.data.size()) != m.code_bytes || int64_t(sv.data.size()) != m.scale_bytes)
    return "stored byte sizes do not match the kernel layout";
  codes = tv.data;
  scales = sv.data;
  return {};
}

}  // namespace

Result<std::unique_ptr<GpuModel>> GpuModel::load(const std::string& dir, Numerics numerics, int device,
                                                 const TpShard* shard, ops::cuda::Communicator* comm,
                                                 const GpuLoadOptions& opts) {
  FS_ASSIGN_OR_RETURN(const bool native, native_weights_wanted(opts));
  std::string why;
  if (!ops::cuda::cuda_device_available(&why)) return Status(StatusCode::kUnavailable, fmt::format("--gpus {}: {}", device, why));
  int n = 0;
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&n));
  if (device < 0 || device >= n) return invalid_argument("--gpus {}: this machine has {} CUDA device(s)", device, n);
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  FS_ASSIGN_OR_RETURN(model::Checkpoint ck, model::Checkpoint::open(dir));
  std::unique_ptr<GpuModel> m(new GpuModel());
  m->ck_ = std::make_unique<model::Checkpoint>(std::move(ck));
  FS_ASSIGN_OR_RETURN(m->w_, load_weights(*m->ck_));
  m->numerics_ = numerics;
  m->device_ = device;
  FS_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&m->stream_));  // blocking: orders with the legacy stream
  // CUDA graphs (gpu_graph.cpp): on by default, decode steps replay a cached executable by
  // patching (FLASHSEEK_GPU_GRAPHS=0: eager; FLASHSEEK_GPU_GRAPH_PATCH=0: record every step).
  m->graphs_ = true;
  if (const char* e = std::getenv("FLASHSEEK_GPU_GRAPHS"); e && *e) {
    const std::string v(e);
    if (v != "0" && v != "1") return invalid_argument("FLASHSEEK_GPU_GRAPHS={}: expected 0 or 1", v);
    m->graphs_ = v == "1";
  }
  if (comm && comm->kind() != "nccl") m->graphs_ = false;  // host-staged collectives synchronise
  // NCCL ranks patch too: their all-reduces stay as NCCL captured them and the ranks vote each
  // step (patch / record / eager together). Measured on 2 and 4 H200s (bench/RESULTS.md, lead's
  // final check): bitwise equal to eager, every TP and CLI test passing, slightly faster.
  m->patch_ = m->graphs_;
  if (const char* e = std::getenv("FLASHSEEK_GPU_GRAPH_PATCH"); e && *e) {
    const std::string v(e);
    if (v != "0" && v != "1") return invalid_argument("FLASHSEEK_GPU_GRAPH_PATCH={}: expected 0 or 1", v);
    m->patch_ = v == "1" && m->graphs_;
  }
  const auto& c = m->config();
  const int64_t blk = c.is_v41() ? 32 : 128;  // as CpuModel::load
  if (numerics == Numerics::kReference) {
    m->act_block_ = c.fp8_weights ? blk : 0;
    m->expert_act_block_ = c.fp4_experts || c.fp8_weights ? blk : 0;
  }
  // Native weights (reference numerics, one GPU): FP8 linears and FP4 experts stay as stored.
  // Multi-GPU ranks slice the FP32 copies (gpu_tp.cpp) and keep the FP32 path.
  m->native_ = native && numerics == Numerics::kReference && !shard;
  if (shard) {  // one rank of a multi-GPU model: keep only this rank's slice (gpu_tp.cpp)
    m->shard_ = *shard;
    m->comm_ = comm;
    FS_RETURN_IF_ERROR(shard_weights(m->w_, c, *shard));
  } else {
    FS_ASSIGN_OR_RETURN(m->shard_, make_tp_shard(c, numerics, 0, 1));
  }
  FS_RETURN_IF_ERROR(m->upload_weights());
  return m;
}

Status GpuModel::up(Vec& v) {
  if (v.empty()) return {};
  DevArray<float> a;
  FS_RETURN_IF_ERROR(a.upload(v.data(), v.size()));
  dev_.emplace(&v, std::move(a));
  Vec().swap(v);  // the device copy is the only one from now on
  return {};
}

const float* GpuModel::d(const Vec& v) const {
  const auto it = dev_.find(&v);
  if (it != dev_.end()) return it->second.get();
  const auto nt = native_key_.find(&v);  // native matrix: its key for linear()
  return nt == native_key_.end() ? nullptr : nt->second;
}

void GpuModel::log_fallback(const std::string& what, const std::string& why) {
  std::string kind;  // the tensor name without layer / expert numbers: one line per kind and reason
  for (char ch : what) kind += std::isdigit(static_cast<unsigned char>(ch)) ? 'N' : ch;
  const std::string key = kind + ": " + why;
  if (std::find(logged_.begin(), logged_.end(), key) != logged_.end()) return;
  logged_.push_back(key);
  std::fprintf(stderr, "flashseek gpu: %s: %s; kept as FP32 on the device\n", kind.c_str(), why.c_str());
}

Result<bool> GpuModel::up_native(Vec& v, const std::string& name, int64_t act_block) {
  if (!native_ || v.empty()) return false;
  if (act_block <= 0) {
    log_fallback(name, "no FP8 activation quantisation in this configuration");
    return false;
  }
  NativeMatrix m;
  std::span<const uint8_t> codes, scales;
  const std::string why = plan_native(*ck_, name, false, act_block, m, codes, scales);
  if (!why.empty() || int64_t(v.size()) != m.n * m.k) {
    log_fallback(name, why.empty() ? "shape differs from the loaded matrix" : why);
    return false;
  }
  FS_RETURN_IF_ERROR(m.codes.upload(codes.data(), codes.size()));
  FS_RETURN_IF_ERROR(m.scales.upload(scales.data(), scales.size()));
  const float* key = reinterpret_cast<const float*>(m.codes.get());
  native_key_[&v] = key;
  native_w_.emplace(key, std::move(m));
  ++n_native_;
  Vec().swap(v);
  return true;
}

Result<bool> GpuModel::up_native_experts(int l, FfnWeights& F) {
  if (!native_ || F.w1.empty()) return false;
  const std::string p = fmt::format("layers.{}.ffn.experts.", l);
  if (expert_act_block_ <= 0) {
    log_fallback(p + "0.w1.weight", "no FP8 activation quantisation in this configuration");
    return false;
  }
  const int64_t E = int64_t(F.w1.size());
  std::vector<NativeMatrix>* dst[3] = {&nw1_, &nw2_, &nw3_};
  std::vector<Vec>* src[3] = {&F.w1, &F.w2, &F.w3};
  const char* proj[3] = {"w1", "w2", "w3"};
  NativeMatrix mats[3];
  std::vector<uint8_t> codes[3], scales[3];
  for (int j = 0; j < 3; ++j) {  // every expert of a projection: one format and shape
    for (int64_t e = 0; e < E; ++e) {
      NativeMatrix m;
      std::span<const uint8_t> c, s;
      const std::string name = fmt::format("{}{}.{}.weight", p, e, proj[j]);
      std::string why = plan_native(*ck_, name, true, expert_act_block_, m, c, s);
      if (why.empty() && int64_t((*src[j])[size_t(e)].size()) != m.n * m.k) why = "shape differs from the loaded matrix";
      if (why.empty() && e > 0 && (m.format != mats[j].format || m.n != mats[j].n || m.k != mats[j].k))
        why = "experts differ in format or shape";
      if (!why.empty()) {
        log_fallback(name, why);
        return false;
      }
      if (e == 0) {
        mats[j] = std::move(m);
        codes[j].reserve(size_t(mats[j].code_bytes * E));
        scales[j].reserve(size_t(mats[j].scale_bytes * E));
      }
      codes[j].insert(codes[j].end(), c.begin(), c.end());
      scales[j].insert(scales[j].end(), s.begin(), s.end());
    }
  }
  for (int j = 0; j < 3; ++j) {
    NativeMatrix& m = mats[j];
    m.count = E;
    FS_RETURN_IF_ERROR(m.codes.upload(codes[j].data(), codes[j].size()));
    FS_RETURN_IF_ERROR(m.scales.upload(scales[j].data(), scales[j].size()));
    (*dst[j])[size_t(l)] = std::move(m);
    for (Vec& v : *src[j]) Vec().swap(v);
  }
  n_native_ += 3 * E;
  return true;
}

int64_t GpuModel::weight_bytes() const {
  int64_t b = 0;
  for (const auto& [v, a] : dev_) b += int64_t(a.capacity() * sizeof(float));
  for (const auto* s : {&w1_, &w2_, &w3_, &dw1_, &dw2_, &dw3_})
    for (const auto& a : *s) b += int64_t(a.capacity() * sizeof(float));
  for (const auto* s : {&tid2eid_, &dtid2eid_})
    for (const auto& a : *s) b += int64_t(a.capacity() * sizeof(int32_t));
  for (const auto& [k, m] : native_w_) b += int64_t(m.codes.capacity() + m.scales.capacity());
  for (const auto* s : {&nw1_, &nw2_, &nw3_})
    for (const auto& m : *s) b += int64_t(m.codes.capacity() + m.scales.capacity());
  return b;
}

Status GpuModel::upload_weights() {
  auto comp = [&](CompressorWeights& w) -> Status {
    for (Vec* v : {&w.wkv, &w.wgate, &w.ape, &w.norm}) FS_RETURN_IF_ERROR(up(*v));
    return {};
  };
  auto stack = [&](std::vector<Vec>& ws, DevArray<float>& out) -> Status {
    const size_t each = ws.empty() ? 0 : ws[0].size();
    FS_RETURN_IF_ERROR(out.reserve(std::max<size_t>(1, each * ws.size()), false));
    for (size_t e = 0; e < ws.size(); ++e) {
      FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.get() + e * each, ws[e].data(), each * 4, cudaMemcpyHostToDevice));
      Vec().swap(ws[e]);
    }
    return {};
  };
  for (Vec* v : {&w_.embed, &w_.head, &w_.norm, &w_.hc_head_fn, &w_.hc_head_base, &w_.hc_head_scale})
    FS_RETURN_IF_ERROR(up(*v));
  const size_t nl = w_.layers.size();
  w1_.resize(nl), w2_.resize(nl), w3_.resize(nl), tid2eid_.resize(nl);
  nw1_.resize(nl), nw2_.resize(nl), nw3_.resize(nl);
  for (size_t l = 0; l < nl; ++l) {
    LayerWeights& L = w_.layers[l];
    // Native weights first: the FP8 linears that always run with FP8 activations (act_block_);
    // what stays in `w_` afterwards goes up as FP32 below (up() skips emptied matrices).
    const std::string p = fmt::format("layers.{}.", l);
    const std::pair<Vec*, const char*> fp8_linears[] = {
        {&L.attn.wq_a, "attn.wq_a.weight"},       {&L.attn.wq_b, "attn.wq_b.weight"},
        {&L.attn.wkv, "attn.wkv.weight"},         {&L.attn.wo_b, "attn.wo_b.weight"},
        {&L.attn.idx_wq_b, "attn.indexer.wq_b.weight"}, {&L.ffn.s_w1, "ffn.shared_experts.w1.weight"},
        {&L.ffn.s_w2, "ffn.shared_experts.w2.weight"},  {&L.ffn.s_w3, "ffn.shared_experts.w3.weight"},
        {&L.engram.wkv, "engram.wkv.weight"}};
    for (const auto& [v, name] : fp8_linears) FS_RETURN_IF_ERROR(up_native(*v, p + name, act_block_).status());
    FS_ASSIGN_OR_RETURN(const bool native_experts, up_native_experts(int(l), L.ffn));
    for (Vec* v : {&L.hc_attn_fn, &L.hc_attn_base, &L.hc_attn_scale, &L.hc_ffn_fn, &L.hc_ffn_base,
                   &L.hc_ffn_scale, &L.attn_norm, &L.ffn_norm})
      FS_RETURN_IF_ERROR(up(*v));
    AttentionWeights& A = L.attn;
    for (Vec* v : {&A.wq_a, &A.q_norm, &A.wq_b, &A.wkv, &A.kv_norm, &A.wo_a, &A.wo_b, &A.attn_sink, &A.idx_wq_b,
                   &A.idx_weights_proj, &A.idx_wk, &A.idx_k_norm, &A.rope_inv_freq})
      FS_RETURN_IF_ERROR(up(*v));
    FS_RETURN_IF_ERROR(comp(A.compressor));
    FS_RETURN_IF_ERROR(comp(A.idx_compressor));
    FfnWeights& F = L.ffn;
    for (Vec* v : {&F.gate, &F.bias, &F.s_w1, &F.s_w2, &F.s_w3}) FS_RETURN_IF_ERROR(up(*v));
    if (!native_experts) {
      FS_RETURN_IF_ERROR(stack(F.w1, w1_[l]));
      FS_RETURN_IF_ERROR(stack(F.w2, w2_[l]));
      FS_RETURN_IF_ERROR(stack(F.w3, w3_[l]));
    }
    if (!F.tid2eid.empty()) FS_RETURN_IF_ERROR(tid2eid_[l].upload(F.tid2eid.data(), F.tid2eid.size()));
    for (Vec* v : {&L.engram.wkv, &L.engram.wqk}) FS_RETURN_IF_ERROR(up(*v));
  }
  if (has_draft()) FS_RETURN_IF_ERROR(upload_draft_weights());
  return {};
}

template <typename T>
Result<T*> GpuModel::scratch(const std::string& name, int64_t n) {
  auto& a = scratch_[name];
  FS_RETURN_IF_ERROR(a.reserve(std::max<size_t>(16, size_t(n) * sizeof(T)), false, /*geometric=*/true));
  return reinterpret_cast<T*>(a.get());
}
template Result<float*> GpuModel::scratch<float>(const std::string&, int64_t);
template Result<int32_t*> GpuModel::scratch<int32_t>(const std::string&, int64_t);
template Result<int64_t*> GpuModel::scratch<int64_t>(const std::string&, int64_t);
template Result<uint8_t*> GpuModel::scratch<uint8_t>(const std::string&, int64_t);
template Result<const float**> GpuModel::scratch<const float*>(const std::string&, int64_t);

Status GpuModel::linear(const float* x, const float* w, int64_t rows, int64_t in, int64_t out, float* y,
                        int64_t act_block, bool bf16_out, bool bf16_in, const int32_t* sel, int64_t x_row_div) {
  if (!w) return internal_error("gpu linear: missing weight ({}x{})", out, in);
  if (const auto it = native_w_.find(w); it != native_w_.end())
    return linear_native(it->second, x, rows, in, out, y, act_block, bf16_out, bf16_in, sel, x_row_div);
  if (act_block > 0 || bf16_in) {
    if (act_block > 0 && in % act_block != 0)
      return invalid_argument("gpu linear: input width {} is not a multiple of the activation block {}", in, act_block);
    const int64_t xr = (rows + x_row_div - 1) / x_row_div;
    FS_ASSIGN_OR_RETURN(float* xq, scratch<float>("linear_xq", xr * in));
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(xq, x, size_t(xr * in) * 4, cudaMemcpyDeviceToDevice, stream_));
    if (bf16_in) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(xq, xr, in, in, 1, cd::QuantSim::kBf16, stream_));
    if (act_block > 0) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(xq, xr, in, in, act_block, cd::QuantSim::kFp8, stream_));
    x = xq;
  }
  cd::LinearArgs a;
  a.x = x, a.w = w, a.y = y, a.sel = sel, a.rows = rows, a.in = in, a.out = out, a.x_row_div = x_row_div;
  a.bf16_out = bf16_out;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_linear(a, stream_));
  return {};
}

// A native FP8 matrix: y = fq8(bf16?(x)) · dq(W)ᵀ by the block-scaled GEMV kernel (ops/cuda/gemv.h),
// the numerics of the FP32 path's quant_sim + FP32 dot (only the summation order differs).
Status GpuModel::linear_native(const NativeMatrix& nw, const float* x, int64_t rows, int64_t in, int64_t out,
                               float* y, int64_t act_block, bool bf16_out, bool bf16_in, const int32_t* sel,
                               int64_t x_row_div) {
  if (sel || x_row_div != 1 || in != nw.k || out != nw.n || act_block != nw.act_block)
    return internal_error("gpu linear: native {}x{} matrix (act block {}) used as {}x{} (act block {}{})", nw.n,
                          nw.k, nw.act_block, out, in, act_block, sel ? ", selected rows" : "");
  if (bf16_in) {
    FS_ASSIGN_OR_RETURN(float* xb, scratch<float>("linear_xq", rows * in));
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(xb, x, size_t(rows * in) * 4, cudaMemcpyDeviceToDevice, stream_));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(xb, rows, in, in, 1, cd::QuantSim::kBf16, stream_));
    x = xb;
  }
  ops::BlockLinearParams p;
  p.x = x, p.w = nw.codes.get(), p.w_scale = nw.scales.get(), p.y = y;
  p.m = rows, p.n = out, p.k = in, p.format = nw.format, p.w_block = nw.w_block, p.act_block = act_block;
  FS_RETURN_IF_ERROR(ops::cuda::block_linear_cuda(p, stream_));
  if (bf16_out) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(y, rows, out, out, 1, cd::QuantSim::kBf16, stream_));
  return {};
}

std::unique_ptr<SequenceState> GpuModel::new_sequence() const {
  const auto& c = config();
  auto st = std::make_unique<GpuSequenceState>();
  st->ring_size = c.window + kMaxRollback;  // spare slots: rolled-back rows never overwrite live ones
  st->layers.resize(size_t(c.num_layers));
  if (Status s = ops::cuda::cuda_status(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) st->error = s;
  for (auto& l : st->layers) {
    if (!st->error.ok()) break;
    if (Status s = l.ring.zeros(size_t(st->ring_size * c.head_dim)); !s.ok()) st->error = s;
  }
  if (has_draft()) st->draft_rings.resize(size_t(c.num_mtp_layers));
  for (auto& r : st->draft_rings)
    if (Status s = r.zeros(size_t(st->ring_size * c.head_dim)); st->error.ok() && !s.ok()) st->error = s;
  return st;
}

Status GpuModel::forward(std::span<BatchItem> batch, std::vector<float>& logits) {
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const int64_t V = config().vocab_size;
  bool small = graphs_ && !batch.empty();
  for (auto& item : batch) {  // checks first: a capture never starts on bad input
    auto* st = dynamic_cast<GpuSequenceState*>(item.state);
    if (!st) return invalid_argument("forward: batch item has no GPU sequence state");
    if (!st->error.ok()) return st->error;
    if (item.tokens.empty()) return invalid_argument("forward: a batch item has no tokens");
    for (int32_t t : item.tokens)
      if (t < 0 || t >= V) return invalid_argument("forward: token id {} outside the vocabulary [0, {})", t, V);
    small = small && int64_t(item.tokens.size()) <= kGpuGraphMaxTokens;
  }
  ++gstats_.forwards;
  timed_ = true;  // decode-sized (host and wait time accumulated by finish_forward)
  for (auto& item : batch) timed_ = timed_ && int64_t(item.tokens.size()) <= kGpuGraphMaxTokens;
  fwd_t0_ = std::chrono::steady_clock::now();
  const size_t off0 = logits.size();
  if (small) {
    ++gstats_.eligible;
    bool ran = false;
    Status s = forward_graph(batch, logits, ran);
    if (ran || !s.ok()) return s;
    ++gstats_.eager_fallbacks;
  }
  Status s = run_items(batch, logits);
  Status f = finish_forward(logits);  // always: waits for what was queued, rewinds the staging
  if (!s.ok() || !f.ok()) {
    logits.resize(off0);
    return s.ok() ? f : s;
  }
  return {};
}

Status GpuModel::run_items(std::span<BatchItem> batch, std::vector<float>& logits) {
  for (auto& item : batch) {  // items one after the other: batch invariance by construction
    if (item.sample && item.all_logits) return invalid_argument("forward: an item cannot ask for all logits and a sample");
    FS_RETURN_IF_ERROR(forward_one(*static_cast<GpuSequenceState*>(item.state), item.tokens, item.all_logits, logits,
                                   item.sample, &item.sampled));
  }
  return {};
}

Status GpuModel::upload_staged(void* dst, const void* staged, size_t bytes) {
  if (bytes) FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(dst, staged, bytes, cudaMemcpyHostToDevice, stream_));
  return {};
}

Status GpuModel::upload(void* dst, const void* src, size_t bytes) {
  if (!bytes) return {};
  FS_ASSIGN_OR_RETURN(void* h, staging_.alloc(bytes));
  std::memcpy(h, src, bytes);
  return upload_staged(dst, h, bytes);
}

Status GpuModel::download_logits(const float* d_logits, int64_t n, std::vector<float>& logits) {
  const size_t off = logits.size(), bytes = size_t(n) * 4;
  logits.resize(off + size_t(n));
  constexpr size_t kDirect = size_t(64) << 20;  // huge (prefill, all rows): straight into the vector
  if (bytes > kDirect && !capture_guard().active) {
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(logits.data() + off, d_logits, bytes, cudaMemcpyDeviceToHost, stream_));
    return {};  // pageable destination: the copy has completed when the call returns
  }
  FS_ASSIGN_OR_RETURN(float* h, staging<float>(n));
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(h, d_logits, bytes, cudaMemcpyDeviceToHost, stream_));
  pending_logits_.push_back({off, h, size_t(n)});
  return {};
}

Status GpuModel::queue_download(void* host_dst, const void* d_src, size_t bytes) {
  if (!bytes) return {};
  FS_ASSIGN_OR_RETURN(void* h, staging_.alloc(bytes));
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(h, d_src, bytes, cudaMemcpyDeviceToHost, stream_));
  pending_bytes_.push_back({host_dst, h, bytes});
  return {};
}

Status GpuModel::finish_forward(std::vector<float>& logits) {
  const auto t1 = std::chrono::steady_clock::now();
  Status s = ops::cuda::cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (timed_) {
    const auto t2 = std::chrono::steady_clock::now();
    ++gstats_.timed;
    gstats_.host_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - fwd_t0_).count();
    gstats_.wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t1).count();
    timed_ = false;
  }
  if (s.ok()) {
    for (const PendingCopy& p : pending_logits_) std::memcpy(logits.data() + p.off, p.src, p.n * 4);
    for (const PendingBytes& p : pending_bytes_) std::memcpy(p.dst, p.src, p.bytes);
  }
  pending_logits_.clear();
  pending_bytes_.clear();
  Status r = staging_.rewind();
  return s.ok() ? r : s;
}

Status GpuModel::forward_one(GpuSequenceState& st, std::span<const int32_t> tokens, bool all_logits,
                             std::vector<float>& logits, const ops::SampleSpec* sample, int32_t* sampled) {
  const auto& c = config();
  const int64_t T = int64_t(tokens.size()), D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  if (T == 0) return invalid_argument("forward: a batch item has no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= V) return invalid_argument("forward: token id {} outside the vocabulary [0, {})", t, V);
  const bool v41 = c.is_v41(), R = ref();
  GpuChunk ctx;
  ctx.st = &st;
  ctx.tokens = tokens;
  ctx.start = st.len;
  ctx.T = T;
  for (int64_t t = 0; t < T; ++t) ctx.pos.push_back(st.len + t);
  ctx.topk.assign(size_t(c.num_layers), nullptr);
  ctx.topk_n.assign(size_t(c.num_layers), nullptr);
  FS_ASSIGN_OR_RETURN(int32_t* d_tok, scratch<int32_t>("tokens", T));
  FS_ASSIGN_OR_RETURN(int64_t* d_pos, scratch<int64_t>("pos", T));
  FS_RETURN_IF_ERROR(upload(d_tok, tokens.data(), size_t(T) * 4));
  FS_RETURN_IF_ERROR(upload(d_pos, ctx.pos.data(), size_t(T) * 8));
  ctx.d_tokens = d_tok;
  ctx.d_pos = d_pos;
  FS_ASSIGN_OR_RETURN(ctx.cand, scratch<uint8_t>("cand", T * (ctx.start + T)));
  if (v41 && !c.engram_layer_ids.empty()) {  // hash ids on the host (CpuModel::compute_engram_ids)
    const size_t n_back = std::min(st.engram_hist.size(), size_t(c.engram_max_ngram_size - 1));
    std::vector<int64_t> cids(st.engram_hist.end() - int64_t(n_back), st.engram_hist.end());
    for (int32_t t : tokens) cids.push_back(w_.engram_token_map[size_t(t)]);
    for (int layer : c.engram_layer_ids) {
      const auto& lay = w_.layers[size_t(layer)].engram.layout;
      std::vector<int64_t> ids(size_t(T * lay.n_cols()));
      ops::engram_hash(lay, cids.data(), int64_t(n_back), T, ctx.start, w_.engram_pad_c, ids.data());
      ctx.engram_ids.insert(ctx.engram_ids.end(), ids.begin(), ids.end());
    }
  }
  FS_ASSIGN_OR_RETURN(float* X, scratch<float>("X", T * hc * D));  // [T, hc, D]
  FS_CUDA_RETURN_IF_ERROR(cd::launch_embed(d(w_.embed), d_tok, X, T, hc, D, stream_));
  std::vector<float> pre_h(size_t(T * hc), 0.0f);  // V4.1: one-hot for layer 0
  for (int64_t t = 0; t < T; ++t) pre_h[size_t(t * hc)] = 1.0f;
  FS_ASSIGN_OR_RETURN(float* pre_in, scratch<float>("pre_in", T * hc));
  FS_RETURN_IF_ERROR(upload(pre_in, pre_h.data(), pre_h.size() * 4));
  float* taps = nullptr;  // DSpark taps [n_taps, T, D] (v41 §5.2)
  if (has_draft()) {
    FS_ASSIGN_OR_RETURN(taps, scratch<float>("dspark_taps", int64_t(c.dspark_target_layer_ids.size()) * T * D));
  }
  for (int l = 0; l < int(c.num_layers); ++l) {
    if (w_.layers[size_t(l)].has_engram) FS_RETURN_IF_ERROR(engram(l, ctx, X));
    if (taps) FS_RETURN_IF_ERROR(append_tap(l, ctx, X, taps));
    FS_RETURN_IF_ERROR(block(l, ctx, X, pre_in));
  }
  if (taps) FS_RETURN_IF_ERROR(write_draft_rings(ctx, taps));
  // Final collapse (V4.1: the last FFN pre; V4: hc_head), norm, FP32 head.
  const int64_t r0 = all_logits ? 0 : T - 1, nr = T - r0;
  const float* Xr = X + r0 * hc * D;
  const float* pre = pre_in + r0 * hc;
  const float eps = float(c.rms_norm_eps);
  if (!v41) {
    FS_ASSIGN_OR_RETURN(float* ph, scratch<float>("pre_head", nr * hc));
    cd::HcMixArgs a;
    a.x = Xr, a.fn = d(w_.hc_head_fn), a.base = d(w_.hc_head_base), a.scale = d(w_.hc_head_scale);
    a.rows = nr, a.hc = hc, a.dim = D, a.norm_eps = eps, a.hc_eps = float(c.hc_eps), a.head_only = true, a.pre = ph;
    FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_mixes(a, stream_));
    pre = ph;
  }
  FS_ASSIGN_OR_RETURN(float* y, scratch<float>("final_y", nr * D));
  const int64_t Vr = shard_.vocab;  // this rank's vocabulary rows (all of them on one GPU)
  FS_ASSIGN_OR_RETURN(float* lg, scratch<float>("logits", nr * Vr));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_collapse(Xr, pre, y, nr, hc, D, R, stream_));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(y, d(w_.norm), y, nr, D, eps, R, stream_));
  FS_RETURN_IF_ERROR(linear(y, d(w_.head), nr, D, Vr, lg, 0, false));
  // The logits leave the device here, or only the token sampled from the last row (BatchItem::sample).
  if (sample) FS_RETURN_IF_ERROR(sample_last_row(lg + (nr - 1) * Vr, *sample, sampled));
  else FS_RETURN_IF_ERROR(download_logits(lg, nr * Vr, logits));
  FS_CUDA_RETURN_IF_ERROR(cudaGetLastError());

  if (v41 && !c.engram_layer_ids.empty()) {  // Engram look-back: last N−1 ids (+ rollback reserve)
    for (int32_t t : tokens) st.engram_hist.push_back(w_.engram_token_map[size_t(t)]);
    const size_t keep = size_t(c.engram_max_ngram_size - 1 + kMaxRollback);
    if (st.engram_hist.size() > keep) st.engram_hist.erase(st.engram_hist.begin(), st.engram_hist.end() - keep);
  }
  st.len += T;
  return {};
}

Status GpuModel::block(int l, GpuChunk& ctx, float* X, float* pre_in) {
  return mhc_block(
      w_.layers[size_t(l)], "", ctx, X, pre_in, [&](const float* a, float* f) { return attention(l, ctx, a, f); },
      [&](const float* a, float* f) { return moe(l, ctx, a, f); });
}

Status GpuModel::mhc_block(const LayerWeights& L, const std::string& tag, GpuChunk& ctx, float* X, float* pre_in,
                           const Sublayer& attn, const Sublayer& ffn) {
  const auto& c = config();
  const bool v41 = c.is_v41(), R = ref();
  const int64_t T = ctx.T, hc = c.hc_mult, D = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  FS_ASSIGN_OR_RETURN(float* pre_a, scratch<float>(tag + "pre_a", T * hc));
  FS_ASSIGN_OR_RETURN(float* pre_f, scratch<float>(tag + "pre_f", T * hc));
  FS_ASSIGN_OR_RETURN(float* post, scratch<float>(tag + "post", T * hc));
  FS_ASSIGN_OR_RETURN(float* comb, scratch<float>(tag + "comb", T * hc * hc));
  FS_ASSIGN_OR_RETURN(float* u, scratch<float>(tag + "u", T * D));
  FS_ASSIGN_OR_RETURN(float* a, scratch<float>(tag + "a", T * D));
  FS_ASSIGN_OR_RETURN(float* f, scratch<float>(tag + "f", T * D));
  auto mixes = [&](const Vec& fn, const Vec& base, const Vec& scale, float* pre) -> Status {
    cd::HcMixArgs m;
    m.x = X, m.fn = d(fn), m.base = d(base), m.scale = d(scale), m.rows = T, m.hc = hc, m.dim = D;
    m.norm_eps = eps, m.hc_eps = float(c.hc_eps), m.sinkhorn_iters = c.hc_sinkhorn_iters;
    m.pre = pre, m.post = post, m.comb = comb;
    FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_mixes(m, stream_));
    return {};
  };
  FS_RETURN_IF_ERROR(mixes(L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, pre_a));
  // V4.1 applies the previous sublayer's pre weights to the current stream (v41 §2 item 1).
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_collapse(X, v41 ? pre_in : pre_a, u, T, hc, D, R, stream_));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(u, d(L.attn_norm), a, T, D, eps, R, stream_));
  FS_RETURN_IF_ERROR(attn(a, f));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_post(f, X, post, comb, T, hc, D, R, stream_));
  FS_RETURN_IF_ERROR(mixes(L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, pre_f));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_collapse(X, v41 ? pre_a : pre_f, u, T, hc, D, R, stream_));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(u, d(L.ffn_norm), a, T, D, eps, R, stream_));
  FS_RETURN_IF_ERROR(ffn(a, f));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_post(f, X, post, comb, T, hc, D, R, stream_));
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(pre_in, pre_f, size_t(T * hc) * 4, cudaMemcpyDeviceToDevice, stream_));
  return {};
}

Status GpuModel::engram(int layer, GpuChunk& ctx, float* X) {
  const auto& c = config();
  const EngramWeights& E = w_.layers[size_t(layer)].engram;
  const int64_t T = ctx.T, D = c.hidden_size, hc = c.hc_mult, de = c.engram_head_dim, nc = E.layout.n_cols();
  int64_t li = 0;
  while (c.engram_layer_ids[size_t(li)] != layer) ++li;
  const int64_t* ids = ctx.engram_ids.data() + li * T * nc;
  // Rows gathered on the host from the checkpoint (tables stay out of GPU memory) straight into
  // pinned staging, then uploaded on the stream (under graph capture the gather runs at capture
  // time and the graph's copy node reads the staged rows when it is launched).
  FS_ASSIGN_OR_RETURN(float* e, staging<float>(T * nc * de));
  for (int64_t i = 0; i < T * nc; ++i)
    FS_RETURN_IF_ERROR(ck_->dequant_rows(E.table, ids[i], ids[i] + 1, std::span<float>(e + i * de, size_t(de))));
  FS_ASSIGN_OR_RETURN(float* de_rows, scratch<float>("engram_e", T * nc * de));
  FS_ASSIGN_OR_RETURN(float* kv, scratch<float>("engram_kv", T * (hc + 1) * D));
  FS_RETURN_IF_ERROR(upload_staged(de_rows, e, size_t(T * nc * de) * 4));
  FS_RETURN_IF_ERROR(linear(de_rows, d(E.wkv), T, nc * de, (hc + 1) * D, kv, act_block_, ref()));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_engram_gate(X, kv, d(E.wqk), T, hc, D, float(c.rms_norm_eps), ref(), stream_));
  return {};
}

}  // namespace gpu
}  // namespace flashseek::forward

#else  // no CUDA in this build

namespace flashseek::forward {
bool gpu_backend_built() { return false; }
Result<uint64_t> gpu_memory_free(int device) {
  return Status(StatusCode::kUnimplemented,
                fmt::format("--gpus {}: this build has no CUDA backend (configure with nvcc found)", device));
}
Result<std::unique_ptr<Model>> load_model_gpu(const std::string&, Numerics, int device, const GpuLoadOptions&) {
  return Status(StatusCode::kUnimplemented,
                fmt::format("--gpus {}: this build has no CUDA backend (configure with nvcc found)", device));
}
}  // namespace flashseek::forward

#endif
