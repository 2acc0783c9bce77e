#include "fakes.h"

#include <chrono>

#include <fmt/format.h>

namespace flashseek::server::testing {

// ---------------------------------------------------------------- codec

Result<std::vector<int32_t>> FakeCodec::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  const std::string_view bos = "<bos>";
  size_t i = 0;
  while (i < text.size()) {
    if (text.substr(i, bos.size()) == bos) {
      ids.push_back(kBos);
      i += bos.size();
    } else {
      ids.push_back(3 + int32_t(static_cast<unsigned char>(text[i++])));
    }
  }
  return ids;
}

std::string FakeCodec::token_text(int32_t id) const {
  if (id == 0) return "<bos>";
  if (id == 1) return "<eos>";
  if (id == 2) return "<pad>";
  if (id >= 3 && id < 259) return std::string(1, char(id - 3));
  return fmt::format("<t{}>", id);
}

std::string FakeCodec::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += token_text(id);
  return out;
}

namespace {
// Length of the longest prefix of `s` made of complete UTF-8 sequences.
size_t complete_utf8_prefix(const std::string& s) {
  size_t i = s.size();
  size_t back = 0;
  while (i > 0 && back < 4) {
    const unsigned char c = static_cast<unsigned char>(s[i - 1]);
    if ((c & 0xC0) != 0x80) {  // lead byte (or ASCII)
      const size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
      return back + 1 >= need ? s.size() : i - 1;
    }
    --i;
    ++back;
  }
  return s.size();
}

class FakeDecoder : public StreamDecoder {
 public:
  explicit FakeDecoder(const FakeCodec& codec) : codec_(codec) {}
  std::string push(int32_t token) override {
    held_ += codec_.token_text(token);
    const size_t n = complete_utf8_prefix(held_);
    std::string out = held_.substr(0, n);
    held_.erase(0, n);
    return out;
  }
  std::string flush() override { return std::exchange(held_, {}); }

 private:
  const FakeCodec& codec_;
  std::string held_;
};
}  // namespace

std::unique_ptr<StreamDecoder> FakeCodec::stream_decoder() const {
  return std::make_unique<FakeDecoder>(*this);
}

// ---------------------------------------------------------------- chat

Result<std::string> FakeChat::render(const nlohmann::json& messages,
                                     ChatOptions& options) const {
  std::string out = "<bos>";
  if (options.tools.is_array()) out += "[tools]" + options.tools.dump();
  for (const auto& m : messages) {
    out += "[" + m["role"].get<std::string>() + "]";
    if (m.contains("content") && m["content"].is_string()) out += m["content"].get<std::string>();
  }
  out += "[assistant]";
  if (options.thinking) out += "<think>";
  return out;
}

namespace {
// reasoning until "</think>" (thinking mode), then content; `<call name="N">ARGS</call>` in
// content becomes a tool call. Text that may be the start of a tag is held back.
class FakeParser : public OutputParser {
 public:
  explicit FakeParser(bool thinking) : in_reasoning_(thinking) {}
  Result<ChatDelta> push(std::string_view text) override {
    buf_ += text;
    ChatDelta d;
    for (;;) {
      if (in_reasoning_) {
        const size_t end = buf_.find("</think>");
        if (end == std::string::npos) {
          const size_t keep = partial(buf_, "</think>");
          d.reasoning += buf_.substr(0, buf_.size() - keep);
          buf_.erase(0, buf_.size() - keep);
          return d;
        }
        d.reasoning += buf_.substr(0, end);
        buf_.erase(0, end + 8);
        in_reasoning_ = false;
        continue;
      }
      const size_t open = buf_.find("<call name=\"");
      if (open == std::string::npos) {
        const size_t keep = partial(buf_, "<call name=\"");
        d.content += buf_.substr(0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return d;
      }
      d.content += buf_.substr(0, open);
      buf_.erase(0, open);
      const size_t close = buf_.find("</call>");
      if (close == std::string::npos) return d;  // wait for the rest of the call
      const size_t name_end = buf_.find("\">");
      if (name_end == std::string::npos || name_end > close)
        return Status(StatusCode::kParseError, "malformed <call>");
      ToolCallDelta tc;
      tc.index = n_calls_++;
      tc.id = fmt::format("call_{}", tc.index);
      tc.name = buf_.substr(12, name_end - 12);
      tc.arguments = buf_.substr(name_end + 2, close - name_end - 2);
      d.tool_calls.push_back(std::move(tc));
      buf_.erase(0, close + 7);
    }
  }
  Result<ChatDelta> finish() override {
    ChatDelta d;
    if (buf_.find("<call") != std::string::npos)
      return Status(StatusCode::kParseError, "unterminated <call>");
    (in_reasoning_ ? d.reasoning : d.content) = std::exchange(buf_, {});
    return d;
  }

 private:
  static size_t partial(const std::string& s, const std::string& tag) {
    for (size_t len = std::min(tag.size() - 1, s.size()); len > 0; --len)
      if (s.compare(s.size() - len, len, tag, 0, len) == 0) return len;
    return 0;
  }
  bool in_reasoning_;
  std::string buf_;
  int n_calls_ = 0;
};
}  // namespace

std::unique_ptr<OutputParser> FakeChat::parser(const ChatOptions& options) const {
  return std::make_unique<FakeParser>(options.thinking);
}

// ---------------------------------------------------------------- backend

std::string default_script(const std::vector<int32_t>& prompt, const GenRequest& req) {
  const std::string text = FakeCodec().decode(prompt);
  if (text.find("CALLTOOL") != std::string::npos)
    return "Let me check.<call name=\"get_weather\">{\"city\": \"Paris\"}</call>";
  if (text.find("THINK") != std::string::npos) return "Two plus two.</think>The answer is 4.";
  if (text.find("UTF8") != std::string::npos) return "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93 \xf0\x9f\x98\x80!";
  if (text.find("LONG") != std::string::npos) return std::string(3000, 'z');
  static const char* kWords[] = {"alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"};
  // Greedy ignores the seed; sampled output depends on it (like a real sampler).
  const uint64_t seed = req.temperature > 0 ? req.seed.value_or(12345) : 0;
  uint64_t h = 1469598103934665603ull ^ seed;
  for (int32_t id : prompt) h = (h ^ uint64_t(id)) * 1099511628211ull;
  std::string out = "Reply:";
  for (int i = 0; i < 8; ++i) {
    h = (h ^ uint64_t(i)) * 1099511628211ull;
    out += std::string(" ") + kWords[(h >> 29) % 8];
  }
  return out + ".";
}

FakeBackend::FakeBackend(int64_t max_batch, int64_t max_queue, int step_ms, Script script)
    : max_batch_(max_batch), max_queue_(max_queue), step_ms_(step_ms), script_(std::move(script)) {
  thread_ = std::thread([this] { loop(); });
}

FakeBackend::~FakeBackend() {
  stop_ = true;
  cv_.notify_all();
  thread_.join();
}

Result<std::shared_ptr<EventSource>> FakeBackend::submit(GenRequest req) {
  if (req.prompt.empty()) return invalid_argument("prompt: empty");
  auto out = std::make_shared<EventChannel>();
  std::lock_guard<std::mutex> lock(mu_);
  if (int64_t(queued_.size()) >= max_queue_)
    return Status(StatusCode::kResourceExhausted, "queue full");
  Live live{std::move(req), out, {}, 0};
  FakeCodec codec;
  live.reply = *codec.encode(script_(live.req.prompt, live.req));
  live.reply.push_back(kEos);
  queued_.push_back(std::move(live));
  cv_.notify_all();
  return std::shared_ptr<EventSource>(out);
}

void FakeBackend::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto finish = [&](Live& live) {
    GenEvent ev;
    ev.finish = Finish::kCancelled;
    live.out->push(std::move(ev));
    cancelled_++;
  };
  if (auto it = running_.find(id); it != running_.end()) {
    finish(it->second);
    running_.erase(it);  // the slot is free at once
    return;
  }
  for (auto it = queued_.begin(); it != queued_.end(); ++it) {
    if (it->req.id == id) {
      finish(*it);
      queued_.erase(it);
      return;
    }
  }
}

BackendStats FakeBackend::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  BackendStats s;
  s.queued = int64_t(queued_.size());
  s.running = int64_t(running_.size());
  s.max_batch = max_batch_;
  s.steps = steps_;
  return s;
}

void FakeBackend::step_one(Live& live, bool first) {
  GenEvent ev;
  const GenRequest& r = live.req;
  ev.token = live.reply[live.next++];
  if (first) ev.cached_tokens = int64_t(r.prompt.size()) / 2;  // pretend half was cached
  if (first && r.prompt_logprobs >= 0) {
    ev.prompt_logprobs.resize(r.prompt.size());
    for (size_t i = 1; i < r.prompt.size(); ++i)
      ev.prompt_logprobs[i] = PositionLogprobs{{r.prompt[i], -0.5f - 0.01f * float(i)}, {}};
  }
  if (r.logprobs >= 0) {
    PositionLogprobs lp{{ev.token, -0.25f}, {}};
    for (int64_t k = 0; k < r.logprobs; ++k)
      lp.top.push_back({int32_t((ev.token + k) % kVocab), -0.25f - 0.5f * float(k)});
    ev.logprobs = lp;
  }
  const bool is_stop = (ev.token == kEos && !r.ignore_eos) ||
                       std::find(r.stop_ids.begin(), r.stop_ids.end(), ev.token) != r.stop_ids.end();
  if (is_stop) ev.finish = Finish::kStop;
  else if (int64_t(live.next) >= r.max_tokens) ev.finish = Finish::kLength;
  else if (live.next >= live.reply.size()) live.next = 0;  // ignore_eos: repeat the reply
  live.out->push(std::move(ev));
}

void FakeBackend::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(step_ms_));
    if (stop_) break;
    // Admit queued requests into free slots, then one token for every running request.
    std::vector<uint64_t> fresh;
    while (!queued_.empty() && int64_t(running_.size()) < max_batch_) {
      Live live = std::move(queued_.front());
      queued_.erase(queued_.begin());
      fresh.push_back(live.req.id);
      running_.emplace(live.req.id, std::move(live));
    }
    if (running_.empty()) continue;
    steps_++;
    for (auto it = running_.begin(); it != running_.end();) {
      const bool first = it->second.next == 0 &&
                         std::find(fresh.begin(), fresh.end(), it->first) != fresh.end();
      step_one(it->second, first);
      if (it->second.out->closed()) it = running_.erase(it);
      else ++it;
    }
  }
}

}  // namespace flashseek::server::testing
