// A deterministic stand-in for forward::Model (DESIGN/EXAMPLES habit 4): the logits of a position
// are a pure function of the token history up to and including it, so any correct scheduler must
// produce the same tokens whatever the batching. The state records the history, which lets
// tests check exactly what the engine fed.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "engine/sampling_params.h"
#include "forward/model.h"

namespace flashseek::engine::testing {

class FakeState : public forward::SequenceState {
 public:
  int64_t length() const override { return int64_t(history.size()); }
  std::unique_ptr<forward::SequenceState> clone() const override {
    return std::make_unique<FakeState>(*this);
  }
  std::vector<int32_t> history;
};

// One forward call as the model saw it.
struct RecordedItem {
  const forward::SequenceState* state = nullptr;  // which sequence (the engine's state object)
  int64_t start = 0;      // state length before the call
  int64_t n_tokens = 0;
  bool all_logits = false;
};

class FakeModel : public forward::Model {
 public:
  // Fills `out` [vocab] with the logits after `history` (its last token is the current one).
  using LogitsFn = std::function<void(std::span<const int32_t> history, std::span<float> out)>;

  explicit FakeModel(int64_t vocab, int64_t eos = 1) {
    cfg_.vocab_size = vocab;
    cfg_.eos_token_id = eos;
    fn_ = [](std::span<const int32_t> history, std::span<float> out) {
      // Hash of the whole history, then a pseudo-random logit per token in [-4, 4).
      uint64_t h = 0x1234567;
      for (int32_t t : history) h = mix64(h ^ (uint64_t(t) + 0x9e3779b97f4a7c15ull));
      for (size_t v = 0; v < out.size(); ++v)
        out[v] = float(8.0 * counter_uniform(h, v) - 4.0);
    };
  }
  void set_logits_fn(LogitsFn fn) { fn_ = std::move(fn); }
  model::ModelConfig& mutable_config() { return cfg_; }
  void fail_next_forward() { fail_next_ = true; }

  const model::ModelConfig& config() const override { return cfg_; }
  std::unique_ptr<forward::SequenceState> new_sequence() const override {
    return std::make_unique<FakeState>();
  }
  Status forward(std::span<forward::BatchItem> batch, std::vector<float>& logits) override {
    std::lock_guard lock(mu_);
    if (fail_next_) {
      fail_next_ = false;
      return internal_error("fake model: injected failure");
    }
    std::vector<RecordedItem> rec;
    const size_t V = size_t(cfg_.vocab_size);
    for (auto& item : batch) {
      auto* st = static_cast<FakeState*>(item.state);
      rec.push_back({st, st->length(), int64_t(item.tokens.size()), item.all_logits});
      for (size_t j = 0; j < item.tokens.size(); ++j) {
        st->history.push_back(item.tokens[j]);
        if (!item.all_logits && j + 1 < item.tokens.size()) continue;
        const size_t off = logits.size();
        logits.resize(off + V);
        fn_(st->history, std::span<float>(logits).subspan(off, V));
      }
    }
    calls_.push_back(std::move(rec));
    return {};
  }
  std::vector<std::vector<RecordedItem>> calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }

 private:
  model::ModelConfig cfg_;
  LogitsFn fn_;
  mutable std::mutex mu_;
  std::vector<std::vector<RecordedItem>> calls_;
  bool fail_next_ = false;
};

}  // namespace flashseek::engine::testing
