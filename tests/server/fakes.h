// Deterministic stand-ins for the engine, tokenizer and chat format, so the HTTP layer can be
// tested without a model (EXAMPLES habit 4).
//
// FakeCodec: ids 0/1/2 are "<bos>", "<eos>", "<pad>"; ids 3..258 are the bytes 0..255; ids
// 259..299 are "<t259>".. (vocab 300).
// FakeChat: renders "<bos>[role]content..." + "[assistant]" (+ "<think>"); its parser splits
// "reasoning</think>content" and turns `<call name="N">{json}</call>` into tool calls.
// FakeBackend: a scheduler thread with max_batch slots that emits one token per running request
// per step; the reply is a pure function of (prompt, seed, temperature).
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "server/backend.h"
#include "server/text_port.h"

namespace flashseek::server::testing {

constexpr int32_t kBos = 0, kEos = 1, kVocab = 300;

class FakeCodec : public TextCodec {
 public:
  Result<std::vector<int32_t>> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string token_text(int32_t id) const override;
  std::unique_ptr<StreamDecoder> stream_decoder() const override;
};

class FakeChat : public ChatFormat {
 public:
  Result<std::string> render(const nlohmann::json& messages,
                             ChatOptions& options) const override;
  std::unique_ptr<OutputParser> parser(const ChatOptions& options) const override;
};

// The completion (before EOS) the fake backend generates for a prompt.
using Script = std::function<std::string(const std::vector<int32_t>& prompt, const GenRequest&)>;
std::string default_script(const std::vector<int32_t>& prompt, const GenRequest& req);

class FakeBackend : public GenerationBackend {
 public:
  FakeBackend(int64_t max_batch, int64_t max_queue, int step_ms, Script script = default_script);
  ~FakeBackend() override;
  Result<std::shared_ptr<EventSource>> submit(GenRequest req) override;
  void cancel(uint64_t id) override;
  BackendStats stats() const override;
  bool ready() const override { return ready_; }
  int64_t context_length() const override { return 4096; }
  int32_t eos_token() const override { return kEos; }
  int64_t vocab_size() const override { return kVocab; }

  void set_ready(bool r) { ready_ = r; }
  int64_t cancelled() const { return cancelled_; }

 private:
  struct Live {
    GenRequest req;
    std::shared_ptr<EventChannel> out;
    std::vector<int32_t> reply;  // tokens to emit, EOS last
    size_t next = 0;
  };
  void loop();
  void step_one(Live& live, bool first);

  const int64_t max_batch_, max_queue_;
  const int step_ms_;
  Script script_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Live> running_;
  std::vector<Live> queued_;
  std::atomic<bool> ready_{true}, stop_{false};
  std::atomic<int64_t> cancelled_{0}, steps_{0};
  std::thread thread_;
};

}  // namespace flashseek::server::testing
