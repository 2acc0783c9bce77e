// Fields shared by both endpoints, and the /v1/completions prompt. Chat-only fields (messages,
// tools, thinking) are in request_chat.cpp.
#include "server/request.h"

#include <fmt/format.h>

#include "server/request_fields.h"

namespace flashseek::server {

using json = nlohmann::json;
using fields::MaybeError;
using fields::present;

MaybeError parse_chat_fields(const json& body, const ParseLimits& limits, ParsedRequest& out);

ApiError too_large(std::string message, std::string param) {
  ApiError e = bad_request(std::move(message), std::move(param), "prompt_too_large");
  e.http_status = 413;
  return e;
}

namespace {

MaybeError parse_token_id(const json& v, const char* field, const ParseLimits& limits,
                          int32_t& out) {
  if (!v.is_number_integer())
    return bad_request(fmt::format("'{}' must hold integer token ids", field), field);
  if (v.is_number_unsigned() ? v.get<uint64_t>() >= uint64_t(limits.vocab_size)
                             : (v.get<int64_t>() < 0 || v.get<int64_t>() >= limits.vocab_size))
    return bad_request(fmt::format("'{}' holds a token id outside [0, {})", field,
                                   limits.vocab_size), field);
  out = int32_t(v.get<int64_t>());
  return std::nullopt;
}

// `stop`: a string or an array of strings and token ids; `stop_token_ids`: token ids.
MaybeError parse_stops(const json& body, const ParseLimits& limits, ParsedRequest& out) {
  if (present(body, "stop")) {
    const json& stop = body["stop"];
    json items = stop.is_array() ? stop : json::array({stop});
    if (items.size() > limits.max_stops)
      return bad_request(fmt::format("'stop' has more than {} entries", limits.max_stops), "stop");
    for (const json& s : items) {
      if (s.is_string()) {
        if (s.get_ref<const std::string&>().empty())
          return bad_request("'stop' strings must not be empty", "stop");
        if (s.get_ref<const std::string&>().size() > limits.max_stop_bytes)
          return bad_request(fmt::format("'stop' strings must be at most {} bytes",
                                         limits.max_stop_bytes), "stop");
        out.stop_strings.push_back(s.get<std::string>());
      } else if (s.is_number_integer()) {
        int32_t id = 0;
        FS_API_TRY(parse_token_id(s, "stop", limits, id));
        out.stop_ids.push_back(id);
      } else {
        return bad_request("'stop' must be a string or an array of strings / token ids", "stop");
      }
    }
  }
  if (present(body, "stop_token_ids")) {
    const json& ids = body["stop_token_ids"];
    if (!ids.is_array() || ids.size() > 1024)
      return bad_request("'stop_token_ids' must be an array of token ids", "stop_token_ids");
    for (const json& v : ids) {
      int32_t id = 0;
      FS_API_TRY(parse_token_id(v, "stop_token_ids", limits, id));
      out.stop_ids.push_back(id);
    }
  }
  return std::nullopt;
}

MaybeError parse_seed(const json& body, ParsedRequest& out) {
  if (!present(body, "seed")) return std::nullopt;
  const json& v = body["seed"];
  if (!v.is_number_integer()) return bad_request("'seed' must be an integer", "seed");
  out.seed = v.is_number_unsigned() ? v.get<uint64_t>() : uint64_t(v.get<int64_t>());
  return std::nullopt;
}

MaybeError parse_sampling(const json& body, const ParseLimits& limits, ParsedRequest& out) {
  std::optional<int64_t> n, top_k, max_tokens, max_completion;
  FS_API_TRY(fields::get_int(body, "n", 1, INT64_MAX, n));
  if (n && *n != 1) return bad_request("only 'n' = 1 is supported", "n");
  FS_API_TRY(fields::get_number(body, "temperature", 0.0, 2.0, out.temperature));
  FS_API_TRY(fields::get_number(body, "top_p", 1e-9, 1.0, out.top_p));
  FS_API_TRY(fields::get_int(body, "top_k", -1, 1 << 30, top_k));
  if (top_k) out.top_k = *top_k < 0 ? 0 : *top_k;
  FS_API_TRY(parse_seed(body, out));
  FS_API_TRY(fields::get_int(body, "max_tokens", 1, 1 << 30, max_tokens));
  FS_API_TRY(fields::get_int(body, "max_completion_tokens", 1, 1 << 30, max_completion));
  out.max_tokens = max_completion ? max_completion : max_tokens;
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    double penalty = 0;
    FS_API_TRY(fields::get_number(body, key, -2.0, 2.0, penalty));
    if (penalty != 0)
      return bad_request(fmt::format("'{}' other than 0 is not supported", key), key);
  }
  FS_API_TRY(fields::get_bool(body, "ignore_eos", out.ignore_eos));
  FS_API_TRY(fields::get_bool(body, "return_token_ids", out.return_token_ids));
  FS_API_TRY(fields::get_string(body, "user", out.user));
  std::optional<int64_t> prompt_logprobs;
  FS_API_TRY(fields::get_int(body, "prompt_logprobs", 0, limits.max_logprobs, prompt_logprobs));
  if (prompt_logprobs) out.prompt_logprobs = *prompt_logprobs;
  return parse_stops(body, limits, out);
}

MaybeError parse_stream(const json& body, ParsedRequest& out) {
  FS_API_TRY(fields::get_bool(body, "stream", out.stream));
  if (!present(body, "stream_options")) return std::nullopt;
  const json& so = body["stream_options"];
  if (!so.is_object()) return bad_request("'stream_options' must be an object", "stream_options");
  if (!out.stream)
    return bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
  if (auto err = fields::get_bool(so, "include_usage", out.include_usage)) {
    err->param = "stream_options.include_usage";
    return err;
  }
  return std::nullopt;
}

MaybeError parse_prompt(const json& body, const ParseLimits& limits, ParsedRequest& out) {
  if (!present(body, "prompt")) return bad_request("'prompt' is required", "prompt");
  json prompt = body["prompt"];
  // A batch of one prompt is accepted; real batches need n prompts -> choices (not supported).
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array()))
    prompt = json(prompt[0]);
  if (prompt.is_string()) {
    if (prompt.get_ref<const std::string&>().empty())
      return bad_request("'prompt' must not be empty", "prompt");
    if (prompt.get_ref<const std::string&>().size() > limits.max_prompt_bytes)
      return too_large(fmt::format("'prompt' has more than {} bytes", limits.max_prompt_bytes),
                       "prompt");
    out.prompt_text = prompt.get<std::string>();
    return std::nullopt;
  }
  if (!prompt.is_array() || prompt.empty())
    return bad_request("'prompt' must be a string or a non-empty array of token ids (one prompt)",
                       "prompt");
  if (prompt.size() > limits.max_prompt_ids) {
    ApiError e = bad_request(fmt::format("'prompt' has {} token ids; the context holds {}",
                                         prompt.size(), limits.max_prompt_ids),
                             "prompt", "context_length_exceeded");
    return e;
  }
  std::vector<int32_t> ids;
  ids.reserve(prompt.size());
  for (const json& v : prompt) {
    int32_t id = 0;
    FS_API_TRY(parse_token_id(v, "prompt", limits, id));
    ids.push_back(id);
  }
  out.prompt_ids = std::move(ids);
  return std::nullopt;
}

MaybeError parse_completion_fields(const json& body, const ParseLimits& limits,
                                   ParsedRequest& out) {
  FS_API_TRY(parse_prompt(body, limits, out));
  FS_API_TRY(fields::get_bool(body, "echo", out.echo));
  std::optional<int64_t> logprobs;
  FS_API_TRY(fields::get_int(body, "logprobs", 0, limits.max_logprobs, logprobs));
  if (logprobs) out.logprobs = *logprobs;
  if (present(body, "suffix")) return bad_request("'suffix' is not supported", "suffix");
  if (present(body, "best_of")) {
    std::optional<int64_t> best_of;
    FS_API_TRY(fields::get_int(body, "best_of", 1, 1, best_of));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_request(const json& body, Endpoint endpoint,
                                      const ParseLimits& limits, ParsedRequest& out) {
  if (!body.is_object()) return bad_request("the request body must be a JSON object");
  out = ParsedRequest{};
  out.endpoint = endpoint;
  if (!present(body, "model")) return bad_request("'model' is required", "model");
  FS_API_TRY(fields::get_string(body, "model", out.model));
  FS_API_TRY(parse_stream(body, out));
  FS_API_TRY(parse_sampling(body, limits, out));
  if (endpoint == Endpoint::kCompletions) return parse_completion_fields(body, limits, out);
  return parse_chat_fields(body, limits, out);
}

}  // namespace flashseek::server
