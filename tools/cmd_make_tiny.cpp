// flashseek make-tiny: writes a random checkpoint in the release format (src/model/make_tiny.h).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/make_tiny.h"
#include "tools/command.h"

namespace flashseek::tools {
namespace {

Result<model::ModelConfig> resolve_config(const std::string& name) {
  if (name == "tiny-v4" || name == "tiny-v41" || name == "demo") return model::builtin_config(name);
  if (std::filesystem::is_directory(name)) return model::load_config(name);
  std::ifstream in(name, std::ios::binary);
  if (!in) return not_found("--config {}: not a built-in name (tiny-v4, tiny-v41, demo) nor a readable file", name);
  std::stringstream ss;
  ss << in.rdbuf();
  return model::parse_config(ss.str(), name);
}

std::function<int()> setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-tiny", "write a random checkpoint in the release format");
  struct Opts {
    std::string config, out, dtype = "fp8";
    uint64_t seed = 0;
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
  cmd->add_flag("--no-draft", o->no_draft,
                "leave out the draft tensors (mtp.*) the config declares (a backbone-only release)");
  cmd->add_flag("--well-conditioned", o->well_conditioned,
                "residual branch outputs (wo_b, experts' w2, Engram wkv) 256x smaller, so that one "
                "flipped FP8 activation code cannot cascade (CUDA-vs-CPU parity, docs/cuda.md)");
  return [o]() -> int {
    auto cfg = resolve_config(o->config);
    if (!cfg.ok()) {
      std::fprintf(stderr, "flashseek make-tiny: error: %s\n", cfg.status().message().c_str());
      return 1;
    }
    model::MakeTinyOptions opt;
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
    std::printf("wrote %s (config %s, seed %llu, dtype %s%s%s) in %.2f s\n", o->out.c_str(), o->config.c_str(),
                static_cast<unsigned long long>(o->seed), o->dtype.c_str(), o->no_draft ? ", no draft" : "",
                o->well_conditioned ? ", well-conditioned" : "", s);
    return 0;
  };
}

FS_REGISTER_COMMAND("make-tiny", setup);

}  // namespace
}  // namespace flashseek::tools
