// Snapshot hooks of the CPU backend (forward/state_convert.h, Model::export_state/import_state):
// export → serialise → deserialise → import is bit-exact and continues exactly like the original
// sequence; import refuses every state whose geometry does not fit the model (one field at a
// time), and the engine then prefills the whole prompt instead (same tokens as without a prefix).
// The GPU twin of these tests is gpu_snapshot_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "core/rng.h"
#include "engine/engine.h"
#include "engine/fake_model.h"
#include "forward/cpu_model.h"
#include "forward/state_convert.h"
#include "forward/state_io.h"
#include "model/make_tiny.h"
#include "state_test_util.h"

namespace flashseek::forward {
namespace {

namespace fs = std::filesystem;
using state_test::expect_same_state;

std::unique_ptr<CpuModel> load_tiny(const std::string& name, const std::string& dir) {
  auto cfg = model::builtin_config(name);
  EXPECT_TRUE(cfg.ok());
  model::MakeTinyOptions opt;
  opt.seed = 5;
  EXPECT_TRUE(model::make_tiny_checkpoint(cfg.value(), opt, dir).ok());
  auto m = CpuModel::load(dir, Numerics::kExact);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<int32_t> toks(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng.below(uint64_t(vocab)));
  return t;
}

std::vector<float> feed(Model& m, SequenceState& st, std::span<const int32_t> t) {
  std::vector<float> logits;
  BatchItem item{&st, t, true};
  const Status s = m.forward({&item, 1}, logits);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return logits;
}

class StateConvert : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / (std::string("fs_sconv_") + GetParam() + "_" + std::to_string(::getpid())))
               .string();
    model_ = load_tiny(GetParam(), dir_);
    ASSERT_TRUE(model_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  int64_t vocab() const { return model_->config().vocab_size; }
  // A state of n tokens fed in chunks of 37 with 3 extra tokens fed and rolled back at the end
  // (rollback history in use), n crossing the compression groups of every ratio (V4: 128).
  std::unique_ptr<SequenceState> make_state(const std::vector<int32_t>& t) {
    auto st = model_->new_sequence();
    for (size_t i = 0; i < t.size(); i += 37)
      feed(*model_, *st, std::span<const int32_t>(t).subspan(i, std::min<size_t>(37, t.size() - i)));
    const auto extra = toks(3, vocab(), 77);
    feed(*model_, *st, extra);
    EXPECT_TRUE(model_->rollback(*st, int64_t(t.size())).ok());
    return st;
  }
  std::string dir_;
  std::unique_ptr<CpuModel> model_;
};

// export → serialize_snapshot → deserialize → import gives a state whose export equals the first
// one bit for bit, and continuing it (a chunk, then one-token decodes) gives the same logits bit
// for bit as continuing the original.
TEST_P(StateConvert, RoundTripThroughBlobContinuesExactly) {
  const auto t = toks(141, vocab(), 1), cont = toks(11, vocab(), 2);
  auto st = make_state(t);
  auto exp = model_->export_state(*st);
  ASSERT_TRUE(exp.ok()) << exp.status().to_string();
  auto blob = serialize_snapshot(**exp, t, {42, 7, 9, int64_t(t.size()), 0});
  ASSERT_TRUE(blob.ok()) << blob.status().to_string();
  auto dec = deserialize_snapshot(*blob, 42, model_snapshot_geometry(*model_, int64_t(1) << 20));
  ASSERT_TRUE(dec.ok()) << dec.status().to_string();
  auto imp = model_->import_state(*dec->state);
  ASSERT_TRUE(imp.ok()) << imp.status().to_string();
  auto again = model_->export_state(**imp);
  ASSERT_TRUE(again.ok());
  expect_same_state(**exp, **again);

  std::vector<float> want = feed(*model_, *st, std::span<const int32_t>(cont).first(6));
  std::vector<float> got = feed(*model_, **imp, std::span<const int32_t>(cont).first(6));
  for (size_t i = 6; i < cont.size(); ++i) {
    const auto w = feed(*model_, *st, std::span<const int32_t>(cont).subspan(i, 1));
    const auto g = feed(*model_, **imp, std::span<const int32_t>(cont).subspan(i, 1));
    want.insert(want.end(), w.begin(), w.end());
    got.insert(got.end(), g.begin(), g.end());
  }
  ASSERT_EQ(want.size(), cont.size() * size_t(vocab()));
  EXPECT_TRUE(state_test::same_bits(want, got));
}

// Every state a fresh sequence and short prefixes produce (lengths 0..9: open groups, partial
// histories, short Engram look-back) passes the geometry check.
TEST_P(StateConvert, ImportAcceptsEveryShortState) {
  const auto t = toks(9, vocab(), 3);
  auto st = model_->new_sequence();
  for (size_t i = 0; i <= t.size(); ++i) {
    auto exp = model_->export_state(*st);
    ASSERT_TRUE(exp.ok());
    auto imp = model_->import_state(**exp);
    EXPECT_TRUE(imp.ok()) << "length " << i << ": " << imp.status().to_string();
    if (i < t.size()) feed(*model_, *st, std::span<const int32_t>(t).subspan(i, 1));
  }
}

// One field at a time made inconsistent with the model: each import is refused with a
// "state geometry" error (the untouched state imports).
TEST_P(StateConvert, ImportRejectsWrongGeometry) {
  const auto t = toks(70, vocab(), 4);
  auto st = make_state(t);
  auto base = model_->export_state(*st);
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(model_->import_state(**base).ok());
  const auto& c = model_->config();
  const bool v41 = c.is_v41();
  int pooled = -1, keyed = -1;  // a layer with a pooling compressor, one with index keys
  for (int l = 0; l < int(c.num_layers); ++l) {
    const auto ls = state_layer_shape(c, l);
    if (ls.pooled && pooled < 0) pooled = l;
    if (ls.ikeys && keyed < 0) keyed = l;
  }
  ASSERT_GE(pooled, 0);
  ASSERT_GE(keyed, 0);
  const std::vector<std::pair<std::string, std::function<void(CpuSequenceState&)>>> edits = {
      {"one layer fewer", [](CpuSequenceState& s) { s.layers.pop_back(); }},
      {"one layer more", [](CpuSequenceState& s) { s.layers.push_back(s.layers.back()); }},
      {"ring size", [](CpuSequenceState& s) { s.ring_size += 1; }},
      {"ring floats", [](CpuSequenceState& s) { s.layers[0].ring.pop_back(); }},
      {"length", [](CpuSequenceState& s) { s.len += 1; }},
      {"negative length", [](CpuSequenceState& s) { s.len = -1; }},
      {"compressed KV row", [&](CpuSequenceState& s) {
         s.layers[size_t(pooled)].ckv.append(std::vector<float>(size_t(c.head_dim), 0.0f));
       }},
      {"compressed KV width", [&](CpuSequenceState& s) {
         auto& p = s.layers[size_t(pooled)].ckv;
         const auto rows = p.to_vector();
         p.reset(c.head_dim / 2);
         p.append(rows);  // same floats, rows of half the width
       }},
      {"index key width", [&](CpuSequenceState& s) {
         auto& p = s.layers[size_t(keyed)].ikeys;
         const auto rows = p.to_vector();
         p.reset(c.index_head_dim * 2);
         if (rows.size() % size_t(c.index_head_dim * 2) == 0) p.append(rows);
       }},
      {"open group row", [&](CpuSequenceState& s) {
         auto& cs = s.layers[size_t(pooled)].comp;
         const size_t w = cs.hist_v.size() / size_t(s.len - cs.hist_first);
         cs.v.resize(cs.v.size() + w);
         cs.z.resize(cs.z.size() + w);
         cs.n_pend += 1;
       }},
      {"open group width", [&](CpuSequenceState& s) {
         auto& cs = s.layers[size_t(pooled)].comp;
         cs.v.push_back(0);
       }},
      {"history start", [&](CpuSequenceState& s) { s.layers[size_t(pooled)].comp.hist_first -= 1; }},
      {"history beyond the length", [&](CpuSequenceState& s) {
         s.layers[size_t(pooled)].comp.hist_first = s.len + 5;
       }},
      {"compressor data on a window-only layer", [&](CpuSequenceState& s) {
         s.layers[0].comp = s.layers[size_t(pooled)].comp;
       }},
      {"previous window flag", [&](CpuSequenceState& s) {
         s.layers[size_t(pooled)].comp.has_prev = !s.layers[size_t(pooled)].comp.has_prev;
       }},
      {"draft rings", [&](CpuSequenceState& s) {
         if (!s.draft_rings.empty()) s.draft_rings.pop_back();
         else s.draft_rings.emplace_back(size_t(s.ring_size * c.head_dim), 0.0f);
       }},
      {"draft ring floats", [&](CpuSequenceState& s) {
         if (!s.draft_rings.empty()) s.draft_rings.back().push_back(0.0f);
         else s.draft_rings.emplace_back(size_t(s.ring_size * c.head_dim) + 1, 0.0f);
       }},
      {"Engram look-back", [&](CpuSequenceState& s) {
         if (v41) s.engram_hist.assign(size_t(c.engram_max_ngram_size + kMaxRollback + 1), 0);
         else s.engram_hist.push_back(0);
       }},
      {"MTP", [&](CpuSequenceState& s) {
         if (!s.mtp_ring.empty()) s.mtp_hist_x.clear();  // V4 with MTP: the history is required
         else s.mtp_ring.assign(size_t(s.ring_size * c.head_dim), 0.0f);
       }},
  };
  for (const auto& [what, edit] : edits) {
    CpuSequenceState bad = **base;
    edit(bad);
    auto r = model_->import_state(bad);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(r.status().message().find("state geometry"), std::string::npos) << what << ": " << r.status().message();
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, StateConvert, ::testing::Values("tiny-v41", "tiny-v4"));

// A state of one checkpoint's geometry handed to a model of another (V4 → V4.1 and back) is refused.
TEST(StateConvertCross, OtherModelsStateIsRefused) {
  const std::string d41 = (fs::temp_directory_path() / ("fs_sconv_x41_" + std::to_string(::getpid()))).string();
  const std::string d4 = (fs::temp_directory_path() / ("fs_sconv_x4_" + std::to_string(::getpid()))).string();
  auto m41 = load_tiny("tiny-v41", d41);
  auto m4 = load_tiny("tiny-v4", d4);
  ASSERT_TRUE(m41 && m4);
  auto s41 = m41->new_sequence();
  auto s4 = m4->new_sequence();
  feed(*m41, *s41, toks(10, m41->config().vocab_size, 5));
  feed(*m4, *s4, toks(10, m4->config().vocab_size, 5));
  auto e41 = m41->export_state(*s41);
  auto e4 = m4->export_state(*s4);
  ASSERT_TRUE(e41.ok() && e4.ok());
  EXPECT_FALSE(m4->import_state(**e41).ok());
  EXPECT_FALSE(m41->import_state(**e4).ok());
  fs::remove_all(d41);
  fs::remove_all(d4);
}

// The CPU fingerprint is the checkpoint's (existing caches stay valid); every other backend kind
// gets its own.
TEST(StateConvertCross, FingerprintSeparatesBackendKinds) {
  const uint64_t fp = 0x1234abcd5678ef00ull;
  EXPECT_EQ(state_fingerprint(fp, "cpu"), fp);
  EXPECT_NE(state_fingerprint(fp, "cuda"), fp);
  EXPECT_NE(state_fingerprint(fp, "cuda"), state_fingerprint(fp, "cuda-native"));
  EXPECT_NE(state_fingerprint(fp, "cuda"), state_fingerprint(fp + 1, "cuda"));
}

// The engine restores a canonical prefix through import_state; a prefix of the wrong geometry
// (another checkpoint's state) is refused there and the request is answered by a full prefill
// with the same greedy tokens as without a prefix.
TEST(StateConvertCross, EngineFallsBackToFullPrefillOnARefusedPrefix) {
  const std::string d41 = (fs::temp_directory_path() / ("fs_sconv_e41_" + std::to_string(::getpid()))).string();
  const std::string d4 = (fs::temp_directory_path() / ("fs_sconv_e4_" + std::to_string(::getpid()))).string();
  auto m41 = load_tiny("tiny-v41", d41);
  auto m4 = load_tiny("tiny-v4", d4);
  ASSERT_TRUE(m41 && m4);
  const auto prompt = toks(30, m41->config().vocab_size, 6);
  auto eng = engine::Engine::create(*m41, {});
  ASSERT_TRUE(eng.ok());
  auto run = [&](std::shared_ptr<const SequenceState> prefix, uint64_t id) {
    engine::Request r;
    r.id = id;
    r.prompt = prompt;
    r.max_tokens = 6;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    r.prefix = std::move(prefix);
    auto s = (*eng)->submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_TRUE((*eng)->run_until_idle().ok());
    return engine::collect(**s);
  };
  const auto plain = run(nullptr, 1);
  ASSERT_EQ(plain.tokens.size(), 6u);
  // Good prefix (this model's first 20 tokens, canonical form): restored, same tokens.
  auto good = m41->new_sequence();
  feed(*m41, *good, std::span<const int32_t>(prompt).first(20));
  auto good_host = m41->export_state(*good);
  ASSERT_TRUE(good_host.ok());
  const int64_t prompt_before = (*eng)->stats().prompt_tokens;
  EXPECT_EQ(run(std::shared_ptr<const SequenceState>(std::move(*good_host)), 2).tokens, plain.tokens);
  EXPECT_EQ((*eng)->stats().prompt_tokens - prompt_before, 10);  // only the rest was prefilled
  // Foreign prefix (a V4 state of 20 tokens): refused, full prefill, same tokens.
  auto bad = m4->new_sequence();
  feed(*m4, *bad, toks(20, m4->config().vocab_size, 7));
  auto bad_host = m4->export_state(*bad);
  ASSERT_TRUE(bad_host.ok());
  const int64_t prompt_mid = (*eng)->stats().prompt_tokens;
  const auto fallback = run(std::shared_ptr<const SequenceState>(std::move(*bad_host)), 3);
  EXPECT_EQ(fallback.finish, engine::FinishReason::kLength);
  EXPECT_EQ(fallback.tokens, plain.tokens);
  EXPECT_EQ((*eng)->stats().prompt_tokens - prompt_mid, int64_t(prompt.size()));
  fs::remove_all(d41);
  fs::remove_all(d4);
}

// A backend whose states cannot be exported (here the engine tests' fake model; in production a
// tensor-parallel model) takes no snapshots: the sink is never called, and requests run normally.
// A CPU state reaches the sink as it is, holding exactly the tokens it is given with.
TEST(StateConvertCross, EngineHandsOnlyCanonicalStatesToTheSink) {
  engine::testing::FakeModel fake(64);
  auto eng = engine::Engine::create(fake, {});
  ASSERT_TRUE(eng.ok());
  int calls = 0;
  engine::Request r;
  r.id = 1;
  r.prompt = {3, 4, 5, 6};
  r.max_tokens = 3;
  r.ignore_eos = true;
  r.on_snapshot = [&](std::span<const int32_t>, const SequenceState&) { ++calls; };
  auto s = (*eng)->submit(std::move(r));
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*eng)->run_until_idle().ok());
  const auto out = engine::collect(**s);
  EXPECT_EQ(out.tokens.size(), 3u);
  EXPECT_EQ(calls, 0);

  const std::string dir = (fs::temp_directory_path() / ("fs_sconv_sink_" + std::to_string(::getpid()))).string();
  auto m = load_tiny("tiny-v41", dir);
  ASSERT_TRUE(m);
  auto eng2 = engine::Engine::create(*m, {});
  ASSERT_TRUE(eng2.ok());
  std::vector<int64_t> lengths;
  engine::Request q;
  q.id = 2;
  q.prompt = toks(12, m->config().vocab_size, 8);
  q.max_tokens = 3;
  q.ignore_eos = true;
  q.on_snapshot = [&](std::span<const int32_t> tokens, const SequenceState& st) {
    const auto* cpu = dynamic_cast<const CpuSequenceState*>(&st);
    EXPECT_NE(cpu, nullptr);
    EXPECT_EQ(st.length(), int64_t(tokens.size()));
    lengths.push_back(st.length());
  };
  auto s2 = (*eng2)->submit(std::move(q));
  ASSERT_TRUE(s2.ok());
  ASSERT_TRUE((*eng2)->run_until_idle().ok());
  EXPECT_EQ(engine::collect(**s2).tokens.size(), 3u);
  EXPECT_EQ(lengths, (std::vector<int64_t>{12, 14}));  // end of prompt; end (the last token not fed)
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashseek::forward
