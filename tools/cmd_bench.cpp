// `flashseek bench`: kernel-level layer-slice benchmark on the GPU (bench/cuda/layer_bench.h).
// Without a CUDA build or a device it fails with a clear message.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cuda/gpu_model.h"
#include "backends/cuda/gpu_tp.h"
#include "forward/model.h"
#include "model/counts.h"
#include "model/flops.h"
#include "tools/backend_options.h"
#include "tools/command.h"
#include "tools/model_source.h"

#if FLASHSEEK_HAVE_CUDA
#include "bench/cuda/bench_util.h"
#include "bench/cuda/kernel_bench.h"
#include "bench/cuda/layer_bench.h"
#include "bench/cuda/prefill_bench.h"
#include "bench/cuda/spec_bench.h"
#include "bench/cuda/tp_bench.h"
#include "ops/cuda/gemv/gemv.h"
#include "ops/cuda/runtime/launch.cuh"
#endif

namespace flashseek::tools {
namespace {

struct ModelBenchOpts {
  ModelSourceCli source;
  uint64_t seed = 0;
  std::string gpus;  // "" = the CPU backend
  std::string numerics = "reference";
  int prompt = 16;
  int batch = 1;
  std::string prefill_attention = "auto";  // --prefill-attention (GpuLoadOptions::prefill_attention)
  std::string decode_attention = "tensor";  // --decode-attention (GpuLoadOptions::decode_attention_tensor; as run / serve)
  int step_tokens = 1;                     // tokens per sequence in each timed step (6: a verify block)
  int prefill_chunk = 8192;                // most tokens in one prefill forward
  int prefill_reps = 1;                    // timed prefills (fresh sequences each; the median reported)
  std::string pdl = "on";                  // --gpu-pdl (GpuLoadOptions::programmatic_launch)
  int gemv_fp4_chunk = 0;                  // --gemv-fp4-chunk (GpuLoadOptions::gemv_fp4_chunk)
  int gemv_fp4_ring = 0;                   // --gemv-fp4-ring (GpuLoadOptions::gemv_ring_stages; layer slices too)
  int mma_decode_tiles = 0;                // --mma-decode-tiles (GpuLoadOptions::mma_decode_tiles)
  std::string branches = "on";             // --gpu-branches (GpuLoadOptions::branches; as run / serve)
  std::string stack_qkv = "on";            // --gpu-stack-qkv (GpuLoadOptions::stack_query_kv; as run / serve)
  std::string row_fusion = "on";           // --gpu-row-fusion (GpuLoadOptions::row_fusion; as run / serve)
  std::string post_mixes = "off";          // --gpu-post-mixes (GpuLoadOptions::post_mixes_fusion; as run / serve)
  std::string collapse_norm = "off";       // --gpu-collapse-norm (GpuLoadOptions::collapse_norm_fusion; as run / serve)
  std::string exact_linears = "none";      // --gpu-exact-linears (GpuLoadOptions::fast_linears; as run / serve)
  std::string bf16_linears = "tensor";     // --bf16-linears (GpuLoadOptions::tensor_core_linears; as run / serve)
  int64_t moe_gemm_min_tokens = 128;       // --moe-gemm-min-tokens (GpuLoadOptions::moe_gemm_min_tokens)
  int64_t dense_gemm_min_tokens = 128;     // --dense-gemm-min-tokens (GpuLoadOptions::dense_gemm_min_tokens)
  int64_t gemv_tiled_min_rows = 192;       // --gemv-tiled-min-rows (GpuLoadOptions::gemv_tiled_min_rows)
  int64_t gemv_prequant_min_rows = 9;      // --gemv-prequant-min-rows (GpuLoadOptions::gemv_prequant_min_rows)
  // --prefill-gemm-operands (GpuLoadOptions::prefill_gemm_bf16, prefill_gemm_expand_w, prefill_gemm_direct)
  std::string prefill_gemm_operands = "bf16-direct";
  int64_t moe_expand_min_rows = kDefaultMoeExpandMinRows;  // --moe-expand-min-rows (GpuLoadOptions::moe_expand_min_rows)
  std::string moe_w_registers = "on";      // --moe-w-registers (GpuLoadOptions::moe_w_in_registers)
  std::string moe_compact_groups = "on";   // --moe-compact-groups (GpuLoadOptions::moe_compact_groups)
  std::string fp4_fragments = "on";        // --gpu-fp4-fragments (GpuLoadOptions::fp4_fragments; layer slices too)
  std::string fp8_fragments = "off";       // --gpu-fp8-fragments (GpuLoadOptions::fp8_fragments)
  std::string engram_tables = "host";      // --engram-tables (GpuLoadOptions::engram_on_device)
};

// `bench --load-format dummy` (or `--ckpt DIR`): the engine's own model, not a layer slice.
// Generates (or loads) the weights, loads them on the backend, prefills `batch` sequences with
// `prompt` tokens each and times `reps` decode steps of all of them together; prints the
// generation / load rates, prefill tok/s, the median decode step and its share per layer, and a
// checksum of the first step's logits (the same seed gives the same value).
int run_model_bench(const ModelBenchOpts& o, int reps) {
  using clock = std::chrono::steady_clock;
  auto fail = [](const Status& st) {
    std::cerr << "bench: " << st.message() << "\n";
    return 1;
  };
  // A bad --gpus list is refused before any weights are made.
  [[maybe_unused]] std::vector<int> devices;
  if (!o.gpus.empty()) {
    auto d = forward::parse_gpu_list(o.gpus);
    if (!d.ok()) return fail(d.status());
    devices = std::move(d).value();
  }
  auto source = resolve_model_source(o.source, o.seed);
  if (!source.ok()) return fail(source.status());
  if (Status st = materialize_model_source(*source, o.source, o.seed); !st.ok()) return fail(st);
  forward::GpuLoadOptions lo;
  lo.load_threads = o.source.threads;
  lo.load_progress = load_progress_printer(lo.load_threads);
  lo.prefill_attention = prefill_attention(o.prefill_attention);
  lo.decode_attention_tensor = o.decode_attention == "tensor";
  lo.programmatic_launch = o.pdl != "off";
  lo.gemv_fp4_chunk = o.gemv_fp4_chunk;
  lo.gemv_ring_stages = o.gemv_fp4_ring;
  lo.mma_decode_tiles = o.mma_decode_tiles;
  lo.branches = gpu_branches(o.branches);
  lo.stack_query_kv = o.stack_qkv == "on";
  lo.row_fusion = o.row_fusion == "on";
  lo.post_mixes_fusion = o.post_mixes == "on";
  lo.collapse_norm_fusion = o.collapse_norm == "on";
  auto fast = fast_linears_without(o.exact_linears);
  if (!fast.ok()) return fail(fast.status());
  lo.fast_linears = fast.value();
  lo.tensor_core_linears = o.bf16_linears == "tensor";
  lo.moe_gemm_min_tokens = o.moe_gemm_min_tokens;
  lo.dense_gemm_min_tokens = o.dense_gemm_min_tokens;
  lo.gemv_tiled_min_rows = o.gemv_tiled_min_rows;
  lo.gemv_prequant_min_rows = o.gemv_prequant_min_rows;
  apply_prefill_gemm_operands(o.prefill_gemm_operands, lo);
  lo.moe_expand_min_rows = o.moe_expand_min_rows;
  lo.moe_w_in_registers = o.moe_w_registers == "on";
  lo.moe_compact_groups = o.moe_compact_groups == "on";
  lo.fp4_fragments = o.fp4_fragments == "on";
  lo.fp8_fragments = o.fp8_fragments == "on";
  lo.engram_on_device = o.engram_tables == "device";
#if FLASHSEEK_HAVE_CUDA
  // The copy bandwidth (the HBM floor's rate) and the FP8 ceiling (the prefill's yardstick) of the
  // first of --gpus, taken before the load: their buffers must not compete with the model's memory.
  double copy_gbps = 0, fp8_tflops = 0;
  std::string limits_error;
  if (!devices.empty())
    if (Status st = ops::cuda::measure_device_limits(devices.front(), &copy_gbps, o.prompt > 0 ? &fp8_tflops : nullptr);
        !st.ok())
      limits_error = st.message();
#endif
  const auto t0 = clock::now();
  auto model = forward::load_model_for(
      source->name, o.numerics == "exact" ? forward::Numerics::kExact : forward::Numerics::kReference, o.gpus, lo);
  if (!model.ok()) return fail(model.status().with_context("loading " + source->name));
  print_load_summary(*source, t0);
  forward::Model& m = **model;
  const auto& c = m.config();
  std::vector<std::unique_ptr<forward::SequenceState>> seqs;
  std::vector<std::vector<int32_t>> prompts(size_t(o.batch));
  for (int b = 0; b < o.batch; ++b) {
    seqs.push_back(m.new_sequence());
    for (int i = 0; i < o.prompt; ++i)
      prompts[size_t(b)].push_back(int32_t((uint64_t(b) * 7919 + uint64_t(i) * 104729 + 1) % uint64_t(c.vocab_size)));
  }
  std::vector<float> logits;
  std::vector<forward::BatchItem> items(size_t(o.batch));
  // Prefill: one forward of every sequence's prompt while the step holds at most prefill_chunk
  // tokens; otherwise each sequence alone, in chunks of at most prefill_chunk tokens (the GPU's
  // activation scratch grows with the step's tokens). A throwaway forward of the largest prefill
  // step runs first, so that first-use work (scratch growth, kernel attributes) is not timed.
  if (o.prompt > 0) {
    std::vector<std::unique_ptr<forward::SequenceState>> warm;
    std::vector<forward::BatchItem> witems;
    const bool one_step = int64_t(o.batch) * o.prompt <= o.prefill_chunk;
    for (int b = 0; b < (one_step ? o.batch : 1); ++b) {
      warm.push_back(m.new_sequence());
      const int n = one_step ? o.prompt : std::min(o.prefill_chunk, o.prompt);
      witems.push_back({warm.back().get(), std::span<const int32_t>(prompts[size_t(b)]).first(size_t(n))});
    }
    std::vector<float> wl;
    if (Status st = m.forward(witems, wl); !st.ok()) return fail(st);
  }
  std::vector<double> prefills;
  for (int pr = 0; pr < std::max(o.prefill_reps, 1); ++pr) {
    if (pr > 0) {  // the same prompts again on fresh sequences
      for (auto& s : seqs) s = m.new_sequence();
      logits.clear();
    }
    const auto p0 = clock::now();
    if (int64_t(o.batch) * o.prompt <= o.prefill_chunk) {
      for (int b = 0; b < o.batch; ++b) items[size_t(b)] = {seqs[size_t(b)].get(), prompts[size_t(b)]};
      if (Status st = m.forward(items, logits); !st.ok()) return fail(st);
    } else {
      std::vector<float> part;
      for (int b = 0; b < o.batch; ++b)
        for (int i = 0; i < o.prompt; i += o.prefill_chunk) {
          const int n = std::min(o.prefill_chunk, o.prompt - i);
          forward::BatchItem one{seqs[size_t(b)].get(), std::span<const int32_t>(prompts[size_t(b)]).subspan(size_t(i), size_t(n))};
          part.clear();
          if (Status st = m.forward(std::span<forward::BatchItem>(&one, 1), part); !st.ok()) return fail(st);
          if (i + n == o.prompt) logits.insert(logits.end(), part.begin(), part.end());  // the last row
        }
    }
    prefills.push_back(std::chrono::duration<double>(clock::now() - p0).count());
  }
  std::vector<double> sorted_prefills = prefills;
  std::sort(sorted_prefills.begin(), sorted_prefills.end());
  const double prefill_s = sorted_prefills[sorted_prefills.size() / 2];
  double checksum = 0;
  for (float x : logits) checksum += double(x);
  std::vector<double> steps;
  // Each step feeds every sequence its greedy next token and, for a verify block's shape,
  // step_tokens - 1 more, with logits for every row (as a verify step asks for). One-token steps
  // on a model that samples on its device draw the greedy token there, as the engine's decode
  // steps do (no logits rows come back).
  const size_t S = size_t(o.step_tokens);
  const bool dev_sample = S == 1 && m.samples_on_device();
  ops::SampleSpec greedy;
  greedy.temperature = 0;
  std::vector<int32_t> next(size_t(o.batch) * S);
  size_t rows_per_item = 1;  // logits rows per sequence in the previous forward (the prefill: 1)
  const auto g0 = forward::gpu_graph_stats(m);  // the timed steps' graph counters (GPU backends)
  for (int r = 0; r < reps; ++r) {
    for (int b = 0; b < o.batch; ++b) {
      int32_t* nb = next.data() + size_t(b) * S;
      if (dev_sample && r > 0) {
        nb[0] = std::max(items[size_t(b)].sampled, 0);  // the previous step's token (-1: no finite logit)
      } else {
        const float* row = logits.data() + (size_t(b) + 1) * rows_per_item * size_t(c.vocab_size) - size_t(c.vocab_size);
        nb[0] = int32_t(std::max_element(row, row + c.vocab_size) - row);  // greedy after the last row
      }
      for (size_t j = 1; j < S; ++j) nb[j] = int32_t((uint64_t(nb[j - 1]) * 2654435761u + j) % uint64_t(c.vocab_size));
      items[size_t(b)] = {seqs[size_t(b)].get(), std::span<const int32_t>(nb, S)};
      items[size_t(b)].all_logits = S > 1;
      if (dev_sample) items[size_t(b)].sample = &greedy;
    }
    rows_per_item = S;
    logits.clear();
    const auto s0 = clock::now();
    if (Status st = m.forward(items, logits); !st.ok()) return fail(st);
    steps.push_back(std::chrono::duration<double>(clock::now() - s0).count());
  }
  const auto g1 = forward::gpu_graph_stats(m);
  std::sort(steps.begin(), steps.end());
  const double med = steps.empty() ? 0 : steps[steps.size() / 2];
  std::printf("model bench: %s, %lld layers, backend %s (%s), numerics %s\n", source->name.c_str(),
              static_cast<long long>(c.num_layers), o.gpus.empty() ? "cpu" : ("cuda:" + o.gpus).c_str(),
              m.backend_kind().c_str(), o.numerics.c_str());
  std::printf("prefill: %d x %d tokens in %.3f s (%.1f tok/s)", o.batch, o.prompt, prefill_s,
              prefill_s > 0 ? o.batch * o.prompt / prefill_s : 0.0);
  if (prefills.size() > 1)
    std::printf(", median of %zu (%.3f .. %.3f s)", prefills.size(), sorted_prefills.front(), sorted_prefills.back());
  std::printf("\n");
  // The prefill's arithmetic as perf-budget.md §4.1 counts it (model/flops.h): each prompt from
  // position 0 through the model's layers; the LM head's last row is left out.
  const model::PrefillFlops pf = model::prefill_flops(c, 0, o.prompt);
  const double pf_flops = pf.total() * double(o.batch), pf_rate = prefill_s > 0 ? pf_flops / prefill_s / 1e12 : 0.0;
  if (o.prompt > 0)
    std::printf("prefill work: %.4g TFLOP (matrices %.4g, attention %.4g, index scores %.4g), %.4g TFLOP/s over the "
                "median wall time\n",
                pf_flops / 1e12, pf.linear * o.batch / 1e12, pf.attention * o.batch / 1e12, pf.index * o.batch / 1e12,
                pf_rate);
  std::printf("decode: batch %d x %d tokens, median %.3f ms/step over %d steps (%.3f ms per layer, %.1f tok/s "
              "aggregate)%s\n",
              o.batch, o.step_tokens, med * 1e3, reps, med * 1e3 / double(std::max<int64_t>(c.num_layers, 1)),
              med > 0 ? o.batch * o.step_tokens / med : 0.0, dev_sample ? ", greedy tokens drawn on the device" : "");
  std::printf("logits checksum (prefill rows): %.9g\n", checksum);
  if (g0.ok() && g1.ok() && reps > 0) {
    // How the timed steps ran: replayed graphs (patched) or recorded ones, or eagerly; the host
    // time until the step's final sync and the time waiting in it, per step.
    const auto d = [&](int64_t forward::GpuGraphStats::*f) { return static_cast<long long>((*g1).*f - (*g0).*f); };
    const double n = double(std::max<int64_t>(g1->timed - g0->timed, 1));
    const double np = double(std::max<int64_t>(g1->patched - g0->patched, 1));
    std::printf("decode steps: %lld graph launches (%lld patched, %lld new executables), %lld eager; host %.3f ms, "
                "sync wait %.3f ms per step; patched steps: tape %.3f ms, %.0f node updates + launch %.3f ms per step\n",
                d(&forward::GpuGraphStats::launches), d(&forward::GpuGraphStats::patched),
                d(&forward::GpuGraphStats::instantiations), d(&forward::GpuGraphStats::eager_fallbacks),
                double(g1->host_ns - g0->host_ns) / n * 1e-6, double(g1->wait_ns - g0->wait_ns) / n * 1e-6,
                double(g1->tape_ns - g0->tape_ns) / np * 1e-6,
                double(g1->patched_nodes - g0->patched_nodes) / np, double(g1->apply_ns - g0->apply_ns) / np * 1e-6);
  }
  if (auto st = forward::gpu_graph_stats(m); st.ok())
    std::printf("prefill GEMMs: %lld dense linears, %lld MoE layers, %lld weight expansions; MoE layers "
                "grouped in compact form: %lld\n",
                static_cast<long long>(st->dense_gemm_linears), static_cast<long long>(st->moe_gemm_layers),
                static_cast<long long>(st->weight_expansions), static_cast<long long>(st->moe_compact_groupings));
  if (auto st = forward::gpu_graph_stats(m); st.ok() && st->paired_linears > 0)
    std::printf("stacked wq_a + wkv: %lld launches\n", static_cast<long long>(st->paired_linears));
  // The HBM floor of a step: the weight bytes it must read (every matrix but the embedding table
  // and the Engram tables, of which it reads a row each; the routed experts by the distinct
  // experts its tokens touch, in expectation under uniform top-k routing), over the device's
  // measured copy bandwidth (read + write bytes per second, as the layer slices' "% of copy BW").
  const model::ModelCounts counts = model::count_from_config(c);
  auto comp = [&](model::Component k) { return double(counts.components[size_t(k)].bytes); };
  const double embed_table = double(c.vocab_size) * double(c.hidden_size) * 2.0;  // BF16
  const double E = double(std::max<int64_t>(c.n_routed_experts, 1)), K = double(c.n_experts_per_tok);
  const double tokens = double(o.batch) * double(o.step_tokens);
  const double touched = E * (1.0 - std::pow(1.0 - std::min(K / E, 1.0), tokens));
  const double bytes = comp(model::Component::kAttention) + comp(model::Component::kSharedRouters) +
                       comp(model::Component::kEmbedHead) - embed_table + comp(model::Component::kEngramProj) +
                       comp(model::Component::kCompressors) + comp(model::Component::kRoutedExperts) * touched / E;
  std::printf("step bytes (floor): %.1f MB (routed experts: %.1f of %.0f per layer touched in expectation)\n",
              bytes / 1e6, touched, E);
#if FLASHSEEK_HAVE_CUDA
  if (!o.gpus.empty() && !limits_error.empty()) {
    std::printf("HBM floor and FP8 ceiling not measured: %s\n", limits_error.c_str());
  } else if (!o.gpus.empty()) {
    const double floor_ms = bytes / (copy_gbps * 1e9) * 1e3;
    std::printf("HBM floor: %.3f ms at the measured copy bandwidth %.0f GB/s; the step is %.1f %% of it "
                "(%.2fx the floor)\n",
                floor_ms, copy_gbps, med > 0 ? 100.0 * floor_ms / (med * 1e3) : 0.0,
                floor_ms > 0 ? med * 1e3 / floor_ms : 0.0);
    // The prefill against the FP8 ceiling the prefill reports use (the e4m3 GEMM at 8192³).
    if (o.prompt > 0)
      std::printf("FP8 ceiling: gemm_fp8 at 8192^3 %.0f TFLOP/s (measured in this run, before the load); the "
                  "prefill's %.1f TFLOP/s are %.1f %% of it\n",
                  fp8_tflops, pf_rate, fp8_tflops > 0 ? 100.0 * pf_rate / fp8_tflops : 0.0);
  }
#endif
  return 0;
}

std::function<int()> setup_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench",
                                 "GPU layer-slice benchmark at V4.1 dimensions; with --load-format dummy (or --ckpt): "
                                 "the engine's model on any backend (generation, load, prefill, decode steps)");
  struct Opts {
    std::string tokens = "1,6,8,32";
    int reps = 40;
    int layers = 40;
    std::string out;
    bool spec = false;
    std::string contexts = "4096,131072";
    int graph_layers = 8;
    bool gemv_sweep = false;
    std::string fp8_fragments = "off";
    int tp = 0;
    int prefill = 0;
    std::string kernels;
    std::string skip_variants;
    std::string prefill_experts = "grouped";
    std::string prefill_attn = "prefill";
  };
  auto o = std::make_shared<Opts>();
  auto mo = std::make_shared<ModelBenchOpts>();
  add_model_source_options(cmd, mo->source);
  cmd->add_option("--seed", mo->seed, "with --load-format dummy: the weights' seed")->capture_default_str();
  cmd->add_option("--gpus", mo->gpus,
                  "with --load-format dummy / --ckpt: the backend of the model bench (empty: the CPU; 0: GPU 0)");
  cmd->add_option("--numerics", mo->numerics, "with --load-format dummy / --ckpt: exact | reference")
      ->check(CLI::IsMember({"exact", "reference"}))
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", mo->prompt, "model bench: prompt tokens per sequence")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--batch", mo->batch, "model bench: sequences decoded together")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  add_attention_options(cmd, mo->prefill_attention, mo->decode_attention);  // the model bench's
  cmd->add_option("--prefill-chunk", mo->prefill_chunk, "model bench: most tokens in one prefill forward")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--prefill-reps", mo->prefill_reps,
                  "model bench: timed prefills of the same prompts on fresh sequences (the median is printed)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_option("--step-tokens", mo->step_tokens,
                  "model bench: tokens per sequence in each timed step (1: decode; 6: a verify block's shape)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--bf16-linears", mo->bf16_linears,
                  "model bench, GPU, reference numerics: wo_a and the LM head by the exactness kernels (exact) or "
                  "the BF16 tensor cores (tensor)")
      ->check(CLI::IsMember({"exact", "tensor"}))
      ->capture_default_str();
  cmd->add_option("--moe-gemm-min-tokens", mo->moe_gemm_min_tokens,
                  "model bench, GPU: forwards of at least this many tokens run the routed experts as grouped "
                  "GEMMs over the FP4 weights (0: the grouped expert GEMV always), as run / serve")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--dense-gemm-min-tokens", mo->dense_gemm_min_tokens,
                  "model bench, GPU: forwards of at least this many tokens run the FP8 token linears through the "
                  "FP8 GEMM (0: the block-scaled GEMV always), as run / serve")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--gemv-tiled-min-rows", mo->gemv_tiled_min_rows,
                  "model bench, GPU: block-scaled GEMV launches of at least this many rows take the tiled kernel, "
                  "smaller ones the decode GEMV in token passes (the same bits), as run / serve")
      ->check(CLI::Range(int64_t(0), forward::kMaxGemvTiledMinRows))
      ->capture_default_str();
  cmd->add_option("--gemv-prequant-min-rows", mo->gemv_prequant_min_rows,
                  "model bench, GPU: dense block-scaled GEMV launches of at least this many rows quantise their "
                  "input once before the launch (the same bits), as run / serve")
      ->check(CLI::Range(int64_t(1), forward::kMaxGemvTiledMinRows))
      ->capture_default_str();
  cmd->add_option("--engram-tables", mo->engram_tables,
                  "model bench, GPU: Engram tables in host memory (rows gathered on the host each step) or on the "
                  "device as stored, as run / serve")
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str();
  cmd->add_option("--prefill-gemm-operands", mo->prefill_gemm_operands,
                  "model bench, GPU: the FP8/FP4 prefill GEMMs' operands, f16 | bf16 | bf16-expanded | bf16-direct, as "
                  "run / serve")
      ->check(CLI::IsMember(kPrefillGemmOperands))
      ->capture_default_str();
  cmd->add_option("--moe-expand-min-rows", mo->moe_expand_min_rows,
                  std::string("model bench, GPU: ") + kMoeExpandMinRowsHelp + ", as run / serve")
      ->check(CLI::Range(int64_t(0), kMaxMoeExpandMinRows))
      ->capture_default_str();
  cmd->add_option("--moe-w-registers", mo->moe_w_registers,
                  std::string("model bench, GPU: ") + kMoeWRegistersHelp + ", as run / serve")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--moe-compact-groups", mo->moe_compact_groups,
                  std::string("model bench, GPU: ") + kMoeCompactGroupsHelp + ", as run / serve")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gpu-fp4-fragments", mo->fp4_fragments,
                  std::string("GPU (the model bench and the layer slices): ") + kFp4FragmentsHelp)
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gpu-fp8-fragments", mo->fp8_fragments, std::string("model bench, GPU: ") + kFp8FragmentsHelp)
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  add_exact_linears_option(cmd, mo->exact_linears);
  cmd->add_option("--gpu-branches", mo->branches,
                  "model bench, GPU: a decode step's independent parts on side streams: off | on | priority, "
                  "as run / serve")
      ->check(CLI::IsMember({"off", "on", "priority"}))
      ->capture_default_str();
  cmd->add_option("--gpu-stack-qkv", mo->stack_qkv, std::string("model bench: ") + kStackQkvHelp + ", as run / serve")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gpu-row-fusion", mo->row_fusion, std::string("model bench: ") + kRowFusionHelp + ", as run / serve")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gpu-post-mixes", mo->post_mixes, std::string("model bench: ") + kPostMixesHelp + ", as run / serve")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gpu-collapse-norm", mo->collapse_norm,
                  std::string("model bench: ") + kCollapseNormHelp + ", as run / serve")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gpu-pdl", mo->pdl,
                  "GPU: programmatic dependent launch of the kernels (the model bench and the layer slices): on | off")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gemv-fp4-chunk", mo->gemv_fp4_chunk,
                  std::string("GPU (the model bench and the layer slices): ") + kGemvFp4ChunkHelp)
      ->check(CLI::IsMember({0, 2, 4}))
      ->capture_default_str();
  cmd->add_option("--gemv-fp4-ring", mo->gemv_fp4_ring,
                  std::string("GPU (the model bench and the layer slices): ") + kGemvFp4RingHelp)
      ->check(CLI::Range(0, 8))
      ->capture_default_str();
  cmd->add_option("--mma-decode-tiles", mo->mma_decode_tiles, std::string("GPU (the model bench): ") + kMmaDecodeTilesHelp)
      ->check(CLI::IsMember({0, 1, 2, 4}))
      ->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "comma-separated token counts (M)");
  cmd->add_option("--reps", o->reps, "timed repetitions per kernel (median reported)");
  cmd->add_option("--layers", o->layers, "layers for the projection");
  cmd->add_option("--out", o->out, "also write the Markdown tables to this file");
  cmd->add_flag("--spec", o->spec,
                "DSpark cost model: 1-token vs verify-block layer time, draft cost, projected tok/s "
                "(bench/cuda/spec_bench.h)");
  cmd->add_option("--contexts", o->contexts, "comma-separated context lengths for the indexer");
  cmd->add_option("--graph-layers", o->graph_layers, "decode layers per captured CUDA graph (0: no graph)");
  cmd->add_flag("--gemv-sweep", o->gemv_sweep, "also time the GEMVs at every forced k split");
  cmd->add_option("--gemv-fp8-fragments", o->fp8_fragments,
                  "layer slices: the dense FP8 matrices and the shared expert in the GEMV fragment order (on | off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--tp", o->tp,
                  "multi-GPU mode: measured tensor/expert-parallel layer slice on 1, 2, 4.. N GPUs (eager and "
                  "CUDA graphs with the NCCL all-reduces), NCCL collectives on N GPUs, 8-GPU step projection "
                  "(--tokens: all-reduce rows, default 1,6,8192)");
  cmd->add_option("--prefill", o->prefill,
                  "prefill mode: one layer of an N-token chunk (e.g. 8192), every kernel timed, 40-layer and "
                  "1M-token projection per --contexts (bench/cuda/prefill_bench.h)");
  cmd->add_option("--prefill-experts", o->prefill_experts,
                  "--prefill: routed experts as one grouped GEMM (grouped) or per-expert GEMMs on 8 streams "
                  "(per-expert)")
      ->check(CLI::IsMember({"grouped", "per-expert"}))
      ->capture_default_str();
  cmd->add_option("--prefill-attn", o->prefill_attn,
                  "--prefill: attention and indexer scores with the prefill kernels, checked against the "
                  "decode kernels (prefill), or with the decode kernels only (decode)")
      ->check(CLI::IsMember({"prefill", "decode"}))
      ->capture_default_str();
  cmd->add_option("--kernels", o->kernels,
                  "kernel micro-benchmarks instead of the layer slice, comma-separated: sampling (device "
                  "sampling vs copy + host sampler, V = 129,280), gemm (every FP8 GEMM kernel variant on the "
                  "V4.1 prefill shapes), gemm16 (the prefill GEMM's f16 and bf16 operand modes against e4m3, with "
                  "the promotion or the W expansion left out as timing diagnostics), moe (the routed grouped GEMM at 384 experts), "
                  "attn (the prefill attention's wgmma kernel against its m16n8k16 one, 8k rows x 64 heads x 512 dims), "
                  "mma-order (whether the wgmma GEMM's "
                  "whole-k BF16 steps give mma.sync m16n8k16's bits), topk (the indexer top-512 of 131,072 keys at M = 1 and 6 on every path), "
                  "exact (the GPU model's exactness kernels on decode shapes, former vs GEMV linear, former vs staged "
                  "decode attention at 4k context), h2d (pinned "
                  "host-to-device copy GB/s, the ceiling of loading from a warm page cache) "
                  "(bench/cuda/kernel_bench.h)");
  cmd->add_option("--skip-variants", o->skip_variants,
                  "--kernels gemm: variant digits to leave out of the table, e.g. 67");
  return [o, mo]() -> int {
    // The engine's model on dummy weights (or a checkpoint): any backend, CUDA or not. The layer
    // slices below fill their own buffers on the device (real dims, L2-defeating copies).
    if (mo->source.load_format == "dummy" || !mo->source.ckpt.empty() || !mo->source.config.empty() ||
        mo->source.num_layers > 0)
      return run_model_bench(*mo, o->reps);
#if FLASHSEEK_HAVE_CUDA
    ops::cuda::set_programmatic_launch(mo->pdl != "off");
    ops::cuda::set_gemv_fp4_chunk(mo->gemv_fp4_chunk);
    if (!o->kernels.empty()) {  // bench/cuda/kernel_bench.h
      ops::cuda::KernelBenchOptions ko;
      ko.kernels.clear();
      std::stringstream ss(o->kernels);
      for (std::string k; std::getline(ss, k, ',');) ko.kernels.push_back(k);
      ko.reps = o->reps;
      ko.skip_variants = o->skip_variants;
      auto text = ops::cuda::run_kernel_bench(ko);
      if (!text.ok()) {
        std::cerr << "bench: " << text.status().to_string() << "\n";
        return 1;
      }
      std::cout << *text;
      if (!o->out.empty() && !(std::ofstream(o->out) << *text)) {
        std::cerr << "bench: cannot write --out " << o->out << "\n";
        return 1;
      }
      return 0;
    }
    if (o->spec) {  // bench/cuda/spec_bench.h
      ops::cuda::SpecBenchOptions so;
      so.reps = o->reps, so.layers = o->layers;
      auto rep = ops::cuda::run_spec_bench(so);
      if (!rep.ok()) {
        std::cerr << "bench: " << rep.status().to_string() << "\n";
        return 1;
      }
      const std::string text = ops::cuda::format_spec_bench(*rep, so);
      std::cout << text;
      if (!o->out.empty() && !(std::ofstream(o->out) << text)) {
        std::cerr << "bench: cannot write --out " << o->out << "\n";
        return 1;
      }
      return 0;
    }
    ops::cuda::LayerBenchOptions opt;
    auto parse = [](const std::string& list, const char* flag, std::vector<int>& dst) {
      dst.clear();
      std::stringstream ss(list);
      for (std::string t; std::getline(ss, t, ',');) {
        try {
          dst.push_back(std::stoi(t));
        } catch (...) {
          std::cerr << "bench: " << flag << ": '" << t << "' is not a number\n";
          return false;
        }
      }
      return true;
    };
    if (!parse(o->tokens, "--tokens", opt.tokens) || !parse(o->contexts, "--contexts", opt.contexts)) return 2;
    if (o->prefill != 0) {  // bench/cuda/prefill_bench.h
      ops::cuda::PrefillBenchOptions po;
      po.tokens = o->prefill, po.reps = o->reps, po.layers = o->layers, po.contexts = opt.contexts;
      po.grouped_experts = o->prefill_experts == "grouped";
      po.prefill_kernels = o->prefill_attn == "prefill";
      auto rep = ops::cuda::run_prefill_bench(po);
      if (!rep.ok()) {
        std::cerr << "bench: " << rep.status().to_string() << "\n";
        return 1;
      }
      const std::string text = ops::cuda::format_prefill_bench(*rep, po);
      std::cout << text;
      if (!o->out.empty() && !(std::ofstream(o->out) << text)) {
        std::cerr << "bench: cannot write --out " << o->out << "\n";
        return 1;
      }
      return 0;
    }
    if (o->tp != 0) {  // bench/cuda/tp_bench.h
      ops::cuda::TpBenchOptions to;
      to.world = o->tp, to.reps = o->reps, to.layers = o->layers;
      if (o->tokens != "1,6,8,32") to.tokens = opt.tokens;
      auto rep = ops::cuda::run_tp_bench(to);
      if (!rep.ok()) {
        std::cerr << "bench: " << rep.status().to_string() << "\n";
        return 1;
      }
      const std::string text = ops::cuda::format_tp_bench(*rep, to);
      std::cout << text;
      if (!o->out.empty() && !(std::ofstream(o->out) << text)) {
        std::cerr << "bench: cannot write --out " << o->out << "\n";
        return 1;
      }
      return 0;
    }
    opt.reps = o->reps, opt.layers = o->layers;
    opt.graph_layers = o->graph_layers, opt.gemv_sweep = o->gemv_sweep;
    opt.fp4_fragments = mo->fp4_fragments == "on";
    opt.gemv_ring_stages = mo->gemv_fp4_ring;
    opt.fp8_fragments = o->fp8_fragments == "on";
    auto rep = ops::cuda::run_layer_bench(opt);
    if (!rep.ok()) {
      std::cerr << "bench: " << rep.status().to_string() << "\n";
      return 1;
    }
    const std::string text = ops::cuda::format_layer_bench(*rep, opt);
    std::cout << text;
    if (!o->out.empty()) {
      std::ofstream f(o->out);
      if (!(f << text)) {
        std::cerr << "bench: cannot write --out " << o->out << "\n";
        return 1;
      }
    }
    return 0;
#else
    std::cerr << "bench: this flashseek was built without CUDA (-DFLASHSEEK_CUDA=OFF or no nvcc); "
                 "the benchmark needs a CUDA build and a GPU\n";
    return 1;
#endif
  };
}

FS_REGISTER_COMMAND("bench", setup_bench);

}  // namespace
}  // namespace flashseek::tools
