// CUDA graphs of decode-sized forwards (gpu_graph.cpp): with graphs on (GpuLoadOptions::graphs),
// the logits are BITWISE those of the eager path (kOff) over 400+ one-token decode steps of a batch of
// two sequences and of one sequence (tiny-v41 and tiny-v4, exact and reference numerics), both
// when steps replay a cached executable by patching changed nodes (the default with graphs on) and
// when every step is recorded (kRecord), and over DSpark-style verify blocks of
// 6 tokens with rollbacks; the counters prove which path ran (most decode steps patched); TP=2 over
// NCCL with graphs on equals graphs off. Skips visibly without a CUDA device. Timing is not a
// test's business: `flashseek run --gpus 0 ...` prints decode tok/s with --gpu-graphs off / on.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include "core/rng.h"
#include "backends/cuda/gpu_model.h"
#include "backends/cuda/gpu_tp.h"
#include "gpu_test_util.h"

#if FLASHSEEK_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/gemv/gemv_kernels.h"
#include "ops/cuda/runtime/comm.h"
#endif

namespace flashseek::forward {
namespace {
using namespace gpu_test;  // NOLINT: test helpers (gpu_test_util.h)

// GpuLoadOptions with graphs on (patched replay, or every step recorded when `patch` is false)
// or off (eager).
GpuLoadOptions graph_options(bool on, bool patch = true) {
  GpuLoadOptions o;
  o.graphs = !on ? GpuGraphs::kOff : patch ? GpuGraphs::kPatch : GpuGraphs::kRecord;
  return o;
}

struct Param {
  const char* config;
  Numerics numerics;
};
std::string param_name(const ::testing::TestParamInfo<Param>& i) {
  std::string n = std::string(i.param.config) + (i.param.numerics == Numerics::kExact ? "_exact" : "_ref");
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

std::string make_ckpt(const std::string& config) {
  auto cfg = model::builtin_config(config);
  EXPECT_TRUE(cfg.ok());
  return tiny_checkpoint("fs_gpugraph_" + config, cfg.value(), 23);
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<Model> load(const std::string& dir, Numerics n, const GpuLoadOptions& o) {
  auto m = load_model_gpu(dir, n, 0, o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}
std::unique_ptr<Model> load(const std::string& dir, Numerics n, bool graphs, bool patch = true) {
  return load(dir, n, graph_options(graphs, patch));
}

GpuGraphStats stats(const Model& m) {
  auto s = gpu_graph_stats(m);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? s.value() : GpuGraphStats{};
}

void print_stats(const char* what, const GpuGraphStats& s) {
  std::printf("[gpu graph] %s: forwards %lld, decode-sized %lld, launches %lld, patched %lld (%lld nodes set, %lld "
              "misses), instantiations %lld, updates %lld (failed %lld), recaptures %lld, eager fallbacks %lld\n",
              what, (long long)s.forwards, (long long)s.eligible, (long long)s.launches, (long long)s.patched,
              (long long)s.patched_nodes, (long long)s.patch_misses, (long long)s.instantiations,
              (long long)s.updates, (long long)s.update_failures, (long long)s.recaptures,
              (long long)s.eager_fallbacks);
  if (s.timed > 0)
    std::printf("[gpu graph] %s: per decode-sized forward: host %.1f us (until the sync), wait %.1f us\n", what,
                1e-3 * double(s.host_ns) / double(s.timed), 1e-3 * double(s.wait_ns) / double(s.timed));
}

constexpr int64_t kPrompt = 37, kSteps = 420;

// `n` (1 or 2) sequences: prefills of different lengths (eager), then kSteps decode steps of one
// token each as one batch of n items (teacher-forced random tokens). Returns every decode step's
// logits.
std::vector<float> decode_run(Model& m, uint64_t seed, int n = 2) {
  const int64_t V = m.config().vocab_size;
  auto a = m.new_sequence(), b = m.new_sequence();
  const auto pa = random_tokens(kPrompt, V, seed), pb = random_tokens(kPrompt + 5, V, seed + 1);
  const auto da = random_tokens(kSteps, V, seed + 2), db = random_tokens(kSteps, V, seed + 3);
  std::vector<float> pre, out;
  BatchItem p[2] = {{a.get(), pa, false}, {b.get(), pb, false}};
  Status s = m.forward({p, size_t(n)}, pre);
  EXPECT_TRUE(s.ok()) << s.to_string();
  for (int64_t i = 0; i < kSteps && s.ok(); ++i) {
    BatchItem it[2] = {{a.get(), std::span<const int32_t>(&da[size_t(i)], 1), false},
                       {b.get(), std::span<const int32_t>(&db[size_t(i)], 1), false}};
    s = m.forward({it, size_t(n)}, out);
    EXPECT_TRUE(s.ok()) << "step " << i << ": " << s.to_string();
  }
  EXPECT_EQ(out.size(), size_t(n * kSteps * V));
  return out;
}

// After a prompt, `blocks` verify blocks of 6 tokens (all logits), each followed by a rollback
// of 0..5 of them, as DSpark speculation does. Returns every block's logits.
constexpr int64_t kVerifyBlocks = 80;
std::vector<float> verify_run(Model& m, int64_t blocks) {
  const int64_t V = m.config().vocab_size, B = 6;
  auto st = m.new_sequence();
  const auto prompt = random_tokens(kPrompt, V, 77);
  const auto toks = random_tokens(blocks * B, V, 78);
  std::vector<float> out;
  BatchItem pi{st.get(), prompt, false};
  EXPECT_TRUE(m.forward({&pi, 1}, out).ok());
  for (int64_t k = 0; k < blocks; ++k) {
    BatchItem it{st.get(), std::span<const int32_t>(toks.data() + k * B, size_t(B)), true};
    const Status s = m.forward({&it, 1}, out);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) break;
    const int64_t drop = k % B;  // accepted 6 - drop of the block
    const Status r = m.rollback(*st, st->length() - drop);
    EXPECT_TRUE(r.ok()) << r.to_string();
  }
  return out;
}

class GpuGraphDecode : public ::testing::TestWithParam<Param> {};

TEST_P(GpuGraphDecode, GraphsOnEqualGraphsOffBitwise) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  const std::string dir = make_ckpt(p.config);
  const char* num = p.numerics == Numerics::kExact ? "exact" : "reference";
  for (int n : {2, 1}) {
    // on: graphs replayed by patching; rec: graphs recorded every step; off: eager.
    auto on = load(dir, p.numerics, true), rec = load(dir, p.numerics, true, false), off = load(dir, p.numerics, false);
    ASSERT_TRUE(on && rec && off);
    const auto a = decode_run(*off, 5, n);
    const auto b = decode_run(*on, 5, n);
    const auto c = decode_run(*rec, 5, n);
    const int64_t V = on->config().vocab_size;
    EXPECT_TRUE(bitwise_equal(a, b)) << "batch " << n << ": patched graph logits differ from eager: max|d| "
                                     << compare_logits(a, b, V).max_abs;
    EXPECT_TRUE(bitwise_equal(a, c)) << "batch " << n << ": recorded graph logits differ from eager: max|d| "
                                     << compare_logits(a, c, V).max_abs;
    const GpuGraphStats so = stats(*on), sr = stats(*rec), sf = stats(*off);
    const std::string tag = std::string(p.config) + " " + num + " batch " + std::to_string(n);
    print_stats((tag + " patch").c_str(), so);
    print_stats((tag + " record").c_str(), sr);
    print_stats((tag + " off").c_str(), sf);
    for (const GpuGraphStats* s : {&so, &sr}) {
      EXPECT_EQ(s->forwards, kSteps + 1);
      EXPECT_EQ(s->eligible, kSteps);  // the prefill has more than kGpuGraphMaxTokens tokens
      EXPECT_GE(s->launches, s->eligible * 9 / 10);
      EXPECT_EQ(s->launches + s->eager_fallbacks, s->eligible);
    }
    // Patching: after the first step of each op sequence nearly every step replays a cached
    // executable; the executables are never updated (a recorded step instantiates afresh).
    EXPECT_GE(so.patched, so.eligible * 8 / 10);
    EXPECT_GE(so.patched_nodes, 1);  // positions move: some node changes every step
    EXPECT_EQ(so.updates, 0);
    EXPECT_LE(so.instantiations, 32);
    // Recording every step: the shape key lets steps update an executable in place.
    EXPECT_EQ(sr.patched, 0);
    EXPECT_GE(sr.updates, 1);
    EXPECT_EQ(sf.launches, 0);
    EXPECT_EQ(sf.eligible, 0);
  }
}

// Programmatic dependent launch (GpuLoadOptions::programmatic_launch, on by default): kernels
// overlap their predecessors' ends only in launch and scheduling, so the logits are bitwise those
// with it off, in patched graphs and eager; and graphs captured with its programmatic edges are
// still replayed by patching.
TEST_P(GpuGraphDecode, ProgrammaticLaunchOnEqualsOffBitwise) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  const std::string dir = make_ckpt(p.config);
  auto opts = [](bool graphs, bool pdl) {
    GpuLoadOptions o = graph_options(graphs);
    o.programmatic_launch = pdl;
    return o;
  };
  auto load_with = [&](const GpuLoadOptions& o) { return load(dir, p.numerics, o); };
  auto graph_pdl = load_with(opts(true, true)), graph_plain = load_with(opts(true, false));
  auto eager_pdl = load_with(opts(false, true)), eager_plain = load_with(opts(false, false));
  ASSERT_TRUE(graph_pdl && graph_plain && eager_pdl && eager_plain);
  const auto a = decode_run(*eager_plain, 7), b = decode_run(*eager_pdl, 7);
  const auto c = decode_run(*graph_plain, 7), d = decode_run(*graph_pdl, 7);
  const int64_t V = graph_pdl->config().vocab_size;
  EXPECT_TRUE(bitwise_equal(a, b)) << "eager, PDL on vs off: max|d| " << compare_logits(a, b, V).max_abs;
  EXPECT_TRUE(bitwise_equal(a, c)) << "graphs without PDL vs eager: max|d| " << compare_logits(a, c, V).max_abs;
  EXPECT_TRUE(bitwise_equal(a, d)) << "graphs with PDL vs eager: max|d| " << compare_logits(a, d, V).max_abs;
  const GpuGraphStats s = stats(*graph_pdl);
  print_stats((std::string(p.config) + " graphs + PDL").c_str(), s);
  EXPECT_GE(s.patched, s.eligible * 8 / 10);
  EXPECT_EQ(s.eager_fallbacks, 0);
}

// Row fusion (GpuLoadOptions::row_fusion: Backend::norm_rope_quant in one launch, with the ring
// write for one sequence (Backend::window_kv_rows), Backend::moe_combine_post in one launch,
// Backend::attention_unrope's rotation in the decode attention's launch) runs the same
// expressions in the same order as the separate kernels, so the logits are bitwise those with it
// off, over the prefills (eager), the decode steps of one and of two sequences and verify blocks
// with rollbacks, eager and in graphs, alone and with the side branches (the CLI runs both). With
// the library's attention and linears, and (reference numerics) with the CLI's: the tensor-core
// decode and prefill attention, whose fold takes the inverse RoPE, and the BF16 tensor-core linears.
TEST_P(GpuGraphDecode, RowFusionOnEqualsOffBitwise) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  const std::string dir = make_ckpt(p.config);
  for (const bool cli_paths : {false, true}) {
    if (cli_paths && p.numerics != Numerics::kReference) continue;  // the tensor-core paths need it
    const std::string paths = cli_paths ? "CLI paths" : "library paths";
    auto load_with = [&](bool graphs, bool fuse, GpuBranches br) {
      GpuLoadOptions o = graph_options(graphs);
      o.row_fusion = fuse;
      o.branches = br;
      if (cli_paths) {
        o.decode_attention_tensor = true;
        o.prefill_attention = GpuPrefillAttention::kAuto;
        o.tensor_core_linears = true;
      }
      return load(dir, p.numerics, o);
    };
    auto plain = load_with(false, false, GpuBranches::kOff), fused = load_with(false, true, GpuBranches::kOff);
    auto fused_graphs = load_with(true, true, GpuBranches::kOff);
    auto fused_branches = load_with(true, true, GpuBranches::kOn);
    ASSERT_TRUE(plain && fused && fused_graphs && fused_branches);
    const int64_t V = plain->config().vocab_size;
    for (int n : {1, 2}) {
      const auto a = decode_run(*plain, 13, n), b = decode_run(*fused, 13, n), c = decode_run(*fused_graphs, 13, n);
      const auto d = decode_run(*fused_branches, 13, n);
      EXPECT_TRUE(bitwise_equal(a, b)) << paths << ", " << n << " sequence(s), eager, fusion on vs off: max|d| "
                                       << compare_logits(a, b, V).max_abs;
      EXPECT_TRUE(bitwise_equal(a, c)) << paths << ", " << n << " sequence(s), graphs + fusion vs eager off: max|d| "
                                       << compare_logits(a, c, V).max_abs;
      EXPECT_TRUE(bitwise_equal(a, d)) << paths << ", " << n
                                       << " sequence(s), graphs + fusion + branches vs eager off: max|d| "
                                       << compare_logits(a, d, V).max_abs;
    }
    // Verify blocks with rollbacks: 6 rows written to the ring before the attention (one sequence,
    // the ring's spare slots), rolled back and overwritten.
    const auto va = verify_run(*plain, kVerifyBlocks), vb = verify_run(*fused, kVerifyBlocks);
    const auto vc = verify_run(*fused_graphs, kVerifyBlocks), vd = verify_run(*fused_branches, kVerifyBlocks);
    EXPECT_TRUE(bitwise_equal(va, vb)) << paths << ", verify blocks, eager, fusion on vs off: max|d| "
                                       << compare_logits(va, vb, V).max_abs;
    EXPECT_TRUE(bitwise_equal(va, vc)) << paths << ", verify blocks, graphs + fusion vs eager off: max|d| "
                                       << compare_logits(va, vc, V).max_abs;
    EXPECT_TRUE(bitwise_equal(va, vd)) << paths << ", verify blocks, graphs + fusion + branches vs eager off: max|d| "
                                       << compare_logits(va, vd, V).max_abs;
    for (const auto* m : {fused_graphs.get(), fused_branches.get()}) EXPECT_EQ(stats(*m).eager_fallbacks, 0) << paths;
  }
}

// Three loads of `dir`: with an option off (eager), on (eager) and on in patched graphs (`set`
// switches it on); the logits of decode steps of one and two sequences and of verify blocks with
// rollbacks must be the off model's bits, and the graphs must replay without eager fallbacks.
// Returns the models (null where a load failed: reported) for the caller's launch counts.
struct OnOff {
  std::unique_ptr<Model> off, on, on_graphs;
  bool ok() const { return off && on && on_graphs; }
};
template <class Set>
OnOff expect_option_bitwise(const std::string& dir, Numerics numerics, Set set, uint64_t seed, const char* what) {
  auto load_with = [&](bool graphs, bool on) {
    GpuLoadOptions o = graph_options(graphs);
    if (on) set(o);
    return load(dir, numerics, o);
  };
  OnOff m{load_with(false, false), load_with(false, true), load_with(true, true)};
  if (!m.ok()) {
    ADD_FAILURE() << what << ": a model did not load";
    return m;
  }
  const int64_t V = m.off->config().vocab_size;
  for (int n : {1, 2}) {
    const auto a = decode_run(*m.off, seed, n), b = decode_run(*m.on, seed, n), c = decode_run(*m.on_graphs, seed, n);
    EXPECT_TRUE(bitwise_equal(a, b)) << what << ", " << n << " sequence(s), eager, on vs off: max|d| "
                                     << compare_logits(a, b, V).max_abs;
    EXPECT_TRUE(bitwise_equal(a, c)) << what << ", " << n << " sequence(s), graphs + on vs eager off: max|d| "
                                     << compare_logits(a, c, V).max_abs;
  }
  const auto va = verify_run(*m.off, kVerifyBlocks), vb = verify_run(*m.on, kVerifyBlocks);
  const auto vc = verify_run(*m.on_graphs, kVerifyBlocks);
  EXPECT_TRUE(bitwise_equal(va, vb)) << what << ", verify blocks, eager: max|d| " << compare_logits(va, vb, V).max_abs;
  EXPECT_TRUE(bitwise_equal(va, vc)) << what << ", verify blocks, graphs: max|d| " << compare_logits(va, vc, V).max_abs;
  EXPECT_EQ(stats(*m.on_graphs).eager_fallbacks, 0) << what;
  return m;
}

// Each stream update with the next sublayer's mHC mixes in one launch
// (GpuLoadOptions::post_mixes_fusion: Backend::hc_post_mixes for the attention's update and the
// FFN's mixes, moe_combine_post_mixes for the FFN's update and the next block's attention mixes;
// the kernel takes hidden sizes that are whole 1024-value chunks, so the tiny config widened to
// 1024) forms the same sums in the same order as the update then the mixes, so the logits are bitwise those with it off, eager and in
// patched graphs, over decode steps of one and two sequences and verify blocks with rollbacks;
// and the fused launch did run (not the fallback).
TEST_P(GpuGraphDecode, PostMixesFusionOnEqualsOffBitwise) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  auto cfg = model::builtin_config(p.config);
  ASSERT_TRUE(cfg.ok());
  model::ModelConfig wide = cfg.value();
  wide.hidden_size = 1024;
  const std::string dir = tiny_checkpoint(std::string("fs_gpugraph_wide_") + p.config, wide, 23);
  const OnOff m = expect_option_bitwise(
      dir, p.numerics, [](GpuLoadOptions& o) { o.post_mixes_fusion = true; }, 31, "post + mixes fusion");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(stats(*m.off).post_mixes_fused, 0);
  EXPECT_GT(stats(*m.on).post_mixes_fused, 0);
  EXPECT_GT(stats(*m.on_graphs).post_mixes_fused, 0);
}

// Each sublayer's input by one launch (GpuLoadOptions::collapse_norm_fusion: the mHC collapse and
// the RMS norm of Backend::hc_collapse_norm, and the LM head's) forms the same values as the two
// launches: the logits are bitwise those with it off, eager and in patched graphs, over the
// prompts' prefill, decode steps of one and two sequences, and verify blocks with rollbacks; and
// the fused launch did run.
TEST_P(GpuGraphDecode, CollapseNormFusionOnEqualsOffBitwise) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  const std::string dir = make_ckpt(p.config);
  const OnOff m = expect_option_bitwise(
      dir, p.numerics, [](GpuLoadOptions& o) { o.collapse_norm_fusion = true; }, 37, "collapse + norm fusion");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(stats(*m.off).collapse_norm_fused, 0);
  EXPECT_GT(stats(*m.on).collapse_norm_fused, 0);
  EXPECT_GT(stats(*m.on_graphs).collapse_norm_fused, 0);
}

// The routed experts in the FP4 fragment order (GpuLoadOptions::fp4_fragments): the GEMVs read
// the same values in the same order and the prefill GEMM the same values (expanded from the
// fragment order), so the logits are bitwise those of the row-major experts, eager and in patched
// graphs, over decode steps of one and two sequences and verify blocks with rollbacks, with the
// prompts prefilled through the grouped GEMMs where the config takes them (moe_gemm_min_tokens 1,
// BF16-direct operands: with the fragments the experts expanded first, without them in the
// kernel with W in registers). The experts' stacks were packed, gate, up and down together.
TEST_P(GpuGraphDecode, Fp4FragmentsOnEqualsOffBitwise) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  const std::string dir = make_ckpt(p.config);
  auto load_with = [&](bool graphs, bool on) {
    GpuLoadOptions o = graph_options(graphs);
    o.moe_gemm_min_tokens = 1;
    o.prefill_gemm_bf16 = o.prefill_gemm_direct = true;
    o.fp4_fragments = on;
    return load(dir, p.numerics, o);
  };
  auto off = load_with(false, false), on = load_with(false, true), on_graphs = load_with(true, true);
  ASSERT_TRUE(off && on && on_graphs);
  const int64_t V = off->config().vocab_size;
  for (int n : {1, 2}) {
    const auto a = decode_run(*off, 41, n), b = decode_run(*on, 41, n), c = decode_run(*on_graphs, 41, n);
    EXPECT_TRUE(bitwise_equal(a, b)) << n << " sequence(s), eager, on vs off: max|d| " << compare_logits(a, b, V).max_abs;
    EXPECT_TRUE(bitwise_equal(a, c)) << n << " sequence(s), graphs + on vs eager off: max|d| "
                                     << compare_logits(a, c, V).max_abs;
  }
  const auto va = verify_run(*off, kVerifyBlocks), vb = verify_run(*on, kVerifyBlocks);
  const auto vc = verify_run(*on_graphs, kVerifyBlocks);
  EXPECT_TRUE(bitwise_equal(va, vb)) << "verify blocks, eager: max|d| " << compare_logits(va, vb, V).max_abs;
  EXPECT_TRUE(bitwise_equal(va, vc)) << "verify blocks, graphs: max|d| " << compare_logits(va, vc, V).max_abs;
  EXPECT_EQ(stats(*on_graphs).eager_fallbacks, 0);
  EXPECT_EQ(stats(*off).fp4_fragment_stacks, 0);
  for (const auto* m : {on.get(), on_graphs.get()}) {
    // Exact numerics run the experts through the exactness kernels: nothing to pack.
    if (p.numerics == Numerics::kReference) {
      EXPECT_GT(stats(*m).fp4_fragment_stacks, 0);
    } else {
      EXPECT_EQ(stats(*m).fp4_fragment_stacks, 0);
    }
    EXPECT_EQ(stats(*m).fp4_fragment_stacks % 3, 0) << "gate, up and down are packed together";
  }
  EXPECT_EQ(stats(*on).moe_gemm_layers > 0, stats(*off).moe_gemm_layers > 0) << "the same prefill route";
}

// The dense FP8 matrices in the FP8 fragment order (GpuLoadOptions::fp8_fragments): the decode
// GEMVs read the same values in the same order, and the readers of row-major tiles (the tiled
// GEMV, the prefill GEMM) a row-major copy unpacked per launch, so the logits are bitwise those of
// the row-major matrices: eager and in patched graphs over decode steps of two sequences and
// verify blocks with rollbacks, with the prompts through the token passes (pre-quantised x), the
// tiled GEMV (gemv_tiled_min_rows 0) and the prefill GEMM (dense_gemm_min_tokens 1). Reference
// numerics pack the GEMVs' matrices; exact numerics have none to pack.
TEST_P(GpuGraphDecode, Fp8FragmentsOnEqualsOffBitwise) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  const std::string dir = make_ckpt(p.config);
  const bool ref = p.numerics == Numerics::kReference;
  struct Route {
    const char* name;
    int64_t tiled_min_rows, dense_gemm_min_tokens;
    bool unpacks;  // the prompts' launches read a row-major copy
  };
  for (const Route r : {Route{"token passes", 192, 0, false}, Route{"tiled GEMV", 0, 0, true},
                        Route{"prefill GEMM", 192, 1, true}}) {
    SCOPED_TRACE(r.name);
    auto load_with = [&](bool graphs, bool on) {
      GpuLoadOptions o = graph_options(graphs);
      o.gemv_tiled_min_rows = r.tiled_min_rows;
      o.dense_gemm_min_tokens = r.dense_gemm_min_tokens;
      o.prefill_gemm_bf16 = o.prefill_gemm_direct = true;
      o.fp8_fragments = on;
      return load(dir, p.numerics, o);
    };
    const bool first = r.unpacks == false;  // graphs and verify blocks once
    auto off = load_with(false, false), on = load_with(false, true);
    ASSERT_TRUE(off && on);
    const int64_t V = off->config().vocab_size;
    const auto a = decode_run(*off, 43, 2), b = decode_run(*on, 43, 2);
    EXPECT_TRUE(bitwise_equal(a, b)) << "eager, on vs off: max|d| " << compare_logits(a, b, V).max_abs;
    const GpuGraphStats so = stats(*off), sn = stats(*on);
    EXPECT_EQ(so.fp8_fragment_matrices, 0);
    EXPECT_EQ(so.fp8_fragment_unpacks, 0);
    if (ref) {
      EXPECT_GT(sn.fp8_fragment_matrices, 0);
      EXPECT_EQ(sn.fp8_fragment_unpacks > 0, r.unpacks);
    } else {
      EXPECT_EQ(sn.fp8_fragment_matrices, 0) << "exact numerics run no block-scaled GEMV";
    }
    if (!first) continue;
    auto on_graphs = load_with(true, true);
    ASSERT_TRUE(on_graphs);
    const auto c = decode_run(*on_graphs, 43, 2);
    EXPECT_TRUE(bitwise_equal(a, c)) << "graphs + on vs eager off: max|d| " << compare_logits(a, c, V).max_abs;
    const auto va = verify_run(*off, kVerifyBlocks), vb = verify_run(*on, kVerifyBlocks);
    const auto vc = verify_run(*on_graphs, kVerifyBlocks);
    EXPECT_TRUE(bitwise_equal(va, vb)) << "verify blocks, eager: max|d| " << compare_logits(va, vb, V).max_abs;
    EXPECT_TRUE(bitwise_equal(va, vc)) << "verify blocks, graphs: max|d| " << compare_logits(va, vc, V).max_abs;
    EXPECT_EQ(stats(*on_graphs).eager_fallbacks, 0);
  }
}

// Side branches (GpuLoadOptions::branches): the query beside the window KV and the compressors,
// the routed experts beside the shared expert, the DSpark rings beside the LM head, on a second
// stream, run the same kernels on the same inputs, so the logits are bitwise those of one
// stream, eager and in patched graphs, at either side-stream priority; graphs with the
// branches' fork and join edges still replay by patching, and the first step's new side-branch
// buffers do not push it to an eager fallback.
TEST_P(GpuGraphDecode, SideBranchesEqualOneStreamBitwise) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  const std::string dir = make_ckpt(p.config);
  auto load_with = [&](bool graphs, GpuBranches br) {
    GpuLoadOptions o = graph_options(graphs);
    o.branches = br;
    return load(dir, p.numerics, o);
  };
  auto one_stream = load_with(false, GpuBranches::kOff);
  ASSERT_TRUE(one_stream);
  const auto a = decode_run(*one_stream, 9);
  const int64_t V = one_stream->config().vocab_size;
  for (const GpuBranches br : {GpuBranches::kOn, GpuBranches::kPriority}) {
    const char* name = br == GpuBranches::kOn ? "on" : "priority";
    auto eager = load_with(false, br), graphs = load_with(true, br);
    ASSERT_TRUE(eager && graphs);
    const auto b = decode_run(*eager, 9), c = decode_run(*graphs, 9);
    EXPECT_TRUE(bitwise_equal(a, b)) << "eager, branches " << name << " vs off: max|d| " << compare_logits(a, b, V).max_abs;
    EXPECT_TRUE(bitwise_equal(a, c)) << "graphs, branches " << name << " vs eager off: max|d| "
                                     << compare_logits(a, c, V).max_abs;
    const GpuGraphStats s = stats(*graphs);
    print_stats((std::string(p.config) + " graphs + branches " + name).c_str(), s);
    EXPECT_GE(s.patched, s.eligible * 8 / 10);
    EXPECT_EQ(s.eager_fallbacks, 0);
  }
}

// The tensor-core linears (GpuLoadOptions::tensor_core_linears: wo_a and the LM head on the BF16
// tensor cores), alone and with the tensor-core decode attention (decode_attention_tensor), keep
// batch invariance: a sequence decoded next to another gets the logits it gets alone, bit for
// bit, with graphs on and off; and graphs on equal graphs off.
TEST_P(GpuGraphDecode, TensorCoreLinearsAreBatchInvariant) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  if (p.numerics != Numerics::kReference) GTEST_SKIP() << "the tensor-core linears need reference numerics";
  const std::string dir = make_ckpt(p.config);
  for (const bool attn : {false, true}) {
    std::vector<float> by_graphs[2];
    for (const bool graphs : {true, false}) {
      GpuLoadOptions o = graph_options(graphs);
      o.tensor_core_linears = true;
      o.decode_attention_tensor = attn;
      auto m = load_model_gpu(dir, p.numerics, 0, o);
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      const int64_t V = m.value()->config().vocab_size;
      const auto two = decode_run(*m.value(), 11, 2), one = decode_run(*m.value(), 11, 1);
      ASSERT_EQ(two.size(), 2 * one.size());
      std::vector<float> first(one.size());
      for (int64_t i = 0; i < kSteps; ++i)  // sequence a's row of each two-item step
        std::copy_n(two.begin() + (2 * i) * V, V, first.begin() + i * V);
      EXPECT_TRUE(bitwise_equal(first, one)) << (graphs ? "graphs" : "eager") << (attn ? ", attention" : "")
                                             << ": batched vs alone max|d| " << compare_logits(first, one, V).max_abs;
      by_graphs[graphs] = one;
    }
    EXPECT_TRUE(bitwise_equal(by_graphs[0], by_graphs[1])) << (attn ? "attention: " : "") << "graphs vs eager";
  }
}

// Verify blocks of 6 tokens (all logits) each followed by a rollback of 0..5 of them, as DSpark
// speculation does; graphs on and off agree bitwise, and so do the logits of a final decode.
TEST_P(GpuGraphDecode, VerifyBlocksWithRollbackBitwise) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  const std::string dir = make_ckpt(p.config);
  auto on = load(dir, p.numerics, true), off = load(dir, p.numerics, false);
  ASSERT_TRUE(on && off);
  const int64_t V = on->config().vocab_size;
  const auto a = verify_run(*off, kVerifyBlocks), b = verify_run(*on, kVerifyBlocks);
  EXPECT_TRUE(bitwise_equal(a, b)) << "graph logits differ from eager: max|d| " << compare_logits(a, b, V).max_abs;
  const GpuGraphStats so = stats(*on);
  print_stats("verify blocks, on", so);
  EXPECT_EQ(so.eligible, kVerifyBlocks);
  EXPECT_GE(so.launches, so.eligible * 9 / 10);
  // Blocks start at every compressor phase (rollbacks), so their op sequences vary more than
  // decode steps do: the share of patched blocks is printed, not asserted.
}

INSTANTIATE_TEST_SUITE_P(Configs, GpuGraphDecode,
                         ::testing::Values(Param{"tiny-v41", Numerics::kExact}, Param{"tiny-v41", Numerics::kReference},
                                           Param{"tiny-v4", Numerics::kExact}, Param{"tiny-v4", Numerics::kReference}),
                         param_name);

// TP over NCCL (2 GPUs, and 4 when present: configs whose o_groups split): each rank's thread runs
// its own forward. Patched replay (GpuGraphs::kPatch: the all-reduces stay as NCCL captured them,
// the ranks vote each step), every step recorded (kRecord) and eager give bitwise the same logits; every rank
// replays most decode steps by patching, and all ranks took the same decisions (equal counters).
void nccl_tp_graphs(int world) {
#if FLASHSEEK_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  if (n < world) GTEST_SKIP() << "NCCL TP=" << world << " graph test skipped: needs " << world << " GPUs, this machine has " << n;
  if (!ops::cuda::nccl_built()) GTEST_SKIP() << "NCCL TP graph test skipped: this build has no NCCL";
  std::vector<int> devices(static_cast<size_t>(world));
  std::iota(devices.begin(), devices.end(), 0);
  for (const char* config : {"tiny-v41", "tiny-v4"}) {
    if (auto cfg = model::builtin_config(config); cfg.ok() && cfg.value().o_groups % world != 0) {
      std::printf("[gpu graph] %s TP=%d: skipped (o_groups %lld)\n", config, world, (long long)cfg.value().o_groups);
      continue;
    }
    const std::string dir = make_ckpt(config);
    auto load_tp = [&](bool graphs, bool patch) -> std::unique_ptr<Model> {
      GpuLoadOptions o = graph_options(graphs, patch);
      o.tp_comm = TpComm::kNccl;
      auto m = load_model_tp(dir, Numerics::kExact, devices, o);
      EXPECT_TRUE(m.ok()) << m.status().to_string();
      return m.ok() ? std::move(m).value() : nullptr;
    };
    auto on = load_tp(true, true), rec = load_tp(true, false), off = load_tp(false, true);
    ASSERT_TRUE(on && rec && off);
    const auto a = decode_run(*off, 9);
    const auto b = decode_run(*on, 9);
    const auto c = decode_run(*rec, 9);
    const int64_t V = on->config().vocab_size;
    EXPECT_TRUE(bitwise_equal(a, b)) << config << " TP=" << world << ": patched graphs differ from eager: max|d| "
                                     << compare_logits(a, b, V).max_abs;
    EXPECT_TRUE(bitwise_equal(a, c)) << config << " TP=" << world << ": recorded graphs differ from eager: max|d| "
                                     << compare_logits(a, c, V).max_abs;
    const std::string tag = std::string(config) + " TP=" + std::to_string(world) + " nccl";
    print_stats((tag + " patch").c_str(), stats(*on));
    print_stats((tag + " record").c_str(), stats(*rec));
    auto ranks = gpu_graph_rank_stats(*on);
    ASSERT_TRUE(ranks.ok()) << ranks.status().to_string();
    ASSERT_EQ(ranks.value().size(), size_t(world));
    for (size_t r = 0; r < ranks.value().size(); ++r) {
      const GpuGraphStats& s = ranks.value()[r];
      EXPECT_EQ(s.eligible, kSteps) << "rank " << r;
      EXPECT_EQ(s.launches + s.eager_fallbacks, s.eligible) << "rank " << r;
      EXPECT_GE(s.patched, s.eligible * 8 / 10) << "rank " << r << " patched " << s.patched;
      EXPECT_GE(s.patched_nodes, 1) << "rank " << r;
      const GpuGraphStats& s0 = ranks.value()[0];  // the ranks vote: the same path every step
      EXPECT_EQ(s.patched, s0.patched) << "rank " << r;
      EXPECT_EQ(s.patch_misses, s0.patch_misses) << "rank " << r;
      EXPECT_EQ(s.launches, s0.launches) << "rank " << r;
    }
    const GpuGraphStats so = stats(*off);
    EXPECT_EQ(so.launches, 0);
  }
#else
  (void)world;
#endif
}

// The ranks' host-side vote (Communicator::vote, how NCCL ranks agree to patch or record a step):
// AND / OR over the ranks in every round, rounds back to back (the two vote slots alternate), and
// an abort wakes a rank waiting for the others with an error. No GPU needed (host communicator).
TEST(GpuGraph, RanksVoteAndOr) {
#if FLASHSEEK_HAVE_CUDA
  constexpr int kW = 3, kRounds = 200;
  auto comms = ops::cuda::make_host_comms(kW);
  ASSERT_TRUE(comms.ok()) << comms.status().to_string();
  // Round i: rank r votes all = (i % (kW + 1) != r), any = (i % 5 == r).
  std::vector<std::vector<int>> got(kW, std::vector<int>(kRounds, -1));
  std::vector<std::thread> th;
  for (int r = 0; r < kW; ++r)
    th.emplace_back([&, r] {
      for (int i = 0; i < kRounds; ++i) {
        bool all = i % (kW + 1) != r, any = i % 5 == r;
        if (!comms.value()[size_t(r)]->vote(all, any).ok()) return;
        got[size_t(r)][size_t(i)] = (all ? 1 : 0) | (any ? 2 : 0);
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < kW; ++r)
    for (int i = 0; i < kRounds; ++i) {
      const int want = (i % (kW + 1) >= kW ? 1 : 0) | (i % 5 < kW ? 2 : 0);
      ASSERT_EQ(got[size_t(r)][size_t(i)], want) << "rank " << r << " round " << i;
    }
  // Rank 0 waits for the others; rank 1 fails and aborts the group: rank 0 gets an error.
  Status waited;
  std::thread w([&] {
    bool all = true, any = false;
    waited = comms.value()[0]->vote(all, any);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  comms.value()[1]->abort();
  w.join();
  EXPECT_EQ(waited.code(), StatusCode::kCancelled) << waited.to_string();
  for (auto& c : comms.value()) c->recover();
  std::vector<std::thread> again;  // usable again
  std::vector<int> ok(kW, 0);
  for (int r = 0; r < kW; ++r)
    again.emplace_back([&, r] {
      bool all = true, any = r == 2;
      ok[size_t(r)] = comms.value()[size_t(r)]->vote(all, any).ok() && all && any;
    });
  for (auto& t : again) t.join();
  EXPECT_EQ(ok, std::vector<int>(kW, 1));
#else
  GTEST_SKIP() << "vote test skipped: this build has no CUDA backend (no communicators)";
#endif
}

TEST(GpuGraph, NcclTp2PatchedEqualsEagerBitwise) {
  FS_REQUIRE_GPU();
  nccl_tp_graphs(2);
}

TEST(GpuGraph, NcclTp4PatchedEqualsEagerBitwise) {
  FS_REQUIRE_GPU();
  nccl_tp_graphs(4);
}

}  // namespace
}  // namespace flashseek::forward
