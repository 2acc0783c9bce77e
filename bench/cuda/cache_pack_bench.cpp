// `flashseek bench --kernels exact`, the compact-cache packing table (kernel_bench.h): the ring
// write (launch_cache_pack_ring, one row per decode token) and the row pack (launch_cache_pack_rows,
// compressed KV and index key rows) of ops/cuda/cache/cache_rows.h at V4.1's widths, for 1 and 6
// rows (decode batches) and 8192 rows (a prefill chunk). The inputs are quantised like the model's
// rows (launch_quant_sim), so each block's scale search ends as it does in the model. CUDA events,
// median of `reps` samples of 10 launches.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "bench/cuda/bench_util.h"
#include "bench/cuda/kernel_bench.h"
#include "ops/cuda/cache/cache_rows.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/small_kernels.h"
#include "ops/cuda/runtime/cuda_check.h"

namespace flashseek::ops::cuda {
namespace cd = detail;

Result<std::string> cache_pack_bench(int reps) {
  struct Fmt {
    const char* name;
    CacheRowFormat f;
    cd::QuantSim q;  // the quantiser of the model's rows in this format
  };
  const Fmt fmts[] = {
      {"window ring (e4m3 + E8M0 / 32)", {RowCodec::kFp8E8m0, 512, 512, 32}, cd::QuantSim::kFp8},
      {"compressed KV (FP4 + E4M3 / 16)", {RowCodec::kFp4E4m3, 512, 512, 16}, cd::QuantSim::kFp4E4m3},
      {"FP4 + E8M0 / 32", {RowCodec::kFp4E8m0, 512, 512, 32}, cd::QuantSim::kFp4E8m0},
      {"index keys (FP4 + E8M0 / 32)", {RowCodec::kFp4E8m0, 128, 128, 32}, cd::QuantSim::kFp4E8m0},
      {"FP32 (exact numerics)", {RowCodec::kF32, 512, 0, 1}, cd::QuantSim::kBf16},
  };
  const int64_t kRows[] = {1, 6, 8192}, kMaxRows = 8192, kDim = 512, kRing = 8192;
  bench::Arena ar;
  FS_ASSIGN_OR_RETURN(float* x, ar.alloc<float>(kMaxRows * kDim));
  FS_ASSIGN_OR_RETURN(uint8_t* out, ar.alloc<uint8_t>(kMaxRows * kDim * 4));
  FS_ASSIGN_OR_RETURN(int64_t* pos, ar.alloc<int64_t>(kMaxRows));
  FS_ASSIGN_OR_RETURN(int* bad, ar.alloc<int>(1));
  std::vector<int64_t> hpos(static_cast<size_t>(kMaxRows));
  for (int64_t t = 0; t < kMaxRows; ++t) hpos[size_t(t)] = 4000 + t;  // wraps around the ring
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(pos, hpos.data(), hpos.size() * 8, cudaMemcpyHostToDevice));
  FS_CUDA_RETURN_IF_ERROR(cudaMemset(bad, 0, 4));
  std::string md = fmt::format(
      "### Compact cache row packing (median of {} samples x 10 launches; inputs quantised like the model's "
      "rows)\n\n| op | format | dim | rows | us | unrepresentable blocks |\n|---|---|---|---|---|---|\n",
      reps);
  for (const Fmt& c : fmts) {
    const CacheRowFormat& f = c.f;
    FS_CUDA_RETURN_IF_ERROR(cd::launch_fill_floats(x, kMaxRows * f.dim, 31, 4.0f, nullptr));
    if (f.compact())
      FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(x, kMaxRows, f.dim, f.dim, f.block, c.q, nullptr));
    for (const int64_t rows : kRows) {
      for (const bool ring : {true, false}) {
        double med = 0, mn = 0;
        FS_RETURN_IF_ERROR(bench::time_op(
            [&](int) {
              const cudaError_t e =
                  ring ? cd::launch_cache_pack_ring(f, out, x, pos, 0, rows, kRing, bad, bench::g_st)
                       : cd::launch_cache_pack_rows(f, x, rows, out, bad, bench::g_st);
              return cuda_status(e, "cache pack");
            },
            reps, &med, &mn));
        int nbad = 0;
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(&nbad, bad, 4, cudaMemcpyDeviceToHost));
        FS_CUDA_RETURN_IF_ERROR(cudaMemset(bad, 0, 4));
        md += fmt::format("| {} | {} | {} | {} | {:.2f} | {} |\n", ring ? "pack_ring" : "pack_rows", c.name, f.dim,
                          rows, med, nbad);
      }
    }
  }
  FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return md;
}

}  // namespace flashseek::ops::cuda
