// The routed experts of prefill chunks through grouped FP8 GEMMs over the FP4 experts
// (GpuLoadOptions::moe_gemm_min_tokens, gpu_ops.cpp moe_native) against the grouped expert GEMV
// (the option off) and the CPU reference, on the whole model: the 410-token prompt teacher-forced
// in one chunk, bounded as every GPU parity test by the CPU backend's self-sensitivity
// (docs/cuda.md, "Whole-model parity"; parity_test_util.h): per-position max|Δlogit| median and
// p99 no larger, argmax agreement no lower than the worst of the CPU against itself with every
// FP8-activation dot perturbed as by another summation order. The GEMM path computes the GEMV's
// function with the same quantisation and rounding points, each 32-block's exact products summed
// at FP32 precision (the GEMM's x_f16 mode: f16 tensor-core steps; the e4m3 wgmma's ~14-bit block
// sums were 500x the bound's 1e-7 per dot and failed it), the block sums in another FP32 order,
// so it must stay inside that bound both against the GEMV path and against the CPU; and it must
// actually run: the model's counter of GEMM-path MoE layers (gpu_graph_stats moe_gemm_layers).
// Where every FP32 sum is exact its logits may be the GEMV path's bits.
//
// GpuPrefillGemm: the same with the dense FP8 token linears through the FP8 GEMM too
// (GpuLoadOptions::dense_gemm_min_tokens, GemmFp8Params::x_f16), i.e. the whole prefill GEMM path;
// the dense counter must move as well.
//
// Checkpoints: tiny-v4 (hidden 256, expert width 128: the GEMM's k is a multiple of 128), standard
// and tie-free well-conditioned (held to max|Δlogit| < 5e-2 and argmax agreement >= 99 % too, as
// GpuWellConditioned), and tiny-v41 with the expert width raised from 64 to 128 (the built-in 64 is
// no multiple of 128, so the built-in tiny-v41 keeps the GEMV). Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/cuda/gpu_model.h"
#include "parity_test_util.h"

namespace flashseek::forward {
namespace {
using namespace parity_test;  // NOLINT: test helpers (parity_test_util.h)

// Teacher-forced logits of the prompt in one chunk on the GPU with the given threshold (0: the
// expert GEMV for every chunk); *gemm_layers: the MoE layers that ran the grouped GEMMs.
// *dense_linears: the FP8 token linears that ran the dense GEMM (dense_gemm_min_tokens).
// operands: 0 f16 (the default), 1 bf16 (GpuLoadOptions::prefill_gemm_bf16), 2 bf16 with the
// weights expanded once per GEMM (prefill_gemm_expand_w), 3 that with the whole of k summed on the
// tensor core (prefill_gemm_direct).
std::vector<float> prefill_logits(const std::string& dir, int64_t moe_gemm_min_tokens, int64_t* gemm_layers,
                                  int64_t dense_gemm_min_tokens = 0, int64_t* dense_linears = nullptr,
                                  int operands = 0, int64_t* expansions = nullptr,
                                  int64_t moe_expand_min_rows = 0, bool moe_w_in_registers = false) {
  GpuLoadOptions o;
  o.moe_expand_min_rows = moe_expand_min_rows;
  o.moe_w_in_registers = moe_w_in_registers;
  o.moe_gemm_min_tokens = moe_gemm_min_tokens;
  o.dense_gemm_min_tokens = dense_gemm_min_tokens;
  o.prefill_gemm_bf16 = operands >= 1;
  o.prefill_gemm_expand_w = operands >= 2;
  o.prefill_gemm_direct = operands == 3;
  *gemm_layers = -1;
  auto gpu = load_model_gpu(dir, Numerics::kReference, 0, o);
  EXPECT_TRUE(gpu.ok()) << gpu.status().to_string();
  if (!gpu.ok()) return {};
  auto l = teacher_forced_logits(*gpu.value(), prompt(gpu.value()->config().vocab_size), kTokens);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  const auto st = gpu_graph_stats(*gpu.value());
  EXPECT_TRUE(st.ok()) << st.status().to_string();
  if (st.ok()) *gemm_layers = st.value().moe_gemm_layers;
  if (st.ok() && dense_linears) *dense_linears = st.value().dense_gemm_linears;
  if (st.ok() && expansions) *expansions = st.value().weight_expansions;
  return l.ok() ? std::move(l).value() : std::vector<float>{};
}

void print_stats(const std::string& tag, const char* what, const ParityStats& s, const ParityStats& bound) {
  std::printf("[parity] %s %s | cpu-perturbed(%s 1e-7, worst of %zu) vs cpu:\n"
              "[parity]   median %.3g | %.3g   p99 %.3g | %.3g   max %.3g | %.3g   argmax %lld/%lld = %.4f | %.4f\n",
              tag.c_str(), what, mode_name(kBoundMode), std::size(kSeeds), s.median, bound.median, s.p99, bound.p99,
              s.max, bound.max, static_cast<long long>(s.agree), static_cast<long long>(s.compared),
              s.argmax_agreement(), bound.argmax_agreement());
}

void check_within(const ParityStats& s, const ParityStats& bound, const char* what, bool tight) {
  EXPECT_TRUE(s.finite) << what;
  EXPECT_EQ(s.positions, kTokens) << what;
  EXPECT_LE(s.median, bound.median) << what << ": median max|dlogit| above the CPU self-sensitivity";
  EXPECT_LE(s.p99, bound.p99) << what << ": p99 max|dlogit| above the CPU self-sensitivity";
  EXPECT_GE(s.argmax_agreement(), bound.argmax_agreement()) << what << ": argmax agreement below the CPU's";
  if (tight) {
    EXPECT_LT(s.max, 5e-2) << what;
    EXPECT_GE(s.argmax_agreement(), 0.99) << what;
  }
}

// dense: the dense FP8 token linears take their GEMM as well.
void run_case(const std::string& tag, const std::string& dir, const std::vector<float>& ref, int64_t vocab,
              const ParityStats& bound, bool tight, bool dense = false) {
  ASSERT_EQ(ref.size(), size_t(kTokens * vocab));
  int64_t gemv_layers = 0, gemm_layers = 0, gemv_dense = 0, gemm_dense = 0;
  const std::vector<float> gemv = prefill_logits(dir, 0, &gemv_layers, 0, &gemv_dense),
                           gemm = prefill_logits(dir, 64, &gemm_layers, dense ? 64 : 0, &gemm_dense);
  ASSERT_EQ(gemv.size(), ref.size());
  ASSERT_EQ(gemm.size(), ref.size());
  EXPECT_EQ(gemv_layers, 0) << "threshold 0 ran the GEMM path";
  EXPECT_EQ(gemv_dense, 0) << "threshold 0 ran the dense GEMM";
  EXPECT_GT(gemm_layers, 0) << "the GEMM path did not run";
  if (dense) {
    EXPECT_GT(gemm_dense, 0) << "the dense GEMM did not run";
  }
  std::printf("[parity] %s gemm path: %lld MoE layers, %lld dense GEMM linears, logits %s the GEMV path's\n",
              tag.c_str(), static_cast<long long>(gemm_layers), static_cast<long long>(gemm_dense),
              std::memcmp(gemv.data(), gemm.data(), gemv.size() * sizeof(float)) == 0 ? "bitwise equal to" : "differ from");
  const ParityStats on_off = stats(gemv, gemm, vocab), on_ref = stats(ref, gemm, vocab), off_ref = stats(ref, gemv, vocab);
  print_stats(tag, "gemm-path vs gemv-path", on_off, bound);
  print_stats(tag, "gemm-path vs cpu", on_ref, bound);
  print_stats(tag, "gemv-path vs cpu", off_ref, bound);
  check_within(on_off, bound, "gemm path vs gemv path", tight);
  check_within(on_ref, bound, "gemm path vs cpu", tight);
}

class GpuMoeGemm : public ::testing::TestWithParam<Ckpt> {};

TEST_P(GpuMoeGemm, PrefillWithinCpuSelfSensitivityOfGemvAndCpu) {
  FS_REQUIRE_GPU();
  const Ckpt c = GetParam();
  const Measured& m = measured(c);
  run_case(c.tag(), m.dir, m.ref, m.vocab, m.sens.worst, c.tie_free && c.well_conditioned);
}

// Test names: the checkpoint tag with '-' → '_'.
std::string ckpt_name(const ::testing::TestParamInfo<Ckpt>& info) {
  std::string t = info.param.tag();
  std::replace(t.begin(), t.end(), '-', '_');
  return t;
}

// The logits of an operand mode's GEMM path against the GEMV path's and the CPU's, printed and
// held to the checkpoint's bound (tie-free well-conditioned ones to the tight limits as well).
void check_mode_within(const Ckpt& c, const Measured& m, const std::vector<float>& gemv, const std::vector<float>& got,
                       const std::string& mode) {
  const ParityStats vs_gemv = stats(gemv, got, m.vocab), vs_ref = stats(m.ref, got, m.vocab);
  const std::string tag = c.tag() + "+" + mode;
  print_stats(tag, "gemm-path vs gemv-path", vs_gemv, m.sens.worst);
  print_stats(tag, "gemm-path vs cpu", vs_ref, m.sens.worst);
  const bool tight = c.tie_free && c.well_conditioned;
  check_within(vs_gemv, m.sens.worst, (mode + " vs gemv path").c_str(), tight);
  check_within(vs_ref, m.sens.worst, (mode + " vs cpu").c_str(), tight);
}

class GpuPrefillGemm : public ::testing::TestWithParam<Ckpt> {};

TEST_P(GpuPrefillGemm, DenseAndMoeWithinCpuSelfSensitivityOfGemvAndCpu) {
  FS_REQUIRE_GPU();
  const Ckpt c = GetParam();
  const Measured& m = measured(c);
  run_case(c.tag() + "+dense", m.dir, m.ref, m.vocab, m.sens.worst, c.tie_free && c.well_conditioned, true);
}

// --prefill-gemm-operands bf16-expanded: every prefill GEMM (dense, wo_a's groups, the routed
// experts) over weights expanded to BF16 once per GEMM. Its logits must be the bits of the bf16
// mode that expands each tile inside the GEMM (the same values summed in the same order), and
// within the parity bound of the GEMV path and the CPU like the default mode.
TEST_P(GpuPrefillGemm, ExpandedBf16WeightsAreTheBf16ModesBitsAndWithinBound) {
  FS_REQUIRE_GPU();
  const Ckpt c = GetParam();
  const Measured& m = measured(c);
  int64_t layers_b = 0, layers_e = 0, dense_b = 0, dense_e = 0, gemv_layers = 0, exp_b = -1, exp_e = -1;
  const std::vector<float> bf16 = prefill_logits(m.dir, 64, &layers_b, 64, &dense_b, 1, &exp_b),
                           expanded = prefill_logits(m.dir, 64, &layers_e, 64, &dense_e, 2, &exp_e),
                           gemv = prefill_logits(m.dir, 0, &gemv_layers);
  ASSERT_EQ(bf16.size(), m.ref.size());
  ASSERT_EQ(expanded.size(), m.ref.size());
  ASSERT_EQ(gemv.size(), m.ref.size());
  EXPECT_GT(layers_e, 0) << "the expanded MoE GEMM did not run";
  EXPECT_GT(dense_e, 0) << "the expanded dense GEMM did not run";
  EXPECT_EQ(layers_e, layers_b);
  EXPECT_EQ(dense_e, dense_b);
  EXPECT_EQ(exp_b, 0) << "the bf16 mode expanded weights outside the GEMM";
  // At least one expansion per MoE layer's gate, up and down, and one for the dense FP8 linears
  // (dense_gemm_linears also counts the BF16 matrices' GEMMs, which need none).
  EXPECT_GE(exp_e, 3 * layers_e + 1) << "the weights were not expanded";
  EXPECT_EQ(0, std::memcmp(bf16.data(), expanded.data(), bf16.size() * sizeof(float)))
      << "expanded weights changed the bf16 mode's logits";
  check_mode_within(c, m, gemv, expanded, "bf16-expanded");
}

// --prefill-gemm-operands bf16-direct: the expanded weights' GEMMs with the whole of k summed on
// the tensor core (another FP32 order of the same exact products than the block sums) must run
// and stay within the parity bound of the GEMV path and of the CPU, as the block-summed modes do.
TEST_P(GpuPrefillGemm, DirectBf16WithinBoundOfGemvAndCpu) {
  FS_REQUIRE_GPU();
  const Ckpt c = GetParam();
  const Measured& m = measured(c);
  int64_t layers = 0, dense = 0, gemv_layers = 0, expansions = -1;
  const std::vector<float> direct = prefill_logits(m.dir, 64, &layers, 64, &dense, 3, &expansions),
                           gemv = prefill_logits(m.dir, 0, &gemv_layers);
  ASSERT_EQ(direct.size(), m.ref.size());
  ASSERT_EQ(gemv.size(), m.ref.size());
  EXPECT_GT(layers, 0) << "the MoE GEMM did not run";
  EXPECT_GT(dense, 0) << "the dense GEMM did not run";
  EXPECT_GE(expansions, 3 * layers + 1) << "the weights were not expanded";
  check_mode_within(c, m, gemv, direct, "bf16-direct");
  // --moe-expand-min-rows above the step's rows per expert: the routed experts' GEMMs expand each
  // weight tile inside the kernel instead (no expansion launches for them), with the same bits.
  int64_t layers_k = 0, dense_k = 0, expansions_k = -1;
  const std::vector<float> in_kernel =
      prefill_logits(m.dir, 64, &layers_k, 64, &dense_k, 3, &expansions_k, int64_t(1) << 30);
  ASSERT_EQ(in_kernel.size(), direct.size());
  EXPECT_EQ(layers_k, layers);
  EXPECT_EQ(dense_k, dense);
  EXPECT_LE(expansions_k, expansions - 3 * layers) << "the routed experts were still expanded";
  EXPECT_EQ(0, std::memcmp(in_kernel.data(), direct.data(), direct.size() * sizeof(float)))
      << "in-kernel expansion changed the bf16-direct logits";
  // The same with the operands swapped (--moe-w-registers: W expanded into register fragments).
  int64_t layers_r = 0, dense_r = 0, expansions_r = -1;
  const std::vector<float> in_regs =
      prefill_logits(m.dir, 64, &layers_r, 64, &dense_r, 3, &expansions_r, int64_t(1) << 30, true);
  ASSERT_EQ(in_regs.size(), direct.size());
  EXPECT_EQ(layers_r, layers);
  EXPECT_EQ(0, std::memcmp(in_regs.data(), direct.data(), direct.size() * sizeof(float)))
      << "W in registers changed the bf16-direct logits";
}

INSTANTIATE_TEST_SUITE_P(Tiny, GpuPrefillGemm,
                         ::testing::Values(Ckpt{"tiny-v4", false}, Ckpt{"tiny-v4", true, true}),
                         ckpt_name);

INSTANTIATE_TEST_SUITE_P(Tiny, GpuMoeGemm,
                         ::testing::Values(Ckpt{"tiny-v4", false}, Ckpt{"tiny-v4", true, true}),
                         ckpt_name);

// tiny-v41 with expert width 128 (its own checkpoint, CPU reference and self-sensitivity).
TEST(GpuMoeGemm, TinyV41WideExpertsPrefillWithinBound) {
  FS_REQUIRE_GPU();
  namespace fs = std::filesystem;
  const std::string tag = "tiny-v41_std_i128";
  const fs::path dir = fs::temp_directory_path() / ("fs_moe_gemm_" + std::to_string(::getpid()));
  auto cfg = model::builtin_config("tiny-v41");
  ASSERT_TRUE(cfg.ok());
  model::ModelConfig mc = cfg.value();
  mc.moe_inter_dim = 128;
  model::MakeTinyOptions opt;
  opt.seed = 11;
  made_dirs().push_back(dir.string());
  const Status s = model::make_tiny_checkpoint(mc, opt, dir.string());
  ASSERT_TRUE(s.ok()) << s.to_string();
  const std::vector<float> ref = cpu_logits(dir.string());
  const int64_t vocab = int64_t(ref.size()) / kTokens;
  ASSERT_GT(vocab, 0);
  const Sensitivity sens = self_sensitivity(dir.string(), ref, vocab, tag, kBoundMode);
  run_case(tag, dir.string(), ref, vocab, sens.worst, false);
  if (HasFatalFailure()) return;
  run_case(tag + "+dense", dir.string(), ref, vocab, sens.worst, false, true);
}

}  // namespace
}  // namespace flashseek::forward
