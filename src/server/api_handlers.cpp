#include "server/api_handlers.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "server/connection_watch.h"
#include "server/http_front.h"
#include "core/json_limits.h"

namespace flashseek::server {

using json = nlohmann::json;

void send_error(httplib::Response& res, const ApiError& err) {
  res.status = err.http_status;
  if (err.http_status == 503) res.set_header("Retry-After", "1");
  res.set_content(err.body(), "application/json");
}

ApiHandlers::ApiHandlers(ServerDeps deps, const ServerOptions& options, Metrics& metrics,
                         const std::atomic<bool>& stopping)
    : deps_(deps), options_(options), metrics_(metrics), stopping_(stopping) {}

std::optional<ApiError> ApiHandlers::tokenize(PreparedRequest& p, const std::string& raw_body,
                                              std::vector<int32_t>& prompt) {
  ParsedRequest& r = p.parsed;
  std::string text;
  if (r.endpoint == Endpoint::kChat) {
    r.chat.raw_request = raw_body;
    auto rendered = deps_.chat->render(r.messages, r.chat);
    if (!rendered.ok()) return from_status(rendered.status(), "messages");
    text = std::move(*rendered);
    // Tool schemas and the chat template add to the message text: bound what is tokenized.
    if (text.size() > options_.max_prompt_bytes) {
      ApiError e = bad_request(fmt::format("the rendered prompt has {} bytes, over the limit of "
                                           "{}", text.size(), options_.max_prompt_bytes),
                               "messages", "prompt_too_large");
      e.http_status = 413;
      return e;
    }
  } else if (r.prompt_text) {
    text = *r.prompt_text;
  }
  if (r.prompt_ids) {
    prompt = *r.prompt_ids;
    if (r.echo) p.echo_text = deps_.codec->decode(prompt);
  } else {
    auto ids = deps_.codec->encode(text);
    if (!ids.ok()) return from_status(ids.status(), r.endpoint == Endpoint::kChat ? "messages"
                                                                                  : "prompt");
    prompt = std::move(*ids);
    if (r.echo) p.echo_text = text;
  }
  if (prompt.empty()) return bad_request("the prompt encodes to zero tokens", "prompt");
  return std::nullopt;
}

namespace {

// "application/json", any case, optionally followed by parameters ("; charset=utf-8").
bool is_json_media_type(const std::string& value) {
  std::string type = value.substr(0, value.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.pop_back();
  size_t start = 0;
  while (start < type.size() && (type[start] == ' ' || type[start] == '\t')) ++start;
  type = type.substr(start);
  std::transform(type.begin(), type.end(), type.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return type == "application/json";
}

}  // namespace

std::optional<ApiError> ApiHandlers::read_body(const httplib::Request& req,
                                               const httplib::ContentReader& reader,
                                               std::string& body) {
  // Browsers send cross-site "simple" requests (text/plain, forms) without a preflight; only
  // application/json needs one, so requiring it keeps other sites' pages off a local server.
  if (!is_json_media_type(req.get_header_value("Content-Type"))) {
    mark_handling(/*close_after=*/true);  // the body is not read: the connection cannot be reused
    ApiError e = bad_request("Content-Type must be application/json", "", "unsupported_media_type");
    e.http_status = 415;
    return e;
  }
  bool too_large = false;
  const size_t limit = options_.max_body_bytes;
  const bool ok = reader([&](const char* data, size_t n) {
    if (n > limit - body.size()) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  const ConnectionInfo* conn = current_connection();
  if (too_large || (conn && conn->body_too_large)) {
    mark_handling(true);
    ApiError e = bad_request(fmt::format("request body over {} bytes", limit), "",
                             "request_too_large");
    e.http_status = 413;
    return e;
  }
  if (!ok) {
    mark_handling(true);
    ApiError e = bad_request(conn && conn->timed_out ? "request body not received in time"
                                                     : "request body could not be read");
    if (conn && conn->timed_out) e.http_status = 408;
    return e;
  }
  mark_handling();
  return std::nullopt;
}

std::optional<ApiError> ApiHandlers::validate(const std::string& body, Endpoint endpoint,
                                              PreparedRequest& p) {
  JsonLimits jl;
  jl.max_depth = options_.max_json_depth;
  jl.max_values = options_.max_json_values;
  if (JsonScan scan = scan_json(body, jl); scan != JsonScan::kOk)
    return bad_request("the request body is " + describe(scan, jl), "", "json_too_complex");
  json parsed = json::parse(body, nullptr, false);  // also rejects invalid UTF-8
  if (parsed.is_discarded()) return bad_request("the request body is not valid JSON (UTF-8)");
  ParseLimits limits;
  limits.vocab_size = deps_.backend->vocab_size();
  limits.default_thinking = options_.default_thinking;
  limits.max_json_depth = options_.max_json_depth;
  limits.max_messages = options_.max_messages;
  limits.max_tools = options_.max_tools;
  limits.max_prompt_bytes = options_.max_prompt_bytes;
  limits.max_prompt_ids = size_t(std::max<int64_t>(0, deps_.backend->context_length()));
  if (auto err = parse_request(parsed, endpoint, limits, p.parsed)) return err;
  const ParsedRequest& r = p.parsed;
  if (std::find(options_.model_ids.begin(), options_.model_ids.end(), r.model) ==
      options_.model_ids.end()) {
    ApiError e = bad_request(fmt::format("The model '{}' does not exist", r.model), "model",
                             "model_not_found");
    e.http_status = 404;
    e.type = "not_found_error";
    return e;
  }
  return std::nullopt;
}

std::optional<ApiError> ApiHandlers::prepare(const std::string& body, const std::string& authorization,
                                             Endpoint endpoint,
                                             PreparedRequest& p) {
  ParsedRequest& r = p.parsed;
  GenRequest g;
  if (auto err = tokenize(p, body, g.prompt)) return err;
  const int64_t context = deps_.backend->context_length();
  const int64_t n_prompt = int64_t(g.prompt.size());
  if (n_prompt >= context)
    return bad_request(fmt::format("This model's maximum context length is {} tokens; the prompt "
                                   "has {} tokens", context, n_prompt),
                       endpoint == Endpoint::kChat ? "messages" : "prompt",
                       "context_length_exceeded");
  if (r.max_tokens && n_prompt + *r.max_tokens > context)
    return bad_request(fmt::format("This model's maximum context length is {} tokens; {} prompt "
                                   "tokens + max_tokens {} exceed it", context, n_prompt,
                                   *r.max_tokens),
                       "max_tokens", "context_length_exceeded");
  g.max_tokens = r.max_tokens.value_or(context - n_prompt);
  g.temperature = r.temperature;
  g.top_p = r.top_p;
  g.top_k = r.top_k;
  g.seed = r.seed;
  g.stop_ids = r.stop_ids;
  g.ignore_eos = r.ignore_eos;
  g.logprobs = r.logprobs;
  g.prompt_logprobs = r.prompt_logprobs;
  // Echo with logprobs reports the prompt tokens' logprobs too (OpenAI completions).
  if (r.echo && r.logprobs >= 0) g.prompt_logprobs = std::max(g.prompt_logprobs, r.logprobs);
  g.tenant = options_.tenants.request_scope(authorization, r.user);
  g.id = next_id_++;
  p.meta.id = fmt::format("{}-{:016x}", endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl", g.id);
  p.meta.model = r.model;
  p.meta.created = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  auto parser = endpoint == Endpoint::kChat ? deps_.chat->parser(r.chat) : nullptr;
  p.generation = std::make_unique<Generation>(*deps_.backend, *deps_.codec, std::move(parser),
                                              std::move(g), r.stop_strings, metrics_, p.start);
  return std::nullopt;
}

void ApiHandlers::handle(const httplib::Request& req, httplib::Response& res,
                         const httplib::ContentReader& reader, Endpoint endpoint) {
  const std::string name = endpoint == Endpoint::kChat ? "chat" : "completions";
  auto p = std::make_shared<PreparedRequest>();
  p->start = std::chrono::steady_clock::now();
  auto fail = [&](const ApiError& e) {
    metrics_.count_request(name, e.http_status);
    send_error(res, e);
  };
  std::string body;
  if (auto err = read_body(req, reader, body)) return fail(*err);
  if (!deps_.backend->ready())
    return fail(from_status({StatusCode::kUnavailable, "the model is still loading; retry later"}));
  if (auto err = validate(body, endpoint, *p)) return fail(*err);
  // Admission: at most max_batch running + max_queue waiting, counted before the prompt is
  // rendered and tokenized so that a full server answers at once and spends nothing on it.
  const int64_t limit = options_.max_batch + options_.max_queue;
  if (++metrics_.in_flight > limit) {
    metrics_.in_flight--;
    metrics_.rejected_full++;
    metrics_.count_request(name, 503);
    ApiError e = from_status({StatusCode::kResourceExhausted,
                              fmt::format("the server is full ({} requests running or queued); "
                                          "retry later", limit)});
    return send_error(res, e);
  }
  p->ticket = std::make_unique<AdmissionTicket>(metrics_.in_flight);
  if (auto err = prepare(body, req.get_header_value("Authorization"), endpoint, *p)) return fail(*err);
  if (Status st = p->generation->submit(); !st.ok()) {
    ApiError e = from_status(st);
    metrics_.count_request(name, e.http_status);
    if (e.http_status == 503) metrics_.rejected_full++;
    return send_error(res, e);
  }
  metrics_.count_request(name, 200);
  if (p->parsed.stream) return respond_stream(req, res, p);
  respond_once(req, res, *p);
}

void ApiHandlers::log_done(const PreparedRequest& p, const std::string& finish) {
  const Usage& u = p.generation->usage();
  const double total = p.generation->total_seconds();
  const double ttft = p.generation->ttft_seconds();
  const double decode = total - ttft;
  // Decode rate after the first token; when every token arrived at once (a non-streamed
  // response is read in one go) fall back to the whole request's rate.
  const double tps = u.completion_tokens > 1 && decode > 1e-3 ? (u.completion_tokens - 1) / decode
                     : total > 0                              ? u.completion_tokens / total
                                                              : 0;
  metrics_.add_tokens(u.prompt_tokens, u.completion_tokens, u.cached_tokens);
  metrics_.observe_request(total);
  const std::string spec =
      u.spec_steps > 0 ? fmt::format(" spec={:.2f} tok/step", double(u.spec_tokens) / double(u.spec_steps)) : "";
  spdlog::info("request {} {} prompt={} cached={} completion={} ttft={:.3f}s {:.1f} tok/s "
               "total={:.3f}s finish={}{}", p.meta.id, p.parsed.stream ? "stream" : "once",
               u.prompt_tokens, u.cached_tokens, u.completion_tokens, ttft, tps, total, finish, spec);
}

void ApiHandlers::respond_once(const httplib::Request& req, httplib::Response& res,
                               PreparedRequest& p) {
  ConnectionWatch watch = ConnectionWatch::current();
  const bool http11 = req.version == "HTTP/1.1";
  auto probe = [&] { return send_interim_continue(watch.fd(), http11); };
  Generation& gen = *p.generation;
  ChatDelta all;
  json tool_calls = json::array();
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<PositionLogprobs> logprobs;
  std::vector<std::optional<PositionLogprobs>> prompt_lps;
  std::string finish, error;
  while (!gen.finished()) {
    if (watch.gone(probe) || stopping_) {
      gen.cancel();
      log_done(p, "client_gone");
      return;  // nobody to answer
    }
    auto step = gen.next(20);
    if (!step) continue;
    all.reasoning += step->delta.reasoning;
    all.content += step->delta.content;
    merge_tool_calls(tool_calls, step->delta.tool_calls);
    text += step->text;
    tokens.insert(tokens.end(), step->tokens.begin(), step->tokens.end());
    logprobs.insert(logprobs.end(), step->logprobs.begin(), step->logprobs.end());
    if (!step->prompt_logprobs.empty()) prompt_lps = std::move(step->prompt_logprobs);
    if (step->finished) finish = step->finish_reason, error = step->error;
  }
  log_done(p, error.empty() ? finish : "error");
  if (!error.empty()) {
    ApiError e = from_status({StatusCode::kInternal, error});
    return send_error(res, e);
  }
  const Usage& usage = gen.usage();
  json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
  if (p.parsed.return_token_ids) choice["token_ids"] = tokens;
  if (p.parsed.endpoint == Endpoint::kChat) {
    json msg = {{"role", "assistant"}, {"content", all.content}};
    if (!all.reasoning.empty() || p.parsed.chat.thinking) msg["reasoning_content"] = all.reasoning;
    if (!tool_calls.empty()) {
      msg["tool_calls"] = tool_calls;
      if (all.content.empty()) msg["content"] = nullptr;
    }
    choice["message"] = std::move(msg);
    if (p.parsed.logprobs >= 0) choice["logprobs"] = chat_logprobs_json(*deps_.codec, logprobs);
  } else {
    choice["text"] = p.echo_text + text;
    if (p.parsed.logprobs >= 0) {
      std::vector<int32_t> all_tokens;
      std::vector<std::optional<PositionLogprobs>> all_lps;
      if (p.parsed.echo) {
        all_tokens = p.generation->prompt();
        all_lps = prompt_lps;
        all_lps.resize(all_tokens.size());
      }
      all_tokens.insert(all_tokens.end(), tokens.begin(), tokens.end());
      for (auto& lp : logprobs) all_lps.push_back(lp);
      choice["logprobs"] = completion_logprobs_json(*deps_.codec, all_tokens, all_lps, 0);
    }
    if (p.parsed.prompt_logprobs >= 0)
      choice["prompt_logprobs"] =
          prompt_logprobs_json(*deps_.codec, p.generation->prompt(), prompt_lps);
  }
  json body = {{"id", p.meta.id},
               {"object", p.parsed.endpoint == Endpoint::kChat ? "chat.completion"
                                                               : "text_completion"},
               {"created", p.meta.created}, {"model", p.meta.model},
               {"choices", json::array({std::move(choice)})}, {"usage", usage_json(usage)}};
  res.set_content(dump_json(body), "application/json");
}

}  // namespace flashseek::server
