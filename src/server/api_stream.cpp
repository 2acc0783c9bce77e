// Streaming responses (SSE): one "data: {json}\n\n" event per step, the finish chunk, an
// optional usage chunk (stream_options.include_usage) and "data: [DONE]". The content provider
// runs on the connection's thread; it cancels the request as soon as the client is gone.
#include <spdlog/spdlog.h>

#include "server/api_handlers.h"
#include "server/connection_watch.h"

namespace flashseek::server {

using json = nlohmann::json;

namespace {

struct StreamState {
  std::shared_ptr<PreparedRequest> p;
  ConnectionWatch watch;
  bool first = true;
  bool done = false;
};

bool send_event(httplib::DataSink& sink, const json& j) {
  const std::string line = "data: " + dump_json(j) + "\n\n";
  return sink.write(line.data(), line.size());
}

json completion_chunk(const ResponseMeta& meta, const std::string& text,
                      const std::string& finish, json logprobs) {
  json choice = {{"index", 0}, {"text", text}, {"logprobs", std::move(logprobs)},
                 {"finish_reason", nullptr}};
  if (!finish.empty()) choice["finish_reason"] = finish;
  return {{"id", meta.id}, {"object", "text_completion"}, {"created", meta.created},
          {"model", meta.model}, {"choices", json::array({std::move(choice)})}};
}

// The chunks of one step (content first, then the finish chunk when it ends the request).
std::vector<json> step_chunks(StreamState& st, Step& step, const TextCodec& codec) {
  PreparedRequest& p = *st.p;
  const bool chat = p.parsed.endpoint == Endpoint::kChat;
  std::vector<json> out;
  const bool ids_pending = p.parsed.return_token_ids && !step.tokens.empty();
  json logprobs = nullptr;
  if (p.parsed.logprobs >= 0 && !step.tokens.empty()) {
    if (chat) {
      logprobs = chat_logprobs_json(codec, step.logprobs);
    } else {
      std::vector<std::optional<PositionLogprobs>> lps(step.logprobs.begin(), step.logprobs.end());
      logprobs = completion_logprobs_json(codec, step.tokens, lps, 0);
    }
  }
  if (chat) {
    if (st.first || !step.delta.empty() || !logprobs.is_null() || ids_pending)
      out.push_back(chat_chunk(p.meta, chat_delta_json(step.delta, st.first), "", logprobs));
    if (step.finished && step.error.empty())
      out.push_back(chat_chunk(p.meta, json::object(), step.finish_reason, nullptr));
  } else {
    std::string text = step.text;
    if (st.first) text = p.echo_text + text;
    if (!text.empty() || !logprobs.is_null() || ids_pending || (step.finished && step.error.empty()))
      out.push_back(completion_chunk(p.meta, text, step.finished ? step.finish_reason : "",
                                     logprobs));
  }
  if (p.parsed.return_token_ids && !out.empty())
    out.front()["choices"][0]["token_ids"] = step.tokens;
  st.first = false;
  return out;
}

}  // namespace

void ApiHandlers::respond_stream(const httplib::Request& req, httplib::Response& res,
                                 std::shared_ptr<PreparedRequest> p) {
  auto st = std::make_shared<StreamState>();
  st->p = std::move(p);
  (void)req;
  st->watch = ConnectionWatch::current();
  res.set_header("Cache-Control", "no-cache");
  auto provider = [this, st](size_t, httplib::DataSink& sink) -> bool {
    Generation& gen = *st->p->generation;
    for (;;) {
      // The probe is an SSE comment, which clients ignore.
      auto probe = [&sink] {
        static const std::string kComment = ": keep-alive\n\n";
        return sink.write(kComment.data(), kComment.size());
      };
      if (st->watch.gone(probe) || stopping_) {
        gen.cancel();
        log_done(*st->p, "client_gone");
        st->done = true;
        return false;  // closes the connection
      }
      auto step = gen.next(20);
      if (!step) continue;
      bool ok = true;
      for (const json& chunk : step_chunks(*st, *step, *deps_.codec)) ok = ok && send_event(sink, chunk);
      if (step->finished) {
        if (!step->error.empty()) {
          ok = ok && send_event(sink, from_status({StatusCode::kInternal, step->error}).to_json());
        } else if (st->p->parsed.include_usage) {
          json usage = {{"id", st->p->meta.id},
                        {"object", st->p->parsed.endpoint == Endpoint::kChat
                                       ? "chat.completion.chunk" : "text_completion"},
                        {"created", st->p->meta.created}, {"model", st->p->meta.model},
                        {"choices", json::array()}, {"usage", usage_json(gen.usage())}};
          ok = ok && send_event(sink, usage);
        }
        static const std::string kDone = "data: [DONE]\n\n";
        ok = ok && sink.write(kDone.data(), kDone.size());
        log_done(*st->p, step->error.empty() ? step->finish_reason : "error");
        st->done = true;
        if (ok) sink.done();
        return ok;
      }
      if (!ok) {
        gen.cancel();
        log_done(*st->p, "client_gone");
        st->done = true;
        return false;
      }
      return true;
    }
  };
  // The releaser runs when the response is over (or the connection dropped): release the
  // admission slot and make sure the request is cancelled.
  auto releaser = [st](bool) {
    if (!st->done) st->p->generation->cancel();
    st->p->ticket.reset();
  };
  res.set_chunked_content_provider("text/event-stream", provider, releaser);
}

}  // namespace flashseek::server
