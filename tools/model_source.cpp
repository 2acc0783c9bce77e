// --load-format auto|dummy, --config, --num-layers (model_source.h).
#include "tools/model_source.h"


#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backends/cuda/gpu_model.h"
#include "forward/memory_plan.h"
#include "forward/state_io.h"
#include "model/checkpoint.h"
#include "model/counts.h"
#include "model/dummy.h"
#include "model/make_tiny.h"

namespace flashseek::tools {

void add_model_source_options(CLI::App* cmd, ModelSourceCli& o) {
  cmd->add_option("--ckpt", o.ckpt, "checkpoint directory (with --load-format dummy: only its config is read)");
  cmd->add_option("--load-format", o.load_format,
                  "auto: the checkpoint's safetensors; dummy: random weights in the release formats generated "
                  "in memory from --config (or --ckpt's config) and --seed")
      ->check(CLI::IsMember({"auto", "dummy"}))
      ->capture_default_str();
  cmd->add_option("--config", o.config,
                  "with --load-format dummy: tiny-v4 | tiny-v41 | demo | a config.json | a checkpoint directory");
  cmd->add_option("--num-layers", o.num_layers,
                  "with --load-format dummy: keep this many backbone layers, every layer role present "
                  "(0: all)")
      ->check(CLI::Range(int64_t(0), int64_t(1024)));
}

Result<model::ModelConfig> resolve_config(const std::string& name) {
  if (name == "tiny-v4" || name == "tiny-v41" || name == "demo") return model::builtin_config(name);
  if (std::filesystem::is_directory(name)) return model::load_config(name);
  std::ifstream in(name, std::ios::binary);
  if (!in) return not_found("--config {}: not a built-in name (tiny-v4, tiny-v41, demo) nor a readable file", name);
  std::stringstream ss;
  ss << in.rdbuf();
  return model::parse_config(ss.str(), name);
}

Result<ModelSource> resolve_model_source(const ModelSourceCli& o, uint64_t seed) {
  ModelSource src;
  if (o.load_format != "dummy") {
    if (!o.config.empty() || o.num_layers > 0)
      return invalid_argument("--config and --num-layers need --load-format dummy (a checkpoint brings its own)");
    if (o.ckpt.empty()) return invalid_argument("--ckpt is required (or --load-format dummy with --config)");
    auto cfg = model::load_config(o.ckpt);  // its error names the config file it looked for
    if (!cfg.ok()) return cfg.status().with_context("--ckpt");
    src.config = std::move(cfg).value();
    src.name = o.ckpt;
    return src;
  }
  if (o.config.empty() == o.ckpt.empty())
    return invalid_argument("--load-format dummy: give exactly one of --config and --ckpt (whose config is used)");
  const std::string cfg_name = o.config.empty() ? o.ckpt : o.config;
  FS_ASSIGN_OR_RETURN(model::ModelConfig cfg, resolve_config(cfg_name));
  if (o.num_layers > 0) {
    FS_ASSIGN_OR_RETURN(model::ReducedConfig r, model::reduce_layers(cfg, o.num_layers));
    std::fprintf(stderr, "--num-layers %lld: %s\n", static_cast<long long>(o.num_layers), r.summary.c_str());
    cfg = std::move(r.cfg);
  }
  src.name = fmt::format("dummy:{}:seed={}:layers={}", cfg_name, seed, cfg.num_layers);
  src.dummy = true;
  src.config = std::move(cfg);
  return src;
}

Status materialize_model_source(const ModelSource& src, const ModelSourceCli& o, uint64_t seed) {
  if (!src.dummy) return {};
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const auto t0 = std::chrono::steady_clock::now();
  FS_ASSIGN_OR_RETURN(model::Checkpoint ck,
                      model::make_dummy_checkpoint(src.config, {.seed = seed, .threads = threads}, src.name));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t bytes = 0;
  for (const auto& f : ck.shards().files())
    for (const auto& t : f.tensors()) bytes += t.nbytes;
  std::fprintf(stderr, "dummy weights: %s, %zu tensors, %.3f GB generated in %.2f s (%.2f GB/s, %d threads)\n",
               src.name.c_str(), ck.shards().size(), bytes / 1e9, s, s > 0 ? bytes / 1e9 / s : 0.0, threads);
  model::register_memory_checkpoint(src.name, ck);
  return {};
}

Result<ModelSource> prepare_model_source(const ModelSourceCli& o, uint64_t seed) {
  FS_ASSIGN_OR_RETURN(ModelSource src, resolve_model_source(o, seed));
  FS_RETURN_IF_ERROR(materialize_model_source(src, o, seed));
  return src;
}

std::function<void(uint64_t, uint64_t)> load_progress_printer(int threads) {
  struct State {
    std::mutex mu;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now(), last{};
    bool finished = false;
  };
  auto st = std::make_shared<State>();
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  return [st, threads](uint64_t done, uint64_t total) {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(st->mu);
    const bool last = done >= total;
    if (st->finished || (!last && now - st->last < std::chrono::milliseconds(200))) return;
    st->last = now;
    st->finished = last;
    const double s = std::chrono::duration<double>(now - st->t0).count();
    const int pct = total ? int(std::min<uint64_t>(done, total) * 100 / total) : 100, bar = pct * 30 / 100;
    std::fprintf(stderr, "\rloading weights [%.*s%*s] %3d%% (%.2f / %.2f GB, %.2f GB/s, %d threads)%s", bar,
                 "==============================", 30 - bar, "", pct, done / 1e9, total / 1e9,
                 s > 0 ? done / 1e9 / s : 0.0, threads, last ? "\n" : "");
  };
}

void print_load_summary(const ModelSource& src, std::chrono::steady_clock::time_point t0) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t bytes = 0;
  if (src.dummy) {
    bytes = model::count_from_config(src.config).total.bytes;
  } else {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(src.name, ec))
      if (e.path().extension() == ".safetensors") bytes += e.file_size(ec);
  }
  std::fprintf(stderr, "loaded %s: %.3f GB of weights in %.2f s (%.2f GB/s)\n", src.name.c_str(), bytes / 1e9, s,
               s > 0 ? bytes / 1e9 / s : 0.0);
}

void add_memory_plan_options(CLI::App* cmd, MemoryPlanCli& o) {
  cmd->add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                  "fraction of the available memory (GPU; host memory on the CPU backend) the memory plan may use")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  cmd->add_option("--memory-limit", o.memory_limit,
                  "bytes the memory plan may count on instead of what the backend reports (0: ask it)")
      ->capture_default_str();
}

Status check_memory_plan_for(const ModelSource& src, const MemoryPlanCli& o, const std::string& gpus,
                             int64_t max_batch, int64_t max_context, bool native_weights,
                             bool engram_on_device, forward::Numerics numerics, int64_t step_tokens,
                             bool prefill_weight_expansion) {
  const model::ModelConfig& c = src.config;
  const int64_t context = max_context > 0 ? max_context : c.max_position_embeddings;
  forward::SnapshotGeometry g;
  bool has_draft = false;
  if (src.dummy) {  // generated weights always carry the config's draft
    has_draft = c.num_mtp_layers > 0;
    g = forward::snapshot_geometry(c, has_draft && !c.is_v41(), has_draft && c.is_v41(), context);
  } else {
    FS_ASSIGN_OR_RETURN(g, forward::checkpoint_snapshot_geometry(src.name, context));
    has_draft = g.mtp_row > 0 || g.draft_stages > 0;
  }
  forward::MemoryPlanOptions po;
  po.max_batch = max_batch;
  po.max_context = context;
  po.step_tokens = step_tokens;
  po.utilization = o.gpu_memory_utilization;
  po.gpu = !gpus.empty();
  po.numerics = numerics;
  po.tensor_parallel = 1;
  for (char ch : gpus) po.tensor_parallel += ch == ',' ? 1 : 0;
  po.native_weights = po.gpu && native_weights;
  po.engram_on_device = po.gpu && engram_on_device;
  po.prefill_weight_expansion = po.gpu && prefill_weight_expansion;
  if (src.dummy) po.resident_checkpoint_bytes = model::count_from_config(c).total.bytes;
  uint64_t available = o.memory_limit;
  if (available == 0) {
    if (po.gpu) {
      int device = 0;
      try {
        device = std::stoi(gpus);
      } catch (...) {
        return invalid_argument("--gpus {}: expected device numbers such as 0 or 0,1", gpus);
      }
      FS_ASSIGN_OR_RETURN(available, forward::gpu_memory_free(device));
    } else {
      FS_ASSIGN_OR_RETURN(available, forward::host_memory_available());
    }
  }
  const forward::MemoryPlan plan = forward::plan_memory(c, g, has_draft, po, available);
  std::fprintf(stderr, "%s\n", forward::format_memory_plan(plan).c_str());
  return forward::check_memory_plan(plan);
}

}  // namespace flashseek::tools
