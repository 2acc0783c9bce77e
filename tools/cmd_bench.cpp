// `flashseek bench`: kernel-level layer-slice benchmark on the GPU (bench/cuda/layer_bench.h).
// Without a CUDA build or a device it fails with a clear message.
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tools/command.h"

#if FLASHSEEK_HAVE_CUDA
#include "bench/cuda/kernel_bench.h"
#include "bench/cuda/layer_bench.h"
#include "bench/cuda/prefill_bench.h"
#include "bench/cuda/spec_bench.h"
#include "bench/cuda/tp_bench.h"
#endif

namespace flashseek::tools {
namespace {

std::function<int()> setup_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "GPU layer-slice benchmark at V4.1 dimensions");
  struct Opts {
    std::string tokens = "1,6,8,32";
    int reps = 40;
    int layers = 40;
    std::string out;
    bool spec = false;
    std::string contexts = "4096,131072";
    int graph_layers = 8;
    bool gemv_sweep = false;
    int tp = 0;
    int prefill = 0;
    std::string kernels;
    std::string skip_variants;
    std::string prefill_experts = "grouped";
    std::string prefill_attn = "prefill";
  };
  auto o = std::make_shared<Opts>();
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
                  "V4.1 prefill shapes) (bench/cuda/kernel_bench.h)");
  cmd->add_option("--skip-variants", o->skip_variants,
                  "--kernels gemm: variant digits to leave out of the table, e.g. 67");
  return [o]() -> int {
#if FLASHSEEK_HAVE_CUDA
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
