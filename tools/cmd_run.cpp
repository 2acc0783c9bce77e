// flashseek run: one request through the engine on a checkpoint; prints the DESIGN.md §7 JSON
// (--json) or the decoded text plus a stats line on stderr. Wiring only: the engine does the work.
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "engine/engine.h"
#include "engine/run_contract.h"
#include "engine/spec_metrics.h"
#include "backends/cuda/gpu_model.h"
#include "forward/model.h"
#include "tokenizer/tokenizer.h"
#include "core/thread_pool.h"
#include "tokenizer/tokenizer_locate.h"
#include "tools/backend_options.h"
#include "tools/command.h"
#include "tools/step_budget_cli.h"
#include "tools/model_source.h"

namespace flashseek::tools {
namespace {

struct RunOpts {
  ModelSourceCli source;  // --ckpt / --load-format / --config / --num-layers
  MemoryPlanCli plan;     // --gpu-memory-utilization / --memory-limit
  int64_t max_context = 0;  // longest prompt + completion (0: the config's)
  std::string prompt_ids, prompt, tokenizer, numerics = "reference", speculative = "auto";
  std::string stop_ids;
  std::string gpus;  // "" = CPU backend, "N" = CUDA device N (backends/cuda/gpu_model.h)
  std::string gpu_weights = "native";  // --gpu-weights: native | fp32 (GpuLoadOptions)
  int64_t max_tokens = 16, top_k = 0, prompt_logprobs = 0, logprobs = 0;
  double temperature = 0.0, top_p = 1.0, min_p = 0.0;
  uint64_t seed = 0;
  bool json = false, ignore_eos = false;
  // Benchmark only: scripted acceptance (EngineOptions::spec_script_accept); the output is then
  // not the model's, so it is refused unless --allow-scripted-output is given too.
  std::string spec_script_accept;
  bool allow_scripted_output = false;
  BackendOpts backend;  // --threads, --gpu-graphs, --tp-comm, --device-sampling (backend_options.h)
  StepBudgetCli budget;  // --prefill-chunk, --max-step-tokens
};

int fail(const std::string& message) {
  std::fprintf(stderr, "flashseek run: error: %s\n", message.c_str());
  return 1;
}

// --spec-script-accept MEAN: tokens per verification step, a finite number >= 1 (the upper
// bound, the draft block + 1, is checked by the engine once the model is loaded).
Result<double> parse_script_accept(const std::string& text) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || !std::isfinite(v) || v < 1.0)
    return invalid_argument(
        "--spec-script-accept: '{}' is not a number of tokens per verification step >= 1", text);
  return v;
}

Status check_options(const RunOpts& o) {
  if (o.prompt_ids.empty() == o.prompt.empty())
    return invalid_argument("give exactly one of --prompt-ids and --prompt");
  if (o.max_tokens < 0) return invalid_argument("--max-tokens must be >= 0 (got {})", o.max_tokens);
  if (o.logprobs < 0) return invalid_argument("--logprobs must be >= 0 (got {})", o.logprobs);
  if (o.prompt_logprobs < 0)
    return invalid_argument("--prompt-logprobs must be >= 0 (got {})", o.prompt_logprobs);
  if (!o.spec_script_accept.empty()) {
    if (!o.allow_scripted_output)
      return invalid_argument(
          "--spec-script-accept is a benchmark mode that changes the output (drafts are accepted "
          "whatever the model says); add --allow-scripted-output to run it");
    if (o.speculative == "off")
      return invalid_argument("--spec-script-accept needs --speculative on or auto");
    FS_RETURN_IF_ERROR(parse_script_accept(o.spec_script_accept).status());
  } else if (o.allow_scripted_output) {
    return invalid_argument("--allow-scripted-output without --spec-script-accept");
  }
  return {};
}

Result<engine::Request> build_request(const RunOpts& o, const tok::Tokenizer* tokenizer,
                                      int64_t vocab) {
  engine::Request r;
  r.id = 1;
  if (!o.prompt_ids.empty()) {
    FS_ASSIGN_OR_RETURN(r.prompt, engine::parse_token_ids(o.prompt_ids));
  } else {
    FS_ASSIGN_OR_RETURN(r.prompt, tokenizer->encode_checked(o.prompt));
    if (r.prompt.empty()) return invalid_argument("--prompt: encodes to no tokens");
  }
  FS_RETURN_IF_ERROR(engine::check_token_ids(r.prompt, vocab, "prompt"));
  if (!o.stop_ids.empty()) {
    FS_ASSIGN_OR_RETURN(r.stop_ids, engine::parse_token_ids(o.stop_ids));
    FS_RETURN_IF_ERROR(engine::check_token_ids(r.stop_ids, vocab, "--stop-ids"));
  }
  r.max_tokens = o.max_tokens;
  r.sampling = {.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p, .min_p = o.min_p};
  r.seed = o.seed;
  r.ignore_eos = o.ignore_eos;
  r.logprobs = o.logprobs > 0 ? o.logprobs : -1;
  r.prompt_logprobs = o.prompt_logprobs > 0 ? o.prompt_logprobs : -1;
  return r;
}

int run(const RunOpts& o) {
  // stdout carries the result (text or --json): log lines (the speculation policy's decisions,
  // load warnings) go to stderr, with the level and pattern main.cpp set.
  {
    auto err = spdlog::stderr_color_mt("run");
    err->set_level(spdlog::default_logger()->level());
    spdlog::set_default_logger(err);
    spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  }
  if (Status st = check_options(o); !st.ok()) return fail(st.message());
  auto budget = resolve_step_budget(o.budget, /*max_batch=*/1);
  if (!budget.ok()) return fail(budget.status().message());
  // The tokenizer is needed to encode --prompt and to print text; --json with ids needs none.
  std::optional<tok::Tokenizer> tokenizer;
  if (!o.prompt.empty() || !o.json) {
    auto t = tok::load_v41_tokenizer(o.tokenizer);
    if (t.ok()) {
      tokenizer.emplace(std::move(t).value());
    } else if (!o.prompt.empty()) {
      return fail("--prompt needs the tokenizer: " + t.status().message());
    } else {
      std::fprintf(stderr, "flashseek run: warning: no tokenizer (%s); printing token ids\n",
                   t.status().message().c_str());
    }
  }
  const auto numerics = o.numerics == "exact" ? forward::Numerics::kExact
                                              : forward::Numerics::kReference;
  if (Status st = apply_threads(o.backend); !st.ok()) return fail(st.message());
  auto gpu_weights = forward::parse_gpu_weights(o.gpu_weights);
  if (!gpu_weights.ok()) return fail(gpu_weights.status().message());
  auto gpu_opts = gpu_load_options(o.backend);
  if (!gpu_opts.ok()) return fail(gpu_opts.status().message());
  forward::GpuLoadOptions load_opts = std::move(gpu_opts).value();
  load_opts.weights = *gpu_weights;
  auto source = resolve_model_source(o.source, o.seed);
  if (!source.ok()) return fail(source.status().message());
  // The plan is checked before anything big is allocated (dummy weights included).
  if (Status st = check_memory_plan_for(*source, o.plan, o.gpus, 1, o.max_context,
                                        *gpu_weights == forward::GpuWeights::kNative,
                                        engram_on_device(o.backend), numerics, budget->max_step_tokens,
                                        load_opts.prefill_gemm_expand_w);
      !st.ok())
    return fail(st.message());
  if (Status st = materialize_model_source(*source, o.source, o.seed); !st.ok()) return fail(st.message());
  load_opts.load_progress = load_progress_printer(load_opts.load_threads);
  const auto load_t0 = std::chrono::steady_clock::now();
  auto model = forward::load_model_for(source->name, numerics, o.gpus, load_opts);
  if (!model.ok()) return fail(model.status().message());
  print_load_summary(*source, load_t0);
  if (o.gpus.empty()) spdlog::info("CPU backend: {} threads", ThreadPool::global().size());
  auto request = build_request(o, tokenizer ? &*tokenizer : nullptr,
                               (*model)->config().vocab_size);
  if (!request.ok()) return fail(request.status().message());
  const int64_t n_prompt = int64_t(request->prompt.size());
  // No limit unless --max-context is given: the tiny test configs declare 64 positions yet
  // oracles run longer sequences through them (engine.h, EngineOptions::max_context).
  const int64_t max_context = o.max_context;
  if (max_context > 0 && n_prompt + o.max_tokens > max_context)
    return fail(fmt::format("the prompt ({} tokens) + --max-tokens {} exceed the maximum context of {} tokens "
                            "(--max-context)", n_prompt, o.max_tokens, max_context));

  // Speculative decoding (engine/spec_step.cpp, spec_policy.h): auto = the policy (speculate
  // while it pays) when the backend has a draft; on = always the full block; off = never.
  const bool has_draft = (*model)->has_draft();
  if (o.speculative == "on" && !has_draft)
    return fail("--speculative on: the model has no draft on this backend (no DSpark / MTP weights "
                "(mtp.*) in the checkpoint, or a backend whose draft is not implemented)");
  const engine::SpecMode mode = o.speculative == "on"    ? engine::SpecMode::kOn
                                : o.speculative == "off" ? engine::SpecMode::kOff
                                                         : engine::SpecMode::kAuto;
  engine::EngineOptions eo{.max_batch = 1, .budget = *budget, .max_context = max_context, .speculative = mode};
  if (!o.spec_script_accept.empty()) {
    if (!has_draft)
      return fail("--spec-script-accept: the model has no draft on this backend");
    eo.spec_script_accept = *parse_script_accept(o.spec_script_accept);
    const int64_t most = (*model)->draft_block_size() + 1;
    if (eo.spec_script_accept > double(most))
      return fail(fmt::format("--spec-script-accept {}: at most {} tokens per step with this draft "
                              "(a block of {} drafts + the bonus token)",
                              o.spec_script_accept, most, most - 1));
    spdlog::warn("--spec-script-accept {}: BENCHMARK MODE, every verification accepts a scripted "
                 "number of drafts (mean {} tokens per step); the output is not the model's",
                 o.spec_script_accept, eo.spec_script_accept);
  }
  apply_engine_options(o.backend, eo);
  auto engine = engine::Engine::create(**model, eo);
  if (!engine.ok()) return fail(engine.status().message());
  auto stream = (*engine)->submit(std::move(request).value());
  if (!stream.ok()) return fail(stream.status().message());
  // Steps on this thread (no scheduler thread): the first token marks the end of the prefill, so
  // prompt and decode speeds are reported separately.
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::optional<Clock::time_point> t_first;
  int64_t prefill_steps = 0;  // forward calls until the first token: the prompt's chunks
  Status st;
  while (st.ok() && !(*stream)->finished()) {
    st = (*engine)->step();
    if (!t_first && (*engine)->stats().generated_tokens > 0) {
      t_first = Clock::now();
      prefill_steps = (*engine)->stats().steps;
    }
  }
  if (!t_first) prefill_steps = (*engine)->stats().steps;  // no token (--max-tokens 0, error)
  const auto t_end = Clock::now();
  const engine::GenerationResult result = engine::collect(**stream);
  if (!st.ok() || result.finish == engine::FinishReason::kError)
    return fail(result.error.empty() ? st.message() : result.error);

  if (o.json) {
    std::printf("%s\n", engine::run_result_json(result, {.prompt_logprobs = o.prompt_logprobs > 0,
                                                         .logprobs = o.logprobs > 0})
                            .c_str());
  } else if (tokenizer) {
    std::printf("%s\n", tokenizer->decode(result.tokens).c_str());
  } else {
    for (size_t i = 0; i < result.tokens.size(); ++i)
      std::printf("%s%d", i ? "," : "", result.tokens[i]);
    std::printf("\n");
  }
  auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  const double total = secs(t_end - t0);
  const double prefill = t_first ? secs(*t_first - t0) : total;
  const double decode = total - prefill;
  const size_t n = result.tokens.size();
  std::fprintf(stderr,
               "prompt %lld tokens in %.3f s (%.1f tok/s, %lld prefill steps of <= %lld tokens); "
               "generated %zu tokens (%s) in %.3f s; decode %.1f tok/s\n",
               static_cast<long long>(n_prompt), prefill, prefill > 0 ? n_prompt / prefill : 0.0,
               static_cast<long long>(prefill_steps),
               static_cast<long long>(budget->max_prefill_chunk), n,
               engine::finish_reason_name(result.finish), total,
               n > 1 && decode > 0 ? double(n - 1) / decode : 0.0);
  const engine::EngineStats es = (*engine)->stats();
  if (es.spec_mode != engine::SpecMode::kOff) std::fprintf(stderr, "%s\n", engine::spec_summary_text(es).c_str());
  log_gpu_graphs(o.backend, **model);
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "generate from a prompt with a checkpoint (one request)");
  auto o = std::make_shared<RunOpts>();
  add_model_source_options(cmd, o->source);
  add_memory_plan_options(cmd, o->plan);
  cmd->add_option("--max-context,--max-model-len", o->max_context,
                  "longest prompt + completion; also the memory plan's context (default: no limit, the plan uses "
                  "the config's max_position_embeddings)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  cmd->add_option("--gpus", o->gpus, "CUDA device ids: 0 (one GPU) or 0,1,... (tensor/expert parallel over NCCL); default: the CPU backend");
  cmd->add_option("--gpu-weights", o->gpu_weights,
                  "with --gpus N: native (every matrix as the checkpoint stores it; tensor-parallel ranks: "
                  "their slices of it) | fp32 (debug: FP32 copies)")
      ->check(CLI::IsMember({"native", "fp32"}))
      ->capture_default_str();
  cmd->add_option("--prompt-ids", o->prompt_ids, "token ids: 1,2,3 or @file.json (JSON array)");
  cmd->add_option("--prompt", o->prompt, "prompt text (needs the tokenizer)");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.json (default: $FLASHSEEK_TOKENIZER, then "
                  "models/tokenizer/tokenizer.json)");
  cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate at most")
      ->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0: greedy")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "nucleus mass in (0, 1]")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "0: off")->capture_default_str();
  cmd->add_option("--min-p", o->min_p, "0: off")->capture_default_str();
  cmd->add_option("--seed", o->seed, "sampling seed; with --load-format dummy also the weights' seed")
      ->capture_default_str();
  cmd->add_option("--stop-ids", o->stop_ids, "extra stop token ids: 5,6");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "keep generating after EOS");
  cmd->add_option("--prompt-logprobs", o->prompt_logprobs, "top-K per prompt position (0: none)")
      ->capture_default_str();
  cmd->add_option("--logprobs", o->logprobs, "top-K per generated token (0: none)")
      ->capture_default_str();
  cmd->add_option("--numerics", o->numerics, "exact | reference")
      ->check(CLI::IsMember({"exact", "reference"}))
      ->capture_default_str();
  cmd->add_option("--speculative", o->speculative,
                  "speculative decoding with the checkpoint's draft (DSpark / MTP): auto (speculate "
                  "while it pays) | on (always) | off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--spec-script-accept", o->spec_script_accept,
                  "BENCHMARK ONLY, CHANGES THE OUTPUT: each verification step accepts a scripted "
                  "number of drafts so that tokens per step (accepted + bonus) average MEAN, in "
                  "[1, draft block + 1]; the draft and verify run for real (tokens/s at a given "
                  "acceptance on dummy weights). Needs --allow-scripted-output")
      ->type_name("MEAN");
  cmd->add_flag("--allow-scripted-output", o->allow_scripted_output,
                "confirm --spec-script-accept (the generated tokens are not the model's)");
  cmd->add_flag("--json", o->json, "print the JSON contract (DESIGN.md §7)");
  add_backend_options(cmd, o->backend);
  add_step_budget_options(cmd, o->budget);
  return [o]() -> int { return run(*o); };
}

FS_REGISTER_COMMAND("run", setup);

}  // namespace
}  // namespace flashseek::tools
