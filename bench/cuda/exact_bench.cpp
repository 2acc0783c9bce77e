// `flashseek bench --kernels exact` (kernel_bench.h): the exactness kernels of the GPU model
// (ops/cuda/model/model_kernels.h) on the decode shapes of DeepSeek-V4.1-Flash, CUDA events,
// median of `reps` samples of 10 launches, weights in rotating copies (>= 3x the L2) so HBM is
// measured. The chunked linear is timed with each kernel (LinearArgs::kernel 1: a block per
// (row, output), the former kernel; 2: the GEMV; 3: the streaming GEMV, up to 8 rows), which give
// the same bits, and at 4096 prefill rows the GEMV against the tiled kernel (4); so is the decode attention (ModelAttnArgs::kernel 1: the former kernel, 2: the
// staged one) and the mHC mixes (HcMixArgs::kernel 1: the row kernel; automatic: the chunk-split
// kernel). The small row ops (rms_norm, mHC mixes, RoPE, quant_sim, ...) read data that stays in
// L2: their times are latency.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bench/cuda/bench_util.h"
#include "bench/cuda/kernel_bench.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/small_kernels.h"
#include "ops/cuda/runtime/cuda_check.h"

namespace flashseek::ops::cuda {
namespace cd = detail;

namespace {

constexpr double kL2Bytes = 50e6;  // H200: 50 MB

struct TypedMat {
  cd::WeightDtype dt = cd::WeightDtype::kBf16;
  int64_t n = 0, k = 0, block = 128;
  std::vector<uint8_t*> data, scale;  // per copy
  double bytes() const {
    const double vals = double(n * k) * (dt == cd::WeightDtype::kBf16 ? 2.0 : 1.0);
    const double sc = dt == cd::WeightDtype::kFp8 ? double(((n + block - 1) / block) * ((k + block - 1) / block)) : 0.0;
    return vals + sc;
  }
  cd::WeightRef ref(int copy) const {
    cd::WeightRef w;
    const size_t c = size_t(copy) % data.size();
    w.dtype = dt, w.data = data[c], w.cols = k;
    if (dt == cd::WeightDtype::kFp8) w.scale = scale[c], w.block_rows = block, w.block_cols = block;
    return w;
  }
};

Status make_typed(bench::Arena& ar, TypedMat& m, cd::WeightDtype dt, int64_t n, int64_t k, uint64_t seed) {
  m.dt = dt, m.n = n, m.k = k;
  const int copies = bench::copies_for(m.bytes(), kL2Bytes);
  for (int c = 0; c < copies; ++c) {
    const int64_t vb = n * k * (dt == cd::WeightDtype::kBf16 ? 2 : 1);
    FS_ASSIGN_OR_RETURN(uint8_t* d, ar.alloc<uint8_t>(vb));
    // BF16: random bytes (timing does not depend on the values); FP8: e4m3 codes without NaN.
    FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_bytes(d, vb, seed + 17 * uint64_t(c), dt == cd::WeightDtype::kFp8 ? 1 : 0,
                                                  nullptr));
    m.data.push_back(d);
    if (dt == cd::WeightDtype::kFp8) {
      const int64_t sb = ((n + m.block - 1) / m.block) * ((k + m.block - 1) / m.block);
      FS_ASSIGN_OR_RETURN(uint8_t* s, ar.alloc<uint8_t>(sb));
      FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_bytes(s, sb, seed + 17 * uint64_t(c) + 5, 2, nullptr));
      m.scale.push_back(s);
    }
  }
  return {};
}

std::string pct(double bytes, double us, double copy_gbps) {
  const double gbps = bytes / (us * 1e-6) / 1e9;
  return fmt::format("{:.0f} GB/s = {:.0f} %", gbps, 100.0 * gbps / copy_gbps);
}

}  // namespace

Result<std::string> exact_kernels_bench(int reps) {
  double copy_gbps = 0;
  FS_RETURN_IF_ERROR(bench::measure_copy(&copy_gbps));
  bench::Arena ar;
  const int64_t kMaxRows = 200, kMaxIn = 16384;
  FS_ASSIGN_OR_RETURN(float* x, ar.alloc<float>(kMaxRows * kMaxIn));
  FS_ASSIGN_OR_RETURN(float* y, ar.alloc<float>(kMaxRows * 129280));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_floats(x, kMaxRows * kMaxIn, 11, 1.0f, nullptr));
  std::string md = fmt::format(
      "### Exactness kernels of the GPU model (median of {} samples x 10 launches; copy bandwidth {:.0f} GB/s "
      "read + write)\n\n"
      "Linears: kernel 1 = the former kernels (in > 1024: one block per (row, output); in <= 1024: 8 lanes per "
      "output), 2 = the GEMVs, 3 = the streaming GEMV (in > 1024, up to 8 rows; the automatic choice there); "
      "same bits. Bandwidth: weight bytes over the time of the fastest of 2 and 3, against the copy bandwidth; "
      "speed-up: kernel 1 over that. Kernel 5 = the BF16 tensor-core linear of BF16 inputs (LinearArgs::x_bf16: "
      "another summation order, the model's choice for wo_a and the LM head in reference numerics), its weight "
      "bandwidth.\n\n"
      "| op | shape | rows | kernel 1 us | kernel 2 us | kernel 3 us | best bandwidth (weights) | speed-up | kernel 5 us "
      "| kernel 5 bandwidth |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n",
      reps, copy_gbps);
  struct LinCase {
    const char* name;
    cd::WeightDtype dt;
    int64_t n, k, rows;
    int64_t groups = 1;  // a grouped launch (LinearArgs::groups): n / groups outputs per group
  };
  const LinCase lcases[] = {
      {"LM head (BF16)", cd::WeightDtype::kBf16, 129280, 4096, 1},
      {"LM head (BF16), the DSpark draft's rows", cd::WeightDtype::kBf16, 129280, 4096, 5},
      {"LM head (BF16), a 6-token verify block", cd::WeightDtype::kBf16, 129280, 4096, 6},
      {"wo_a, 8 groups in one launch (FP8 128x128, as the model runs it)", cd::WeightDtype::kFp8, 8192, 4096, 1, 8},
      {"wo_a, 8 groups in one launch (FP8 128x128, as the model runs it)", cd::WeightDtype::kFp8, 8192, 4096, 6, 8},
      {"wo_a group (FP8 128x128)", cd::WeightDtype::kFp8, 1024, 4096, 1},
      {"wo_a group (FP8 128x128)", cd::WeightDtype::kFp8, 1024, 4096, 6},
      {"wo_a group (FP8 128x128)", cd::WeightDtype::kFp8, 1024, 4096, 16},
      {"wo_a group (FP8 128x128)", cd::WeightDtype::kFp8, 1024, 4096, 200},
      {"router gate (BF16)", cd::WeightDtype::kBf16, 256, 4096, 1},
      {"router gate (BF16)", cd::WeightDtype::kBf16, 256, 4096, 6},
      {"q up-projection, in = 1024 (FP8 128x128, short order)", cd::WeightDtype::kFp8, 32768, 1024, 1},
      {"q up-projection, in = 1024 (FP8 128x128, short order)", cd::WeightDtype::kFp8, 32768, 1024, 6},
  };
  uint64_t seed = 100;
  for (const LinCase& c : lcases) {
    TypedMat m;
    FS_RETURN_IF_ERROR(make_typed(ar, m, c.dt, c.n, c.k, ++seed));
    double us[6] = {0, 0, 0, 0, 0, 0};
    const bool stream = c.k > 1024 && c.rows <= 8;  // where kernel 3 applies (aligned weights, k % 16 == 0)
    for (int kernel : {1, 2, 3, 5}) {
      if (kernel == 3 && !stream) continue;
      double med = 0, mn = 0;
      FS_RETURN_IF_ERROR(bench::time_op(
          [&](int call) {
            cd::LinearArgs a;
            a.x = x, a.wt = m.ref(call), a.y = y, a.rows = c.rows, a.in = c.k, a.out = c.n / c.groups, a.kernel = kernel;
            a.x_bf16 = kernel == 5;
            if (c.groups > 1)  // group g: x columns [g·k, (g+1)·k), outputs [g·n/G, (g+1)·n/G) of each row
              a.groups = c.groups, a.x_stride = c.groups * c.k, a.x_group = c.k, a.y_stride = c.n, a.y_group = a.out;
            return cuda_status(cd::launch_linear(a, bench::g_st), "exact linear");
          },
          reps, &med, &mn));
      us[kernel] = med;
    }
    const double best = stream ? std::min(us[2], us[3]) : us[2];
    md += fmt::format("| {} | [{} x {}] | {} | {:.1f} | {:.1f} | {} | {} | {:.2f}x | {:.1f} | {} |\n", c.name, c.n, c.k,
                      c.rows, us[1], us[2], stream ? fmt::format("{:.1f}", us[3]) : std::string("-"),
                      pct(m.bytes(), best, copy_gbps), us[1] / best, us[5], pct(m.bytes(), us[5], copy_gbps));
  }
  // Prefill rows: 4096 rows of a prefill chunk through the GEMV (kernel 2) and the tiled kernel (4),
  // same bits (the outputs compared). These are compute-bound (each weight feeds 4096 rows): the
  // rate is 2·rows·n·k / time against the FP32 FMA peak of an H200 (~67 TFLOPs); the exact order's
  // products and sums are separate FMUL and FADD instructions (mul_add: no FMA, the CPU twin's
  // rounding), so its bound is half that. Few samples: kernel 2 takes tens of ms here.
  {
    const int64_t kRows = 4096;
    md += "\nPrefill rows (exactness linears over a 4096-token chunk): kernel 2 = the GEMV (row groups of 4), 4 = the "
          "tiled kernel (weights of a chunk in registers, 4 outputs per x value, up to 64 rows per block); same bits "
          "(compared). TFLOPs: 2 x rows x n x k over the time, % of the 67 TFLOPs FP32 FMA peak (the exact order uses "
          "a separate FMUL and FADD per product: its bound is ~33.5).\n\n"
          "| op | shape | rows | kernel 2 us | kernel 4 us | kernel 2 TFLOPs | kernel 4 TFLOPs (% of 67) | speed-up | "
          "same bits |\n|---|---|---|---|---|---|---|---|---|\n";
    const LinCase pcases[] = {
        {"wo_a, 8 groups in one launch (FP8 128x128, as the model runs it)", cd::WeightDtype::kFp8, 8192, 4096, kRows, 8},
        {"4096 -> 512 projection (BF16)", cd::WeightDtype::kBf16, 512, 4096, kRows},
        {"router gate (BF16)", cd::WeightDtype::kBf16, 256, 4096, kRows},
    };
    FS_ASSIGN_OR_RETURN(float* px, ar.alloc<float>(kRows * 8 * 4096));
    FS_ASSIGN_OR_RETURN(float* py, ar.alloc<float>(kRows * 8192));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_floats(px, kRows * 8 * 4096, 14, 1.0f, nullptr));
    const int preps = std::max(3, std::min(reps, 7));
    for (const LinCase& c : pcases) {
      TypedMat m;
      FS_RETURN_IF_ERROR(make_typed(ar, m, c.dt, c.n, c.k, ++seed));
      double us[5] = {0, 0, 0, 0, 0};
      std::vector<float> outs[5];
      for (int kernel : {2, 4}) {
        double med = 0, mn = 0;
        FS_RETURN_IF_ERROR(bench::time_op(
            [&](int call) {
              cd::LinearArgs a;
              a.x = px, a.wt = m.ref(call), a.y = py, a.rows = c.rows, a.in = c.k, a.out = c.n / c.groups;
              a.kernel = kernel;
              if (c.groups > 1)
                a.groups = c.groups, a.x_stride = c.groups * c.k, a.x_group = c.k, a.y_stride = c.n, a.y_group = a.out;
              return cuda_status(cd::launch_linear(a, bench::g_st), "exact linear (prefill rows)");
            },
            preps, &med, &mn, 1));
        us[kernel] = med;
        // The last launch used copy (3 + preps - 1); both kernels' last launches read the same copy.
        FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(bench::g_st));
        outs[kernel].resize(static_cast<size_t>(c.rows * c.n));
        FS_CUDA_RETURN_IF_ERROR(
            cudaMemcpy(outs[kernel].data(), py, outs[kernel].size() * 4, cudaMemcpyDeviceToHost));
      }
      const bool same = std::memcmp(outs[2].data(), outs[4].data(), outs[2].size() * 4) == 0;
      const double flops = 2.0 * double(c.rows) * double(c.n) * double(c.k);
      auto tf = [&](double t) { return flops / (t * 1e-6) / 1e12; };
      md += fmt::format("| {} | [{} x {}] | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} ({:.0f} %) | {:.2f}x | {} |\n", c.name,
                        c.n, c.k, c.rows, us[2], us[4], tf(us[2]), tf(us[4]), 100.0 * tf(us[4]) / 67.0,
                        us[2] / us[4], same ? "yes" : "NO");
    }
  }
  // Decode attention at the real V4.1 width (model_attn.cu), compact cache rows, position 4096: the
  // former kernel (ModelAttnArgs::kernel 1) and the staged one (2), same bits. The ~0.3 MB of rows
  // stay in L2 between launches (as they do within a decode step's attention).
  {
    const int64_t H = 64, Dh = 512, W = 128, k = 512, start = 4096, ratio = 4, maxT = 128;
    const CacheRowFormat rf{RowCodec::kFp8E8m0, 512, 512, 32}, cf{RowCodec::kFp4E4m3, 512, 512, 16};
    const int64_t n_ckv = (start + maxT) / ratio;
    FS_ASSIGN_OR_RETURN(float* q, ar.alloc<float>(maxT * H * Dh));
    FS_ASSIGN_OR_RETURN(float* kv, ar.alloc<float>(maxT * Dh));
    FS_ASSIGN_OR_RETURN(float* out, ar.alloc<float>(maxT * H * Dh));
    FS_ASSIGN_OR_RETURN(float* sink, ar.alloc<float>(H));
    FS_ASSIGN_OR_RETURN(uint8_t* ring, ar.alloc<uint8_t>(W * rf.row_bytes()));
    FS_ASSIGN_OR_RETURN(uint8_t* ckv, ar.alloc<uint8_t>(n_ckv * cf.row_bytes()));
    FS_ASSIGN_OR_RETURN(int32_t* topk, ar.alloc<int32_t>(maxT * k));
    FS_ASSIGN_OR_RETURN(int32_t* topk_n, ar.alloc<int32_t>(maxT));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_floats(q, maxT * H * Dh, 21, 0.1f, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_floats(kv, maxT * Dh, 22, 1.0f, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_floats(sink, H, 23, 1.0f, nullptr));
    // Scale-range bytes everywhere: finite codes and scales in both formats.
    FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_bytes(ring, W * rf.row_bytes(), 24, 2, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_bytes(ckv, n_ckv * cf.row_bytes(), 25, 2, nullptr));
    std::vector<int32_t> tk(static_cast<size_t>(maxT * k)), tn(static_cast<size_t>(maxT), int32_t(k));
    for (int64_t t = 0; t < maxT; ++t)
      for (int64_t i = 0; i < k; ++i) tk[size_t(t * k + i)] = int32_t(2 * i + t % 2);  // ascending, < n_ckv
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(topk, tk.data(), tk.size() * 4, cudaMemcpyHostToDevice));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(topk_n, tn.data(), tn.size() * 4, cudaMemcpyHostToDevice));
    md += "\nDecode attention (H 64, Dh 512, window 128 + top-512 compressed rows, ring FP8 + E8M0 528 B, compressed "
          "KV FP4 + E4M3 288 B, position 4096): kernel 1 = the former kernel (a block per (row, head)), 2 = the staged "
          "kernel; same bits (the outputs of the last repetitions compared).\n\n"
          "| op | rows | kernel 1 us | kernel 2 us | speed-up | same bits |\n|---|---|---|---|---|---|\n";
    for (int64_t T : {1, 6, 128}) {  // a decode row, a verify block, a prefill-like chunk
      double us[3] = {0, 0, 0};
      std::vector<float> outs[3];
      for (int kernel : {1, 2}) {
        double med = 0, mn = 0;
        FS_RETURN_IF_ERROR(bench::time_op(
            [&](int) {
              cd::ModelAttnArgs a;
              a.q = q, a.kv_chunk = kv, a.ring = ring, a.ckv = ckv, a.ring_fmt = rf, a.ckv_fmt = cf, a.topk = topk;
              a.topk_n = topk_n, a.topk_stride = k, a.ratio = ratio, a.sink = sink, a.out = out, a.T = T, a.H = H;
              a.Dh = Dh, a.window = W, a.ring_size = W, a.start = start, a.max_keys = W + k;
              a.scale = 1.0f / 22.627417f, a.bf16 = true, a.kernel = kernel;
              return cuda_status(cd::launch_model_attention(a, bench::g_st), "model attention");
            },
            reps, &med, &mn));
        us[kernel] = med;
        FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(bench::g_st));
        outs[kernel].resize(static_cast<size_t>(T * H * Dh));
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(outs[kernel].data(), out, outs[kernel].size() * 4, cudaMemcpyDeviceToHost));
      }
      const bool same = std::memcmp(outs[1].data(), outs[2].data(), outs[1].size() * 4) == 0;
      md += fmt::format("| attention, 640 keys | {} | {:.1f} | {:.1f} | {:.1f}x | {} |\n", T, us[1], us[2],
                        us[1] / us[2], same ? "yes" : "NO");
    }
  }
  md += "\n| op | shape | us |\n|---|---|---|\n";
  auto row_op = [&](const std::string& name, const std::string& shape, const std::function<Status()>& fn) -> Status {
    double med = 0, mn = 0;
    FS_RETURN_IF_ERROR(bench::time_op([&](int) { return fn(); }, reps, &med, &mn));
    md += fmt::format("| {} | {} | {:.2f} |\n", name, shape, med);
    return {};
  };
  FS_ASSIGN_OR_RETURN(float* gamma, ar.alloc<float>(kMaxIn));
  FS_ASSIGN_OR_RETURN(float* buf, ar.alloc<float>(kMaxIn * 64));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_floats(gamma, kMaxIn, 12, 1.0f, nullptr));
  for (int64_t dim : {512, 1024, 4096, 16384}) {
    FS_RETURN_IF_ERROR(row_op("rms_norm", fmt::format("1 x {}", dim), [&]() -> Status {
      FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(x, gamma, y, 1, dim, 1e-6f, false, bench::g_st));
      return {};
    }));
  }
  // mHC mixes at the decode shape (hc 4 x 4096, one row; fn 24 x 16384 FP32, 1.5 MB): the row
  // kernel (HcMixArgs::kernel 1, a cluster of 8 blocks) and the automatic choice (the chunk-split
  // kernel); same bits.
  FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_floats(y, 24 * 16384, 13, 0.02f, nullptr));
  for (int kernel : {1, 0}) {
    FS_RETURN_IF_ERROR(row_op(kernel == 1 ? "hc_mixes, row kernel" : "hc_mixes, automatic (chunk-split)",
                              "1 x 4 x 4096", [&]() -> Status {
      cd::HcMixArgs h;
      h.x = x, h.fn = y, h.base = gamma, h.scale = gamma + 24, h.rows = 1, h.hc = 4, h.dim = 4096;
      h.norm_eps = 1e-6f, h.hc_eps = 1e-6f, h.sinkhorn_iters = 20, h.kernel = kernel;
      h.pre = buf, h.post = buf + 4, h.comb = buf + 8;
      FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_mixes(h, bench::g_st));
      return {};
    }));
  }
  // RoPE of one decode row: 64 query heads of 512 and the KV row (rope_dim 64), in place on a copy.
  FS_ASSIGN_OR_RETURN(int64_t* pos, ar.alloc<int64_t>(1));
  const int64_t pos_h = 4095;
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(pos, &pos_h, sizeof(pos_h), cudaMemcpyHostToDevice));
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(buf, x, size_t(64 * 512) * 4, cudaMemcpyDeviceToDevice));
  for (int64_t n_vec : {64, 1}) {
    FS_RETURN_IF_ERROR(row_op("rope", fmt::format("1 x {} x 512, rope 64", n_vec), [&]() -> Status {
      FS_CUDA_RETURN_IF_ERROR(cd::launch_rope(buf, pos, gamma, 1, n_vec, 512, 64, false, false, bench::g_st));
      return {};
    }));
  }
  // quant_sim works in place: refill from x each time would time the copy too; quantising the
  // already-quantised values costs the same.
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(buf, x, size_t(kMaxIn * 64) * 4, cudaMemcpyDeviceToDevice));
  FS_RETURN_IF_ERROR(row_op("quant_sim FP8, blocks of 128", "1 x 4096", [&]() -> Status {
    FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(buf, 1, 4096, 4096, 128, cd::QuantSim::kFp8, bench::g_st));
    return {};
  }));
  FS_RETURN_IF_ERROR(row_op("quant_sim FP4 (E8M0), blocks of 32", "1 x 128", [&]() -> Status {
    FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(buf, 1, 128, 128, 32, cd::QuantSim::kFp4E8m0, bench::g_st));
    return {};
  }));
  FS_RETURN_IF_ERROR(row_op("hadamard", "64 x 128", [&]() -> Status {
    FS_CUDA_RETURN_IF_ERROR(cd::launch_hadamard(buf, 64, 128, bench::g_st));
    return {};
  }));
  FS_RETURN_IF_ERROR(row_op("rms_norm_bf16_heads", "64 x 512", [&]() -> Status {
    FS_CUDA_RETURN_IF_ERROR(cd::launch_rms_norm_bf16_heads(buf, 64, 512, 1e-6f, bench::g_st));
    return {};
  }));
  FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return md;
}

}  // namespace flashseek::ops::cuda
