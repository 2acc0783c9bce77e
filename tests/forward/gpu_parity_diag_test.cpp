// Which GPU op moves the CUDA backend's logits away from the CPU reference (issue 13, "parity
// V4.1"; docs/cuda.md, "Whole-model parity"). On the well-conditioned tie-free tiny-v41 and
// tiny-v4 checkpoints (where the noise follows the perturbation, so the bound is proportional to
// ε), teacher-forced over the parity tests' 410-token prompt, once as one prefill chunk and once
// token by token, this prints the parity statistics against the CPU reference (reference
// numerics) of:
//   fp32         GpuWeights::kFp32 (every linear through the exactness kernels, FP32 copies)
//   slow         native weights, every FP8-activation linear through the exactness kernels
//                (GpuLoadOptions::fast_linears = 0)
//   fast:<role>  native, only that role through the block-scaled GEMVs (one line per role)
//   native       native defaults (every role fast: what GpuSensitivity.* measures)
// next to the CPU bound (the worst CPU self-sensitivity, parity_test_util.h), and for every
// configuration the number of logits that differ bitwise from the CPU's. A fast:<role> line whose
// role exists in the checkpoint also carries that role's own CPU bound: the CPU with only the
// role's dots perturbed (CpuLoadOptions::perturbation_filter, worst of the three seeds), the
// yardstick of that one GEMV. Lines:
//   [pdiag] <ckpt> <config> prefill|decode median .. p99 .. max .. argmax n/m | bound median ..
//   p99 ..  bitwise-diff-count .. fast-matrices .. [role-bound median .. p99 .. max ..]
// What it asserts is what must hold whatever the kernels' rounding: `slow` equals `fp32` bit for
// bit (both run the exactness kernels on the same values: the stored codes expanded in registers
// are exactly the FP32 copies; model_kernels.h WeightRef), the indexer-score kernels give the
// same logits (on the standard tiny-v41, where the scores choose), and the load option selects
// what it says (no block-scaled matrix when every role is slow; the single-role counts add up to
// the default's). Skips visibly without a CUDA device.
// Run: build-cuda/tests/test_forward --gtest_filter='GpuParityDiag.*'
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/gpu_model.h"
#include "parity_test_util.h"

#if FLASHSEEK_HAVE_CUDA
#include "backends/cuda/gpu_impl.h"
#endif

namespace flashseek::forward {
namespace {
using namespace parity_test;  // NOLINT: test helpers (parity_test_util.h)

// Floats whose bits differ (NaNs with the same payload count as equal); sizes that differ count
// every float of the longer run.
int64_t bitwise_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return int64_t(std::max(a.size(), b.size()));
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
  return n;
}

struct DiagConfig {
  std::string name;
  GpuLoadOptions opts;
  int role = -1;  // fast:<role> configurations: the GpuLinearRole
};

// The CPU dots of GPU role `r` (CpuLoadOptions::perturbation_filter); empty for the draft, whose
// dots (the V4 MTP block) never reach the teacher-forced logits.
std::function<bool(const LinearKey&)> cpu_dots_of(GpuLinearRole r) {
  auto op_is = [](DotOp want) { return [want](const LinearKey& k) { return k.op == want; }; };
  auto ffn = [](bool routed) {
    return [routed](const LinearKey& k) {
      return (k.op == DotOp::kW1 || k.op == DotOp::kW2 || k.op == DotOp::kW3) && (k.expert >= 0) == routed;
    };
  };
  switch (r) {
    case GpuLinearRole::kAttnWqA: return op_is(DotOp::kWqA);
    case GpuLinearRole::kAttnWqB: return op_is(DotOp::kWqB);
    case GpuLinearRole::kAttnWkv: return op_is(DotOp::kWkv);
    case GpuLinearRole::kAttnWoB: return op_is(DotOp::kWoB);
    case GpuLinearRole::kIndexerWqB: return op_is(DotOp::kIdxWqB);
    case GpuLinearRole::kSharedExperts: return ffn(false);
    case GpuLinearRole::kRoutedExperts: return ffn(true);
    case GpuLinearRole::kEngramWkv: return op_is(DotOp::kEngramWkv);
    default: return {};
  }
}

// The CPU self-sensitivity with only role `r`'s dots perturbed (kBoundMode, 1e-7, worst of kSeeds).
ParityStats cpu_role_bound(const Measured& m, GpuLinearRole r) {
  ParityStats worst;
  for (uint64_t seed : kSeeds) {
    CpuLoadOptions o;
    o.dot_perturbation = kDotPerturbation;
    o.perturbation_seed = seed;
    o.perturbation_mode = kBoundMode;
    o.perturbation_filter = cpu_dots_of(r);
    const ParityStats s = stats(m.ref, cpu_logits(m.dir, o), m.vocab);
    worst.median = std::max(worst.median, s.median);
    worst.p99 = std::max(worst.p99, s.p99);
    worst.max = std::max(worst.max, s.max);
  }
  return worst;
}

std::vector<DiagConfig> configs() {
  std::vector<DiagConfig> v;
  GpuLoadOptions fp32;
  fp32.weights = GpuWeights::kFp32;
  v.push_back({"fp32", fp32});
  GpuLoadOptions slow;
  slow.fast_linears = 0;
  v.push_back({"slow", slow});
  for (uint32_t r = 0; r < uint32_t(GpuLinearRole::kCount); ++r) {
    GpuLoadOptions one;
    one.fast_linears = gpu_linear_bit(GpuLinearRole(r));
    v.push_back({std::string("fast:") + gpu_linear_role_name(GpuLinearRole(r)), one, int(r)});
  }
  v.push_back({"native", GpuLoadOptions{}});
  return v;
}

// The logits of one configuration (prefill, decode) and its count of block-scaled matrices (-1:
// not a CUDA model).
struct DiagRun {
  std::vector<float> prefill, decode;
  int64_t fast_matrices = -1;
};

DiagRun run_config(const std::string& dir, const GpuLoadOptions& opts) {
  DiagRun r;
  auto gpu = load_model_gpu(dir, Numerics::kReference, 0, opts);
  EXPECT_TRUE(gpu.ok()) << gpu.status().to_string();
  if (!gpu.ok()) return r;
#if FLASHSEEK_HAVE_CUDA
  if (const auto* g = dynamic_cast<const gpu::GpuModel*>(gpu.value().get())) r.fast_matrices = g->weight_report().fast_matrices;
#endif
  const auto toks = prompt(gpu.value()->config().vocab_size);
  for (int64_t chunk : {kTokens, int64_t(1)}) {
    auto l = teacher_forced_logits(*gpu.value(), toks, chunk);
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    (chunk == kTokens ? r.prefill : r.decode) = l.ok() ? std::move(l).value() : std::vector<float>{};
  }
  return r;
}

// One configuration's line; with `role_bound`, also the CPU self-sensitivity of that role alone.
void print_line(const Ckpt& c, const std::string& config, const char* how, const ParityStats& s,
                const ParityStats& bound, int64_t diff, int64_t fast, const ParityStats* role_bound) {
  std::printf("[pdiag] %s %s %s median %.4g p99 %.4g max %.4g argmax %lld/%lld | bound median %.4g p99 %.4g  "
              "bitwise-diff-count %lld fast-matrices %lld",
              c.tag().c_str(), config.c_str(), how, s.median, s.p99, s.max, static_cast<long long>(s.agree),
              static_cast<long long>(s.compared), bound.median, bound.p99, static_cast<long long>(diff),
              static_cast<long long>(fast));
  if (role_bound)
    std::printf("  role-bound median %.4g p99 %.4g max %.4g", role_bound->median, role_bound->p99, role_bound->max);
  std::printf("\n");
}

void diagnose(const Ckpt& c) {
  const Measured& m = measured(c);
  ASSERT_EQ(m.ref.size(), size_t(kTokens * m.vocab));
  const ParityStats& bound = m.sens.worst;
  std::printf("[pdiag] %s bound (cpu vs cpu-perturbed, %s 1e-7, worst of %zu) median %.4g p99 %.4g max %.4g "
              "argmax %lld/%lld\n",
              c.tag().c_str(), mode_name(kBoundMode), std::size(kSeeds), bound.median, bound.p99, bound.max,
              static_cast<long long>(bound.agree), static_cast<long long>(bound.compared));
  std::vector<std::pair<std::string, DiagRun>> runs;
  for (const DiagConfig& d : configs()) {
    DiagRun r = run_config(m.dir, d.opts);
    // A role present in this checkpoint: the CPU with only that role's dots perturbed, for scale.
    std::optional<ParityStats> role_bound;
    if (d.role >= 0 && r.fast_matrices > 0 && cpu_dots_of(GpuLinearRole(d.role)))
      role_bound = cpu_role_bound(m, GpuLinearRole(d.role));
    for (int pass = 0; pass < 2; ++pass) {
      const std::vector<float>& l = pass == 0 ? r.prefill : r.decode;
      const char* how = pass == 0 ? "prefill" : "decode";
      const ParityStats s = stats(m.ref, l, m.vocab);
      print_line(c, d.name, how, s, bound, bitwise_diff(m.ref, l), r.fast_matrices,
                 role_bound ? &*role_bound : nullptr);
      EXPECT_TRUE(s.finite) << d.name << " " << how;
      EXPECT_EQ(s.positions, kTokens) << d.name << " " << how;
    }
    std::fflush(stdout);
    runs.emplace_back(d.name, std::move(r));
  }
  auto find = [&](const std::string& name) -> const DiagRun& {
    for (const auto& [n, r] : runs)
      if (n == name) return r;
    ADD_FAILURE() << "no run " << name;
    return runs.front().second;
  };
  const DiagRun& fp32 = find("fp32");
  const DiagRun& slow = find("slow");
  // (b) == (a): the exactness kernels on the same values, whichever way the weights are stored.
  EXPECT_EQ(bitwise_diff(fp32.prefill, slow.prefill), 0) << "prefill: native all-slow differs from fp32";
  EXPECT_EQ(bitwise_diff(fp32.decode, slow.decode), 0) << "decode: native all-slow differs from fp32";
#if FLASHSEEK_HAVE_CUDA
  // The option selects what it says: no block-scaled matrix when every role is slow (nor in fp32
  // mode), some by default, and each matrix in exactly one role.
  EXPECT_EQ(fp32.fast_matrices, 0);
  EXPECT_EQ(slow.fast_matrices, 0);
  const DiagRun& native = find("native");
  EXPECT_GT(native.fast_matrices, 0);
  int64_t sum = 0;
  for (uint32_t r = 0; r < uint32_t(GpuLinearRole::kCount); ++r)
    sum += find(std::string("fast:") + gpu_linear_role_name(GpuLinearRole(r))).fast_matrices;
  EXPECT_EQ(sum, native.fast_matrices);
#endif
}

// The well-conditioned tie-free checkpoints (plain tests, so that 'GpuParityDiag.*' selects them).
TEST(GpuParityDiag, TinyV41TieFreeWellConditioned) {
  FS_REQUIRE_GPU();
  diagnose(Ckpt{"tiny-v41", true, true});
}
TEST(GpuParityDiag, TinyV4TieFreeWellConditioned) {
  FS_REQUIRE_GPU();
  diagnose(Ckpt{"tiny-v4", true, true});
}

// The indexer-score kernels in the whole model (GpuLoadOptions::index_scores_kernel; documented
// as the same bits): on the standard tiny-v41 (not tie-free: the index top-k keeps fewer rows than
// are visible, so the scores choose what attention reads; the tie-free checkpoints above keep
// every row and cannot see the scores), reference numerics, every role through the exactness
// kernels, kernels 1 / 2 / 3 / 4 give the automatic choice's logits bit for bit, prefill and
// decode (4, the integer tensor-core kernel and the automatic choice here, is the FP32 kernels'
// bits wherever the dots are exact in FP32: always with tiny-v41's one 32-block per head).
// Each line also prints the count against the CPU reference for scale.
TEST(GpuParityDiag, IndexScoreKernelsGiveTheSameLogits) {
  FS_REQUIRE_GPU();
  const Ckpt c{"tiny-v41"};
  const std::string dir = checkpoint(c);
  const std::vector<float> cpu = cpu_logits(dir);
  std::vector<DiagRun> runs;
  for (int k : {0, 1, 2, 3, 4}) {
    GpuLoadOptions o;
    o.fast_linears = 0;
    o.index_scores_kernel = k;
    runs.push_back(run_config(dir, o));
    const DiagRun& r = runs.back();
    std::printf("[pdiag] %s slow+idx%d prefill bitwise-diff-count %lld vs idx0, %lld vs cpu; decode %lld vs idx0, "
                "%lld vs cpu\n",
                c.tag().c_str(), k, static_cast<long long>(bitwise_diff(runs.front().prefill, r.prefill)),
                static_cast<long long>(bitwise_diff(cpu, r.prefill)),
                static_cast<long long>(bitwise_diff(runs.front().decode, r.decode)),
                static_cast<long long>(bitwise_diff(cpu, r.decode)));
    ASSERT_EQ(r.prefill.size(), cpu.size()) << "kernel " << k;
    ASSERT_EQ(r.decode.size(), cpu.size()) << "kernel " << k;
    EXPECT_EQ(bitwise_diff(runs.front().prefill, r.prefill), 0) << "prefill: index scores kernel " << k;
    EXPECT_EQ(bitwise_diff(runs.front().decode, r.decode), 0) << "decode: index scores kernel " << k;
  }
}

// CpuLoadOptions::perturbation_filter perturbs exactly the dots it accepts (CPU, 48 tokens of
// tiny-v41 in one chunk): rejecting every dot gives the unperturbed bits, accepting every dot the
// unfiltered perturbation's bits, and only attention wo_b something between (differs from both;
// on this checkpoint and prompt, wo_b's perturbation reaches the logits within 48 tokens, while
// wq_a's, indexer.wq_b's and engram.wkv's alone changed no logit there).
TEST(CpuPerturbationFilter, PerturbsExactlyTheAcceptedDots) {
  const std::string dir = checkpoint(Ckpt{"tiny-v41"});
  auto logits = [&](const CpuLoadOptions& o) {
    auto m = CpuModel::load(dir, Numerics::kReference, o);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    if (!m.ok()) return std::vector<float>{};
    std::vector<int32_t> toks = prompt(m.value()->config().vocab_size);
    toks.resize(48);
    auto l = teacher_forced_logits(*m.value(), toks, int64_t(toks.size()));
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    return l.ok() ? std::move(l).value() : std::vector<float>{};
  };
  CpuLoadOptions p;
  p.dot_perturbation = kDotPerturbation;
  p.perturbation_seed = 1;
  p.perturbation_mode = kBoundMode;
  const std::vector<float> plain = logits({}), all = logits(p);
  ASSERT_FALSE(plain.empty());
  ASSERT_GT(bitwise_diff(plain, all), 0);  // the perturbation moves something at all
  CpuLoadOptions none = p, every = p, wo_b = p;
  none.perturbation_filter = [](const LinearKey&) { return false; };
  every.perturbation_filter = [](const LinearKey&) { return true; };
  wo_b.perturbation_filter = cpu_dots_of(GpuLinearRole::kAttnWoB);
  EXPECT_EQ(bitwise_diff(logits(none), plain), 0);
  EXPECT_EQ(bitwise_diff(logits(every), all), 0);
  const std::vector<float> only = logits(wo_b);
  EXPECT_GT(bitwise_diff(only, plain), 0);
  EXPECT_GT(bitwise_diff(only, all), 0);
}

// The load option's checks without a device run: role names are distinct and name every role.
TEST(GpuLinearRoles, NamesAreDistinctAndCoverEveryRole) {
  std::vector<std::string> names;
  for (uint32_t r = 0; r < uint32_t(GpuLinearRole::kCount); ++r) {
    const std::string n = gpu_linear_role_name(GpuLinearRole(r));
    EXPECT_NE(n, "?") << r;
    EXPECT_EQ(std::count(names.begin(), names.end(), n), 0) << n;
    names.push_back(n);
  }
  EXPECT_STREQ(gpu_linear_role_name(GpuLinearRole::kCount), "?");
  EXPECT_EQ(kAllGpuLinearRoles, (uint32_t(1) << uint32_t(GpuLinearRole::kCount)) - 1);
  EXPECT_EQ(GpuLoadOptions{}.fast_linears, kAllGpuLinearRoles);  // default: today's behaviour
}

}  // namespace
}  // namespace flashseek::forward
