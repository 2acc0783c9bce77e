// The HTTP layer end to end against the fake backend: response shapes, streaming = non-streaming,
// stop strings, logprobs, tools, errors, auth, readiness, admission and metrics.
#include <gtest/gtest.h>

#include "server_fixture.h"

namespace flashseek::server::testing {
namespace {

using json = nlohmann::json;

json post(LiveServer& s, const std::string& path, const json& body, int* status = nullptr) {
  auto res = s.client().Post(path, body.dump(), "application/json");
  EXPECT_TRUE(res) << path;
  if (!res) return {};
  if (status) *status = res->status;
  return json::parse(res->body);
}

json chat_body(const std::string& text) {
  return {{"model", "deepseek-v4.1-flash"},
          {"messages", json::array({{{"role", "user"}, {"content", text}}})},
          {"temperature", 0}};
}

// Concatenates streamed chat deltas.
struct Streamed {
  std::string content, reasoning, finish;
  json tool_calls = json::array();
  json usage;
  bool done = false;
  size_t chunks = 0;
};
Streamed stream_chat(LiveServer& s, json body) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto res = s.client().Post("/v1/chat/completions", body.dump(), "application/json");
  Streamed out;
  EXPECT_TRUE(res);
  if (!res) return out;
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  for (const json& ev : sse_events(res->body, out.done)) {
    out.chunks++;
    if (ev.contains("usage") && !ev["usage"].is_null()) out.usage = ev["usage"];
    if (ev["choices"].empty()) continue;
    const json& c = ev["choices"][0];
    if (!c["finish_reason"].is_null()) out.finish = c["finish_reason"];
    const json& d = c["delta"];
    if (d.contains("content") && d["content"].is_string()) out.content += d["content"];
    if (d.contains("reasoning_content")) out.reasoning += d["reasoning_content"];
    if (d.contains("tool_calls"))
      for (const json& tc : d["tool_calls"]) {
        const size_t i = tc["index"];
        while (out.tool_calls.size() <= i) out.tool_calls.push_back({{"name", ""}, {"args", ""}});
        if (tc["function"].contains("name")) out.tool_calls[i]["name"] = tc["function"]["name"];
        out.tool_calls[i]["args"] =
            out.tool_calls[i]["args"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
      }
  }
  return out;
}

TEST(Http, ChatNonStreamShape) {
  LiveServer s;
  int status = 0;
  json r = post(s, "/v1/chat/completions", chat_body("hello"), &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["model"], "deepseek-v4.1-flash");
  const json& msg = r["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"].get<std::string>().rfind("Reply:", 0), 0u);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  // completion tokens: every byte of the reply + EOS (EOS text is not shown).
  const int64_t n = int64_t(msg["content"].get<std::string>().size()) + 1;
  EXPECT_EQ(r["usage"]["completion_tokens"], n);
  EXPECT_GT(r["usage"]["prompt_tokens"].get<int64_t>(), 5);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"],
            r["usage"]["prompt_tokens"].get<int64_t>() / 2);
}

TEST(Http, StreamEqualsNonStreamForSameSeed) {
  LiveServer s;
  for (json body : {chat_body("one"), chat_body("UTF8 please")}) {
    body["temperature"] = 0.8;
    body["seed"] = 42;
    json once = post(s, "/v1/chat/completions", body);
    Streamed st = stream_chat(s, body);
    EXPECT_TRUE(st.done);
    EXPECT_EQ(st.content, once["choices"][0]["message"]["content"]);
    EXPECT_EQ(st.finish, "stop");
    EXPECT_EQ(st.usage["completion_tokens"], once["usage"]["completion_tokens"]);
  }
  // A different seed changes the sampled text (the fake samples like a real sampler would).
  json a = chat_body("one"), b = chat_body("one");
  a["temperature"] = b["temperature"] = 1.0;
  a["seed"] = 1;
  b["seed"] = 2;
  EXPECT_NE(post(s, "/v1/chat/completions", a)["choices"][0]["message"]["content"],
            post(s, "/v1/chat/completions", b)["choices"][0]["message"]["content"]);
}

TEST(Http, MaxTokensGivesLength) {
  LiveServer s;
  json body = chat_body("hello");
  body["max_tokens"] = 5;
  json r = post(s, "/v1/chat/completions", body);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Reply");
  EXPECT_EQ(r["usage"]["completion_tokens"], 5);
  Streamed st = stream_chat(s, body);
  EXPECT_EQ(st.content, "Reply");
  EXPECT_EQ(st.finish, "length");
}

TEST(Http, StopStringsCutTheTextInBothModes) {
  LiveServer s;
  json body = chat_body("hello");
  const std::string full = post(s, "/v1/chat/completions", body)["choices"][0]["message"]["content"];
  const size_t cut = full.find(' ', 8);  // a stop string spanning several tokens
  ASSERT_NE(cut, std::string::npos);
  body["stop"] = json::array({full.substr(cut, 3), "never-appears"});
  json r = post(s, "/v1/chat/completions", body);
  EXPECT_EQ(r["choices"][0]["message"]["content"], full.substr(0, cut));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  Streamed st = stream_chat(s, body);
  EXPECT_EQ(st.content, full.substr(0, cut));
}

TEST(Http, StopTokenIdEndsWithoutItsText) {
  LiveServer s;
  json body = chat_body("hello");
  body["stop"] = json::array({3 + ':'});  // the fake token for ':'
  json r = post(s, "/v1/chat/completions", body);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Reply");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
}

TEST(Http, ThinkingAndToolCalls) {
  LiveServer s;
  json body = chat_body("THINK about it");
  body["thinking"] = {{"type", "enabled"}};
  json r = post(s, "/v1/chat/completions", body);
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "Two plus two.");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "The answer is 4.");
  Streamed st = stream_chat(s, body);
  EXPECT_EQ(st.reasoning, "Two plus two.");
  EXPECT_EQ(st.content, "The answer is 4.");

  json tools = chat_body("CALLTOOL weather?");
  tools["tools"] = json::parse(R"([{"type":"function","function":{"name":"get_weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  r = post(s, "/v1/chat/completions", tools);
  const json& msg = r["choices"][0]["message"];
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>())["city"],
            "Paris");
  EXPECT_EQ(msg["content"], "Let me check.");
  st = stream_chat(s, tools);
  EXPECT_EQ(st.finish, "tool_calls");
  ASSERT_EQ(st.tool_calls.size(), 1u);
  EXPECT_EQ(st.tool_calls[0]["name"], "get_weather");
  EXPECT_EQ(st.tool_calls[0]["args"], msg["tool_calls"][0]["function"]["arguments"]);
}

TEST(Http, CompletionsEchoLogprobsAndIds) {
  LiveServer s;
  json body = {{"model", "tiny-demo"}, {"prompt", "abc"}, {"max_tokens", 3}, {"echo", true},
               {"logprobs", 2}, {"temperature", 0}};
  json r = post(s, "/v1/completions", body);
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  const json& c = r["choices"][0];
  EXPECT_EQ(c["text"], "abcRep");
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u);  // 3 prompt + 3 generated
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -0.51f);
  EXPECT_FLOAT_EQ(lp["token_logprobs"][3].get<float>(), -0.25f);
  EXPECT_EQ(lp["top_logprobs"][3].size(), 2u);
  EXPECT_EQ(lp["text_offset"][4], 4);
  // Token ids as the prompt, prompt_logprobs in vLLM form.
  json ids = {{"model", "tiny-demo"}, {"prompt", json::array({3 + 'x', 3 + 'y'})},
              {"max_tokens", 2}, {"prompt_logprobs", 0}};
  r = post(s, "/v1/completions", ids);
  EXPECT_EQ(r["choices"][0]["text"], "Re");
  const json& plp = r["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(plp.size(), 2u);
  EXPECT_TRUE(plp[0].is_null());
  EXPECT_EQ(plp[1][std::to_string(3 + 'y')]["decoded_token"], "y");
}

TEST(Http, ChatLogprobsShape) {
  LiveServer s;
  json body = chat_body("hello");
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  body["max_tokens"] = 4;
  json r = post(s, "/v1/chat/completions", body);
  const json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  EXPECT_EQ(content[0]["token"], "R");
  EXPECT_EQ(content[0]["bytes"], json::array({int('R')}));
  EXPECT_EQ(content[0]["top_logprobs"].size(), 3u);
}

TEST(Http, ErrorsAreOpenAiObjects) {
  LiveServer s;
  auto c = s.client();
  struct Case {
    std::string path, body;
    int status;
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", 400},
      {"/v1/chat/completions", "[1,2]", 400},
      {"/v1/chat/completions", "{\"model\":\"deepseek-v4.1-flash\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", 400},
      {"/v1/chat/completions", [] { json b = chat_body("x"); b["model"] = "gpt-9"; return b.dump(); }(), 404},
      {"/v1/completions", "{\"model\":\"tiny-demo\",\"prompt\":\"" + std::string(5000, 'a') + "\"}", 400},
      {"/v1/completions", "{\"model\":\"tiny-demo\",\"prompt\":\"a\",\"max_tokens\":5000}", 400},
      {"/v1/nothing", "{}", 404},
  };
  for (const auto& cs : cases) {
    auto res = c.Post(cs.path, cs.body, "application/json");
    ASSERT_TRUE(res) << cs.body.substr(0, 80);
    EXPECT_EQ(res->status, cs.status) << cs.body.substr(0, 80) << " -> " << res->body;
    json j = json::parse(res->body);
    EXPECT_TRUE(j["error"]["message"].is_string()) << res->body;
    EXPECT_TRUE(j["error"]["type"].is_string()) << res->body;
  }
}

TEST(Http, ModelsHealthAndReadiness) {
  LiveServer s;
  auto c = s.client();
  auto models = json::parse(c.Get("/v1/models")->body);
  EXPECT_EQ(models["data"][0]["id"], "deepseek-v4.1-flash");
  EXPECT_EQ(models["data"][1]["id"], "tiny-demo");
  EXPECT_EQ(c.Get("/healthz")->status, 200);
  EXPECT_EQ(c.Get("/readyz")->status, 200);
  s.backend->set_ready(false);
  EXPECT_EQ(c.Get("/readyz")->status, 503);
  EXPECT_EQ(c.Get("/healthz")->status, 200);
  auto res = c.Post("/v1/chat/completions", chat_body("hi").dump(), "application/json");
  EXPECT_EQ(res->status, 503);  // no generation before the model is ready
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "service_unavailable");
}

TEST(Http, ApiKeyRequired) {
  ServerOptions opts;
  opts.api_key = "sekrit";
  LiveServer s(opts);
  auto c = s.client();
  auto res = c.Get("/v1/models");
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "invalid_api_key");
  c.set_bearer_token_auth("wrong!");
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  c.set_bearer_token_auth("sekrit");
  EXPECT_EQ(c.Get("/v1/models")->status, 200);
  EXPECT_EQ(c.Post("/v1/chat/completions", chat_body("hi").dump(), "application/json")->status, 200);
  EXPECT_EQ(s.client().Get("/healthz")->status, 200);  // probes need no key
  EXPECT_NE(tenant_of("sekrit"), tenant_of("other"));
  EXPECT_EQ(tenant_of(""), 0u);
}

TEST(Http, QueueFullGives503WithRetryAfter) {
  // 1 slot + 1 queued; a slow backend (20 ms per step) keeps them busy.
  LiveServer s({}, 1, 1, 20);
  json body = chat_body("LONG");
  body["max_tokens"] = 100;  // 2 s per request: both stay in flight even on a loaded machine
  std::vector<std::thread> hold;
  // Bounded waits: a slow machine must fail the test, never hang it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto wait_for = [&](const char* metric, int64_t value) {
    while (s.metric(metric) < value && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  // The first request must own the slot before the second queues, or the second would find the
  // one-entry queue still occupied by the first and be rejected itself.
  hold.emplace_back([&] { s.client().Post("/v1/chat/completions", body.dump(), "application/json"); });
  wait_for("flashseek_batch_size", 1);
  hold.emplace_back([&] { s.client().Post("/v1/chat/completions", body.dump(), "application/json"); });
  wait_for("flashseek_requests_in_flight", 2);
  if (s.metric("flashseek_requests_in_flight") < 2) {
    for (auto& t : hold) t.join();
    FAIL() << "the two holding requests were never in flight together";
  }
  auto res = s.client().Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "overloaded");
  for (auto& t : hold) t.join();
  EXPECT_EQ(s.settled_metric("flashseek_requests_in_flight", 0), 0);
  EXPECT_EQ(s.metric("flashseek_requests_rejected_total"), 1);
}

TEST(Http, MetricsCountTokensAndLatency) {
  LiveServer s;
  json r = post(s, "/v1/chat/completions", chat_body("hello"));
  const int64_t prompt = r["usage"]["prompt_tokens"], completion = r["usage"]["completion_tokens"];
  EXPECT_EQ(s.metric("flashseek_prompt_tokens_total"), prompt);
  EXPECT_EQ(s.metric("flashseek_generation_tokens_total"), completion);
  EXPECT_EQ(s.metric("flashseek_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(s.metric("flashseek_inter_token_seconds_count"), completion - 1);
  auto body = s.client().Get("/metrics")->body;
  EXPECT_NE(body.find("flashseek_requests_total{endpoint=\"chat\",code=\"200\"} 1"), std::string::npos);
  EXPECT_NE(body.find("# TYPE flashseek_queue_depth gauge"), std::string::npos);
}

}  // namespace
}  // namespace flashseek::server::testing
