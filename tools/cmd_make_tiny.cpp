// flashseek make-tiny: writes a random checkpoint in the release format (src/model/make_tiny.h).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/dummy.h"
#include "model/make_tiny.h"
#include "tools/model_source.h"
#include "tools/command.h"

namespace flashseek::tools {
namespace {

std::function<int()> setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-tiny", "write a random checkpoint in the release format");
  struct Opts {
    std::string config, out, dtype = "fp8";
    uint64_t seed = 0;
    int64_t num_layers = 0;
    int threads = 0;
    bool no_draft = false;
    bool well_conditioned = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--config", o->config, "tiny-v4 | tiny-v41 | demo | path to a config.json")->required();
  cmd->add_option("--seed", o->seed, "random seed (same seed, same bytes)")->capture_default_str();
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_option("--dtype", o->dtype, "fp8: release formats (FP8/FP4); bf16: linears stored BF16")
      ->check(CLI::IsMember({"fp8", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--num-layers", o->num_layers,
                  "keep this many backbone layers, every layer role present (0: all)")
      ->check(CLI::Range(int64_t(0), int64_t(1024)));
  cmd->add_option("--threads", o->threads, "generating threads (0: all cores)")
      ->check(CLI::Range(0, 4096));
  cmd->add_flag("--no-draft", o->no_draft,
                "leave out the draft tensors (mtp.*) the config declares (a backbone-only release)");
  cmd->add_flag("--well-conditioned", o->well_conditioned,
                "residual branch outputs (wo_b, experts' w2, Engram wkv) 1024x smaller, so that one "
                "flipped FP8 activation code cannot cascade (CUDA-vs-CPU parity, docs/cuda.md)");
  return [o]() -> int {
    auto cfg = resolve_config(o->config);
    if (!cfg.ok()) {
      std::fprintf(stderr, "flashseek make-tiny: error: %s\n", cfg.status().message().c_str());
      return 1;
    }
    if (o->num_layers > 0) {
      auto r = model::reduce_layers(*cfg, o->num_layers);
      if (!r.ok()) {
        std::fprintf(stderr, "flashseek make-tiny: error: %s\n", r.status().message().c_str());
        return 1;
      }
      std::printf("--num-layers %lld: %s\n", static_cast<long long>(o->num_layers), r->summary.c_str());
      *cfg = std::move(r->cfg);
    }
    model::MakeTinyOptions opt;
    opt.threads = o->threads;
    opt.seed = o->seed;
    opt.bf16 = o->dtype == "bf16";
    opt.draft = !o->no_draft;
    opt.well_conditioned = o->well_conditioned;
    const auto t0 = std::chrono::steady_clock::now();
    Status st = model::make_tiny_checkpoint(*cfg, opt, o->out);
    if (!st.ok()) {
      std::fprintf(stderr, "flashseek make-tiny: error: %s\n", st.message().c_str());
      return 1;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    uint64_t bytes = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(o->out, ec))
      if (e.path().extension() == ".safetensors") bytes += e.file_size(ec);
    std::printf("wrote %s (config %s, seed %llu, dtype %s%s%s) in %.2f s: %.1f MB of shards, %.1f MB/s\n",
                o->out.c_str(), o->config.c_str(), static_cast<unsigned long long>(o->seed), o->dtype.c_str(),
                o->no_draft ? ", no draft" : "", o->well_conditioned ? ", well-conditioned" : "", s, bytes / 1e6,
                s > 0 ? bytes / 1e6 / s : 0.0);
    return 0;
  };
}

FS_REGISTER_COMMAND("make-tiny", setup);

}  // namespace
}  // namespace flashseek::tools
