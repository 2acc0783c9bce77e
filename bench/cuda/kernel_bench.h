// Kernel micro-benchmarks (moved out of the test suite: timing belongs in benchmarks, tests assert
// properties). `flashseek bench --kernels sampling,gemm,topk`:
//   sampling: one 129,280-wide row per sampler (greedy, temperature, top-k, top-p on a peaked and
//     a flat row, min-p), device sample_rows_cuda per row (launch included) next to the host path
//     the engine would otherwise take (copy the row to host memory + the CPU sampler).
//   gemm: every FP8 block-scaled GEMM kernel variant (1..9, and 4/6/7 without the FP32 promotion,
//     a diagnostic of its cost; their results are wrong) on the V4.1 prefill linears at m = 8192,
//     TFLOP/s, the activation quantisation, best GEMM + quantisation. Before timing, each variant
//     is probed against the CPU twin on one 128x128x256 case (relative Frobenius error > 1e-3 is
//     an error: a wrong kernel is not timed), and the unswizzled variant with its descriptor byte
//     offsets swapped is shown to fail the probe. Correctness proper: tests/ops_cuda.
//   topk: the indexer top-512 of 131,072 keys at M = 1 and 6 through every launch_index_topk path
//     (one block per row, over blocks, one cluster per row of automatic / 8 / 16 blocks), us and
//     GB/s, distinct and heavily tied scores; each path is probed against ops::topk_indices.
//   exact: the exactness kernels of the GPU model on decode shapes (exact_bench.cpp): the
//     linear with both kernels (the BF16 LM head, the FP8 grouped wo_a at 1 / 6 / 16 / 200
//     rows, the BF16 router, an in = 1024 FP8 projection), rms_norm, quant_sim, Hadamard, the BF16
//     head norm.
//   h2d: pinned host-to-device copy GB/s on one and two streams (the ceiling of weight loading
//     from a warm page cache; scripts/load-bench.sh prints it next to dd).
// Not used by the model.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"

namespace flashseek::ops::cuda {

struct KernelBenchOptions {
  std::vector<std::string> kernels = {"sampling"};  // "sampling", "gemm", "topk", "exact", "h2d"
  int reps = 40;                                     // sampling, topk, exact: launches per timed sample
  std::string skip_variants;  // gemm: variant digits left out of the table (0 TFLOP/s), e.g. "67"
};

// Runs the selected benchmarks on device 0; returns their Markdown tables.
Result<std::string> run_kernel_bench(const KernelBenchOptions& opt);
// The "exact" tables (exact_bench.cpp); `reps` timed samples per op.
Result<std::string> exact_kernels_bench(int reps);
// The compact-cache packing table of "exact" (cache_pack_bench.cpp).
Result<std::string> cache_pack_bench(int reps);

}  // namespace flashseek::ops::cuda
