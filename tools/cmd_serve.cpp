// flashseek serve: the OpenAI-compatible server on the real engine (wiring only: the HTTP layer
// is src/server, the engine src/engine, the tokenizer and chat format src/tokenizer).
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "engine/engine.h"
#include "engine/spec_metrics.h"
#include "engine/state_cache.h"
#include "forward/state_io.h"
#include "forward/cpu_model.h"
#include "backends/cuda/gpu_model.h"
#include "forward/state_convert.h"
#include "server/deferred_backend.h"
#include "server/engine_backend.h"
#include "server/http_server.h"
#include "server/tokenizer_adapter.h"
#include "tokenizer/tokenizer_locate.h"
#include "tools/backend_options.h"
#include "tools/command.h"
#include "tools/model_source.h"
#include "tools/serve_cluster.h"
#include "tools/step_budget_cli.h"

namespace flashseek::tools {
namespace {

namespace fs = std::filesystem;

struct ServeOpts {
  ModelSourceCli source;                         // --ckpt / --load-format / --config / --num-layers
  MemoryPlanCli plan;                            // --gpu-memory-utilization / --memory-limit
  uint64_t seed = 0;                             // --load-format dummy: the weights' seed
  std::string gpus, host = "127.0.0.1", api_key, tokenizer, numerics = "reference";
  std::string gpu_weights = "native";  // --gpu-weights: native | fp32 (GpuLoadOptions)
  std::string api_key_file;                      // `KEY [TENANT]` lines (server/tenants.h)
  std::string cache_scope = "tenant";            // state-cache sharing: tenant | user | request | shared
  bool shared_cache = false;                     // shorthand for --cache-scope shared
  int port = 8000;
  int64_t max_batch = 8, max_queue = 64, max_context = 0;
  int64_t host_cache_bytes = int64_t(1) << 30;  // state cache, host tier (issue 6)
  std::string cache_dir;                         // state cache, disk tier (empty: none)
  int64_t cache_dir_bytes = 0;                   // state cache: disk-tier budget (0: none)
  int64_t snapshot_every = 2048;                 // state cache: snapshots inside long prefills
  ClusterCli cluster;                            // cross-server sharing (serve_cluster.h)
  StepBudgetCli budget;                          // --prefill-chunk, --max-step-tokens
  bool thinking = false;
  std::string speculative = "auto";              // auto (the policy) | on | off (engine/spec_policy.h)
  double stats_interval = 10;                    // seconds between engine status lines (0: none)
  std::vector<std::string> extra_names;
  server::ServerOptions limits;                  // connection and request limits (defaults there)
  BackendOpts backend;                           // --threads, --gpu-graphs, ... (backend_options.h)
};

// The periodic engine status line: every `interval` seconds in which the engine stepped, one log
// line with the load, the decode rate over the interval and the speculation policy's state
// (sequences speculating / plain, their block lengths, the measured verify vs step costs).
class StatusLog {
 public:
  StatusLog(const engine::Engine& engine, double interval) : engine_(engine) {
    if (interval <= 0) return;
    thread_ = std::thread([this, interval] { loop(interval); });
  }
  ~StatusLog() { stop(); }
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop(double interval) {
    using clock = std::chrono::steady_clock;
    engine::EngineStats last = engine_.stats();
    auto last_t = clock::now();
    const auto period = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(interval));
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, period, [this] { return stopping_; })) {
      const engine::EngineStats now = engine_.stats();
      const auto t = clock::now();
      if (now.steps == last.steps) {  // idle: nothing new to say; the next rate starts here
        last_t = t;
        continue;
      }
      const double dt = std::chrono::duration<double>(t - last_t).count();
      const int64_t tokens = now.generated_tokens - last.generated_tokens;
      const std::string spec = engine::spec_summary_text(now);
      spdlog::info("engine: {} running, {} waiting, {} steps, {} tokens in {:.1f} s ({:.1f} tok/s){}{}",
                   now.running, now.waiting, now.steps - last.steps, tokens, dt,
                   dt > 0 ? double(tokens) / dt : 0.0, spec.empty() ? "" : "; ", spec);
      last = now;
      last_t = t;
    }
  }

  const engine::Engine& engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

// SIGINT/SIGTERM stop the server from a dedicated thread (no work inside a signal handler).
std::thread stop_on_signal(server::HttpServer& http) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return std::thread([set, &http] {
    int sig = 0;
    sigwait(&set, &sig);
    spdlog::info("signal {}: stopping", sig);
    http.stop();
  });
}

// API keys from --api-key, --api-key-file and the FLASHSEEK_API_KEYS environment variable (same
// syntax as the file, entries also separated by commas), and the cache scope.
Status configure_tenants(const ServeOpts& o, server::Tenants& tenants) {
  if (!o.api_key.empty()) {
    FS_RETURN_IF_ERROR(tenants.add_key(o.api_key, "").with_context("--api-key"));
    spdlog::warn("--api-key is visible in the process list: prefer --api-key-file or "
                 "FLASHSEEK_API_KEYS");
  }
  if (!o.api_key_file.empty()) {
    FS_ASSIGN_OR_RETURN(auto entries, server::read_api_key_file(o.api_key_file));
    FS_RETURN_IF_ERROR(tenants.add_keys(entries).with_context("--api-key-file " + o.api_key_file));
  }
  if (const char* env = std::getenv("FLASHSEEK_API_KEYS"); env && *env) {
    FS_ASSIGN_OR_RETURN(auto entries,
                        server::parse_api_keys(env, "FLASHSEEK_API_KEYS", /*comma_separates=*/true));
    if (entries.empty()) return invalid_argument("FLASHSEEK_API_KEYS is set but holds no API key");
    FS_RETURN_IF_ERROR(tenants.add_keys(entries).with_context("FLASHSEEK_API_KEYS"));
  }
  FS_ASSIGN_OR_RETURN(const server::CacheScope scope,
                      server::parse_cache_scope(o.shared_cache ? "shared" : o.cache_scope));
  tenants.set_cache_scope(scope);
  if (tenants.keys_required())
    spdlog::info("API keys: {} for {} tenant(s); state cache scope: {}", tenants.key_count(),
                 tenants.tenant_count(), server::cache_scope_name(scope));
  else if (scope == server::CacheScope::kTenant)
    spdlog::info("no API keys: every request is isolated (no state-cache reuse across requests); "
                 "API keys, --cache-scope user or --cache-scope shared enable reuse");
  else
    spdlog::info("no API keys; state cache scope: {}", server::cache_scope_name(scope));
  return {};
}

// Connection and request-size limits of the HTTP layer (docs/server.md "Connections and limits").
void add_limit_options(CLI::App* cmd, server::ServerOptions& l) {
  cmd->add_option("--max-connections", l.max_connections,
                  "open connections (one thread each); 0: max-batch + max-queue + 128")
      ->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(1) << 16));
  cmd->add_option("--head-timeout-ms", l.head_timeout_ms,
                  "a request line and headers must arrive within this")
      ->capture_default_str()->check(CLI::Range(100, 3'600'000));
  cmd->add_option("--request-timeout-ms", l.request_timeout_ms,
                  "a whole request (head + body) must arrive within this")
      ->capture_default_str()->check(CLI::Range(100, 3'600'000));
  cmd->add_option("--keep-alive-timeout-ms", l.keep_alive_timeout_ms,
                  "idle time allowed between requests on one connection")
      ->capture_default_str()->check(CLI::Range(1, 3'600'000));
  cmd->add_option("--max-header-count", l.max_header_count, "header lines per request")
      ->capture_default_str()->check(CLI::Range(size_t(1), size_t(10'000)));
  cmd->add_option("--max-body-bytes", l.max_body_bytes, "request body bytes (413 beyond)")
      ->capture_default_str()->check(CLI::Range(size_t(1024), size_t(1) << 32));
  cmd->add_option("--max-json-depth", l.max_json_depth,
                  "JSON nesting in a request body or tool-call arguments")
      ->capture_default_str()->check(CLI::Range(size_t(2), size_t(512)));
  cmd->add_option("--max-json-values", l.max_json_values, "JSON values in a request body")
      ->capture_default_str()->check(CLI::Range(size_t(16), size_t(1) << 28));
  cmd->add_option("--max-messages", l.max_messages, "messages per chat request")
      ->capture_default_str()->check(CLI::Range(size_t(1), size_t(1) << 24));
  cmd->add_option("--max-tools", l.max_tools, "tools per request, tool calls per message")
      ->capture_default_str()->check(CLI::Range(size_t(1), size_t(1) << 20));
  cmd->add_option("--max-prompt-bytes", l.max_prompt_bytes,
                  "text to tokenize per request: the prompt or all message text (413 beyond)")
      ->capture_default_str()->check(CLI::Range(size_t(1), size_t(1) << 32));
}

int serve(const ServeOpts& o) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "flashseek serve: error: %s\n", st.message().c_str());
    return 1;
  };
  server::Tenants tenants;  // first: a bad key file fails before anything is loaded
  if (Status st = configure_tenants(o, tenants); !st.ok()) return fail(st);
  // Cluster flags are checked before anything is loaded (a bad --redis URL fails at once).
  if (Status st = check_cluster_options(o.cluster); !st.ok()) return fail(st);
  if (Status st = apply_threads(o.backend); !st.ok()) return fail(st);
  auto budget = resolve_step_budget(o.budget, o.max_batch);
  if (!budget.ok()) return fail(budget.status());
  auto tokenizer = tok::load_v41_tokenizer(o.tokenizer);
  if (!tokenizer.ok()) return fail(tokenizer.status().with_context("--tokenizer"));

  server::DeferredBackend deferred;
  server::TokenizerCodec codec(*tokenizer);
  server::ServerOptions so = o.limits;
  so.host = o.host;
  so.port = o.port;
  so.tenants = std::move(tenants);
  so.max_batch = o.max_batch;
  so.max_queue = o.max_queue;
  so.default_thinking = o.thinking;
  so.model_ids = {"deepseek-v4.1-flash"};
  // The chat family follows the checkpoint; the server starts before the weights are loaded.
  auto source = resolve_model_source(o.source, o.seed);
  if (!source.ok()) return fail(source.status());
  const model::ModelConfig* cfg = &source->config;
  // The memory plan refuses what does not fit before anything big is allocated.
  auto weights_mode = forward::parse_gpu_weights(o.gpu_weights);
  if (!weights_mode.ok()) return fail(weights_mode.status());
  auto gpu_opts = gpu_load_options(o.backend);
  if (!gpu_opts.ok()) return fail(gpu_opts.status());
  if (Status st = check_memory_plan_for(*source, o.plan, o.gpus, o.max_batch, o.max_context,
                                        *weights_mode == forward::GpuWeights::kNative,
                                        engram_on_device(o.backend),
                                        o.numerics == "exact" ? forward::Numerics::kExact : forward::Numerics::kReference,
                                        budget->max_step_tokens, gpu_opts->prefill_gemm_expand_w);
      !st.ok())
    return fail(st);
  const std::string own_name =
      source->dummy ? "" : fs::path(source->name).lexically_normal().filename().string();
  if (!own_name.empty() && own_name != so.model_ids[0]) so.model_ids.push_back(own_name);
  for (const auto& n : o.extra_names) so.model_ids.push_back(n);
  tok::ChatRequestOptions chat_opts;
  chat_opts.family = cfg->is_v41() ? tok::ChatFamily::kV41 : tok::ChatFamily::kV4;
  chat_opts.thinking_by_default = o.thinking;
  server::DeepSeekChat chat(chat_opts);

  server::HttpServer http({&deferred, &codec, &chat}, so);
  auto port = http.bind();
  if (!port.ok()) return fail(port.status());
  std::thread signals = stop_on_signal(http);
  std::thread listener([&http] { http.run(); });
  spdlog::info("listening on http://{}:{} (readyz: 503 until the model is loaded)", o.host, *port);

  const auto t0 = std::chrono::steady_clock::now();
  if (source->dummy) {
    if (Status st = materialize_model_source(*source, o.source, o.seed); !st.ok()) {
      http.stop();
      listener.join();
      pthread_kill(signals.native_handle(), SIGTERM);
      signals.join();
      return fail(st);
    }
  }
  forward::GpuLoadOptions load_opts = *gpu_opts;
  load_opts.weights = *weights_mode;
  load_opts.load_progress = load_progress_printer(load_opts.load_threads);
  const auto load_t0 = std::chrono::steady_clock::now();
  auto model = forward::load_model_for(
      source->name, o.numerics == "exact" ? forward::Numerics::kExact : forward::Numerics::kReference, o.gpus,
      load_opts);
  // Failure after the listener started: stop it and the signal thread before returning.
  auto abort_with = [&](const Status& st) {
    http.stop();
    listener.join();
    pthread_kill(signals.native_handle(), SIGTERM);
    signals.join();
    return fail(st);
  };
  if (!model.ok()) return abort_with(model.status().with_context("loading " + source->name));
  print_load_summary(*source, load_t0);
  // The state cache outlives the engine (snapshot callbacks point at it).
  auto fingerprint = forward::checkpoint_fingerprint(source->name, o.numerics);
  if (!fingerprint.ok()) return abort_with(fingerprint.status());
  // The backend kind enters the snapshot fingerprint: CPU and GPU states of one checkpoint differ
  // in the last bits, so a snapshot of the other backend is a miss, never a restore.
  const uint64_t state_fp = forward::state_fingerprint(*fingerprint, (*model)->backend_kind());
  // Every snapshot (disk, peers, memory) is checked against this model's state geometry, and no
  // blob larger than a state of the serving context is read or allocated.
  const int64_t max_context = o.max_context > 0 ? o.max_context : cfg->max_position_embeddings;
  // The geometry of the states this model exports (the CUDA backend keeps no V4 MTP rings).
  engine::StateCacheOptions cache_options{state_fp, o.host_cache_bytes, o.cache_dir, 2,
                                          o.snapshot_every, o.cache_dir_bytes};
  cache_options.geometry = forward::model_snapshot_geometry(**model, max_context);
  auto cache = engine::StateCache::open(std::move(cache_options));
  if (!cache.ok()) return abort_with(cache.status());
  auto cluster = start_cluster(**cache, o.cluster, o.host);
  if (!cluster.ok()) return abort_with(cluster.status());
  engine::EngineOptions eo;
  eo.max_batch = o.max_batch;
  eo.max_waiting = o.max_queue;
  eo.budget = *budget;
  spdlog::info("engine steps: up to {} tokens each (decodes first), prompt chunks of <= {} tokens",
               eo.budget.max_step_tokens, eo.budget.max_prefill_chunk);
  eo.max_context = o.max_context > 0 ? o.max_context : cfg->max_position_embeddings;
  apply_engine_options(o.backend, eo);
  const bool has_draft = (*model)->has_draft();
  if (o.speculative == "on" && !has_draft)
    return abort_with(invalid_argument("--speculative on: the model has no draft (DSpark / MTP) on this backend"));
  eo.speculative = !has_draft || o.speculative == "off" ? engine::SpecMode::kOff
                   : o.speculative == "on"              ? engine::SpecMode::kOn
                                                        : engine::SpecMode::kAuto;
  spdlog::info("speculative decoding: {}", eo.speculative == engine::SpecMode::kAuto
                                               ? "auto (speculates while the draft pays)"
                                           : eo.speculative == engine::SpecMode::kOn ? "on (always)"
                                           : has_draft ? "off" : "off (no draft)");
  auto engine = engine::Engine::create(**model, eo);
  if (!engine.ok()) return abort_with(engine.status());
  (*engine)->start();
  server::EngineBackend backend(**engine);
  backend.set_state_cache(cache->get());
  if (Status st = backend.warm_up(); !st.ok()) return abort_with(st);
  deferred.set(&backend);
  spdlog::info("ready: {} loaded in {:.1f} s, models: {}", source->name,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               fmt::join(so.model_ids, ", "));
  StatusLog status_log(**engine, o.stats_interval);
  listener.join();  // until SIGINT/SIGTERM
  signals.join();
  status_log.stop();
  drain(**engine, **cache, cluster->get(), o.cluster.drain_snapshots);
  (*engine)->stop();
  log_gpu_graphs(o.backend, **model);
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat, completions)");
  auto o = std::make_shared<ServeOpts>();
  add_model_source_options(cmd, o->source);
  add_memory_plan_options(cmd, o->plan);
  cmd->add_option("--seed", o->seed, "with --load-format dummy: the weights' seed")->capture_default_str();
  cmd->add_option("--gpus", o->gpus, "CUDA device ids: 0 (one GPU) or 0,1,... (tensor/expert parallel over NCCL); empty: CPU backend");
  cmd->add_option("--gpu-weights", o->gpu_weights,
                  "with --gpus N: native (every matrix as the checkpoint stores it; tensor-parallel ranks: "
                  "their slices of it) | fp32 (debug: FP32 copies)")
      ->check(CLI::IsMember({"native", "fp32"}))
      ->capture_default_str();
  cmd->add_option("--host", o->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "port (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->api_key,
                  "require 'Authorization: Bearer KEY' on /v1/* (KEY is its own tenant; visible "
                  "in the process list: prefer --api-key-file or FLASHSEEK_API_KEYS)");
  cmd->add_option("--api-key-file", o->api_key_file,
                  "API keys, one 'KEY [TENANT]' per line (TENANT defaults to KEY; blank lines and "
                  "'#' lines skipped); keys of one tenant share its state cache. Also read: "
                  "FLASHSEEK_API_KEYS (same entries, separated by newlines or commas)");
  auto* scope = cmd->add_option(
      "--cache-scope", o->cache_scope,
      "who shares conversation-state cache hits: tenant (one cache per tenant; without API keys "
      "every request is isolated) | user (per tenant and request 'user' field; no 'user': "
      "isolated) | request (no reuse) | shared (every caller: hits reveal others' prompts)")
      ->check(CLI::IsMember({"tenant", "user", "request", "shared"}))->capture_default_str();
  cmd->add_flag("--shared-cache", o->shared_cache,
                "same as --cache-scope shared (for a single trusted client or a trusted front end)")
      ->excludes(scope);
  cmd->add_option("--max-batch,--max-num-seqs", o->max_batch,
                  "sequences per step (more concurrent requests wait in the queue)")->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  cmd->add_option("--max-queue", o->max_queue, "waiting requests before 503")
      ->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(1 << 20)));
  cmd->add_option("--speculative", o->speculative,
                  "speculative decoding with the checkpoint's draft (DSpark / MTP): auto (speculate "
                  "while it pays) | on (always) | off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--stats-interval", o->stats_interval,
                  "seconds between engine status lines in the log (load, tok/s, the speculation "
                  "policy's state and measured costs), written only when the engine stepped (0: none)")
      ->capture_default_str()->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--max-context,--max-model-len", o->max_context,
                  "longest prompt + completion (default: the config's max_position_embeddings)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  cmd->add_option("--host-cache-bytes", o->host_cache_bytes,
                  "state cache: host-memory budget for conversation snapshots (0: none)")
      ->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(1) << 50));
  cmd->add_option("--cache-dir", o->cache_dir,
                  "state cache: directory for snapshots that survive restarts");
  cmd->add_option("--cache-dir-bytes", o->cache_dir_bytes,
                  "state cache: byte budget of --cache-dir, least recently used files are "
                  "removed first (0: no limit)")
      ->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(1) << 56));
  cmd->add_option("--snapshot-every", o->snapshot_every,
                  "state cache: also snapshot long prefills every N prompt tokens (0: off)")
      ->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  add_step_budget_options(cmd, o->budget);
  add_cluster_options(cmd, o->cluster);
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json (file or directory)");
  cmd->add_option("--numerics", o->numerics, "exact | reference")
      ->check(CLI::IsMember({"exact", "reference"}))->capture_default_str();
  cmd->add_flag("--thinking", o->thinking, "thinking mode when a request does not say");
  cmd->add_option("--served-model-name", o->extra_names, "extra model ids to accept");
  add_limit_options(cmd, o->limits);
  add_backend_options(cmd, o->backend);
  return [o] { return serve(*o); };
}

FS_REGISTER_COMMAND("serve", setup);

}  // namespace
}  // namespace flashseek::tools
