// PagedRows (append-only rows in shared immutable pages, DESIGN.md §3): randomized
// append/truncate/clone sequences against a plain-vector model, page sharing between clones,
// memory accounting, and the CPU forward being independent of the page size.
#include "forward/paged_rows.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "forward/cpu_model.h"
#include "forward/state.h"
#include "forward/state_io.h"
#include "model/make_tiny.h"

namespace flashseek::forward {
namespace {

namespace fs = std::filesystem;

std::vector<float> random_rows(Rng& rng, int64_t n, int64_t width) {
  std::vector<float> v(size_t(n * width));
  for (auto& x : v) x = float(rng.below(1000000)) * 0.001f - 500.0f;
  return v;
}

// Checks every observable of `p` against the flat model `ref` ([rows, width]).
void expect_matches(const PagedRows& p, const std::vector<float>& ref, const std::string& what) {
  const int64_t w = p.width(), n = int64_t(ref.size()) / w;
  ASSERT_EQ(p.size(), n) << what;
  EXPECT_EQ(p.empty(), n == 0) << what;
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(std::memcmp(p.row(i), ref.data() + i * w, size_t(w) * 4), 0) << what << " row " << i;
  EXPECT_EQ(p.to_vector(), ref) << what;
  const auto v = p.pages();
  EXPECT_EQ(int64_t(v.full.size()), n / p.rows_per_page()) << what;  // only partial pages stay private
  EXPECT_EQ(int64_t(v.tail.size()), (n % p.rows_per_page()) * w) << what;
  for (const auto& pg : v.full) ASSERT_EQ(int64_t(pg->data.size()), p.rows_per_page() * w) << what;
  EXPECT_EQ(p.shared_bytes(), v.full.size() * size_t(p.rows_per_page() * w) * 4) << what;
  // Runs over an arbitrary sub-range are contiguous, in order, and never cross a page.
  const int64_t b = n / 3, e = n - n / 4;
  int64_t next = b;
  p.for_each_run(b, e, [&](int64_t first, const float* ptr, int64_t cnt) {
    EXPECT_EQ(first, next) << what;
    EXPECT_GT(cnt, 0) << what;
    EXPECT_EQ(first / p.rows_per_page(), (first + cnt - 1) / p.rows_per_page()) << what;
    EXPECT_EQ(std::memcmp(ptr, ref.data() + first * w, size_t(cnt * w) * 4), 0) << what;
    next = first + cnt;
  });
  EXPECT_EQ(next, std::max(b, e)) << what;
}

TEST(PagedRows, RandomAppendTruncateCloneMatchesPlainVectors) {
  for (int64_t width : {1, 3, 7, 13}) {
    for (int64_t rpp : {1, 2, 5, 64}) {
      Rng rng(uint64_t(width * 1000 + rpp));
      // A pool of independent copies and their models; clones diverge afterwards.
      std::vector<PagedRows> pool{PagedRows(width, rpp)};
      std::vector<std::vector<float>> refs{{}};
      for (int step = 0; step < 300; ++step) {
        const size_t k = size_t(rng.below(pool.size()));
        const uint64_t op = rng.below(10);
        const int64_t n = int64_t(refs[k].size()) / width;
        if (op < 5) {  // append 0 … 2·rpp+1 rows (crosses and lands on page boundaries)
          const auto rows = random_rows(rng, int64_t(rng.below(uint64_t(2 * rpp + 2))), width);
          if (rng.below(2)) pool[k].append(rows);
          else pool[k].append(rows.data(), int64_t(rows.size()) / width);
          refs[k].insert(refs[k].end(), rows.begin(), rows.end());
        } else if (op < 8) {  // truncate anywhere, including past the end (no-op) and to 0
          const int64_t to = int64_t(rng.below(uint64_t(n + 3)));
          pool[k].truncate(to);
          refs[k].resize(size_t(std::min(n, to) * width));
        } else if (pool.size() < 6) {  // clone
          pool.push_back(pool[k]);
          refs.push_back(refs[k]);
        }
        for (size_t j = 0; j < pool.size(); ++j)
          expect_matches(pool[j], refs[j], "w" + std::to_string(width) + " rpp" + std::to_string(rpp) +
                                               " step" + std::to_string(step) + " copy" + std::to_string(j));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(PagedRows, CloneSharesFullPagesAndWritesNeverLeak) {
  const int64_t w = 5, rpp = 4;
  Rng rng(11);
  PagedRows a(w, rpp);
  const auto rows = random_rows(rng, 4 * rpp + 3, w);  // 4 full pages + 3 tail rows
  a.append(rows);
  PagedRows b = a;
  ASSERT_EQ(b.pages().full.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a.pages().full[i].get(), b.pages().full[i].get()) << i;
  for (int64_t i = 0; i < 4 * rpp; ++i) EXPECT_EQ(a.row(i), b.row(i)) << i;  // same memory
  EXPECT_NE(a.row(4 * rpp), b.row(4 * rpp));                              // tail is private
  EXPECT_EQ(a.shared_bytes(), b.shared_bytes());

  // b: cut into its second page, then append new rows; a must not change.
  b.truncate(rpp + 2);
  const auto more = random_rows(rng, 2 * rpp, w);
  b.append(more);
  expect_matches(a, rows, "a after b's truncate + append");
  std::vector<float> bref(rows.begin(), rows.begin() + (rpp + 2) * w);
  bref.insert(bref.end(), more.begin(), more.end());
  expect_matches(b, bref, "b");
  EXPECT_EQ(a.pages().full[0].get(), b.pages().full[0].get());  // page 0 still shared
  EXPECT_NE(a.pages().full[1].get(), b.pages().full[1].get());  // b re-sealed its own page 1
  EXPECT_NE(a.pages().full[1]->id, b.pages().full[1]->id);

  // a: append into its tail and seal it; b unchanged.
  const auto tail_fill = random_rows(rng, rpp, w);
  a.append(tail_fill);
  expect_matches(b, bref, "b after a's append");
}

TEST(PagedRows, CloneCostsOnlyTheTail) {
  const int64_t w = 16, rpp = 8;
  Rng rng(3);
  PagedRows a(w, rpp);
  a.append(random_rows(rng, 10 * rpp + 5, w));
  const PagedRows b = a;
  EXPECT_EQ(b.shared_bytes(), size_t(10 * rpp * w) * 4);
  EXPECT_EQ(b.private_bytes(), size_t(5 * w) * 4 + 10 * sizeof(std::shared_ptr<const PagedRows::Page>));
  EXPECT_LT(b.private_bytes(), b.shared_bytes() / 10);
  for (const auto& pg : a.pages().full) EXPECT_EQ(pg.use_count(), 2);  // a and b, nothing copied
}

TEST(PagedRows, EdgeCases) {
  PagedRows none;  // default: width 0, empty
  EXPECT_EQ(none.size(), 0);
  EXPECT_TRUE(none.to_vector().empty());
  PagedRows p(3, 0);  // rows_per_page raised to 1
  EXPECT_EQ(p.rows_per_page(), 1);
  const std::vector<float> r{1, 2, 3, 4, 5, 6};
  p.append(r);
  EXPECT_EQ(p.size(), 2);
  p.append(r.data(), 0);  // nothing
  p.truncate(-5);         // clamps to 0
  EXPECT_TRUE(p.empty());
  p.append(r);
  p.reset(2, 4);
  EXPECT_TRUE(p.empty());
  EXPECT_EQ(p.width(), 2);
}

// ---- the CPU forward on paged state -------------------------------------------------------

std::string tiny_dir(const char* name) {
  const fs::path dir = fs::temp_directory_path() / (std::string("fs_pages_") + name + "_" + std::to_string(::getpid()));
  if (fs::exists(dir / "config.json")) return dir.string();
  auto cfg = model::builtin_config(name);
  EXPECT_TRUE(cfg.ok());
  model::MakeTinyOptions opt;
  opt.seed = 5;
  EXPECT_TRUE(model::make_tiny_checkpoint(cfg.value(), opt, dir.string()).ok());
  return dir.string();
}

std::vector<int32_t> tokens_for(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng.below(uint64_t(vocab)));
  return t;
}

// Forward in chunks of 37 on a fresh state whose paged rows use `rpp` rows per page.
std::vector<float> run_paged(Model& m, const std::vector<int32_t>& toks, int64_t rpp, std::unique_ptr<SequenceState>* keep) {
  auto st = m.new_sequence();
  auto* cs = dynamic_cast<CpuSequenceState*>(st.get());
  for (auto& l : cs->layers) {
    l.ckv.reset(l.ckv.width(), rpp);
    l.ikeys.reset(l.ikeys.width(), rpp);
  }
  std::vector<float> all, lg;
  for (size_t i = 0; i < toks.size(); i += 37) {
    BatchItem item{st.get(), std::span<const int32_t>(toks.data() + i, std::min<size_t>(37, toks.size() - i)), true};
    EXPECT_TRUE(m.forward({&item, 1}, lg).ok());
    all.insert(all.end(), lg.begin(), lg.end());
  }
  if (keep) *keep = std::move(st);
  return all;
}

class PagedForward : public ::testing::TestWithParam<const char*> {
 protected:
  static void TearDownTestSuite() {
    for (const char* n : {"tiny-v41", "tiny-v4"}) fs::remove_all(fs::temp_directory_path() / (std::string("fs_pages_") + n + "_" + std::to_string(::getpid())));
  }
};

TEST_P(PagedForward, LogitsIndependentOfPageSize) {
  auto m = CpuModel::load(tiny_dir(GetParam()), Numerics::kReference);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const auto toks = tokens_for(181, (*m)->config().vocab_size, 9);
  std::unique_ptr<SequenceState> st;
  const auto base = run_paged(**m, toks, kDefaultRowsPerPage, nullptr);
  for (int64_t rpp : {1, 3, 7}) {
    const auto paged = run_paged(**m, toks, rpp, &st);
    ASSERT_EQ(paged.size(), base.size());
    EXPECT_EQ(std::memcmp(paged.data(), base.data(), base.size() * 4), 0) << "rows_per_page " << rpp;
    int64_t pages = 0;
    for (const auto& l : dynamic_cast<CpuSequenceState&>(*st).layers) pages += int64_t(l.ckv.pages().full.size());
    EXPECT_GT(pages, 0) << "the test must cross page boundaries";
  }
}

TEST_P(PagedForward, ClonedStateSharesPagesAndDivergesSafely) {
  auto m = CpuModel::load(tiny_dir(GetParam()), Numerics::kReference);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const int64_t V = (*m)->config().vocab_size;
  const auto prefix = tokens_for(150, V, 1), xa = tokens_for(20, V, 2), xb = tokens_for(20, V, 3);
  std::unique_ptr<SequenceState> a;
  run_paged(**m, prefix, 3, &a);
  auto b = a->clone();
  const auto& ca = dynamic_cast<const CpuSequenceState&>(*a);
  const auto& cb = dynamic_cast<const CpuSequenceState&>(*b);
  size_t tail_bytes = 0, table_bytes = 0, shared = 0;
  for (size_t l = 0; l < ca.layers.size(); ++l) {
    for (auto pr : {&LayerState::ckv, &LayerState::ikeys}) {
      const PagedRows &pa = ca.layers[l].*pr, &pb = cb.layers[l].*pr;
      ASSERT_EQ(pa.pages().full.size(), pb.pages().full.size());
      for (size_t i = 0; i < pa.pages().full.size(); ++i) EXPECT_EQ(pa.pages().full[i].get(), pb.pages().full[i].get());
      tail_bytes += pb.pages().tail.size() * 4;
      table_bytes += pb.pages().full.size() * sizeof(std::shared_ptr<const PagedRows::Page>);
      shared += pb.shared_bytes();
      EXPECT_EQ(pb.private_bytes(), pb.pages().tail.size() * 4 + pb.pages().full.size() * sizeof(std::shared_ptr<const PagedRows::Page>));
    }
  }
  EXPECT_GT(shared, 4 * tail_bytes) << "the prefix should be mostly sealed pages";

  // Diverge: a continues with xa after b ran xb and rolled back into a shared page; a's logits
  // must equal an uninterrupted run of prefix + xa.
  std::vector<float> lg;
  BatchItem ib{b.get(), xb, true};
  ASSERT_TRUE((*m)->forward({&ib, 1}, lg).ok());
  ASSERT_TRUE((*m)->rollback(*b, b->length() - kMaxRollback).ok());
  BatchItem ia{a.get(), xa, true};
  std::vector<float> la;
  ASSERT_TRUE((*m)->forward({&ia, 1}, la).ok());
  std::vector<int32_t> full = prefix;
  full.insert(full.end(), xa.begin(), xa.end());
  const auto ref = run_paged(**m, full, 3, nullptr);
  ASSERT_EQ(la.size(), size_t(xa.size()) * size_t(V));
  EXPECT_EQ(std::memcmp(la.data(), ref.data() + (ref.size() - la.size()), la.size() * 4), 0);
}

TEST_P(PagedForward, SnapshotKeepsRowsAndPageGeometry) {
  auto m = CpuModel::load(tiny_dir(GetParam()), Numerics::kReference);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const auto toks = tokens_for(97, (*m)->config().vocab_size, 4);
  std::unique_ptr<SequenceState> st;
  run_paged(**m, toks, 5, &st);
  SnapshotHeader h;
  h.fingerprint = 77;
  h.n_tokens = int64_t(toks.size());
  auto blob = serialize_snapshot(*st, toks, h);
  ASSERT_TRUE(blob.ok()) << blob.status().to_string();
  auto geometry = checkpoint_snapshot_geometry(tiny_dir(GetParam()), 4096);
  ASSERT_TRUE(geometry.ok()) << geometry.status().to_string();
  auto back = deserialize_snapshot(*blob, 77, *geometry);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  const auto& a = dynamic_cast<const CpuSequenceState&>(*st);
  const auto& b = *back->state;
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    for (auto pr : {&LayerState::ckv, &LayerState::ikeys}) {
      const PagedRows &pa = a.layers[l].*pr, &pb = b.layers[l].*pr;
      EXPECT_EQ(pb.width(), pa.width()) << l;
      EXPECT_EQ(pb.rows_per_page(), 5) << l;
      EXPECT_EQ(pb.to_vector(), pa.to_vector()) << l;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, PagedForward, ::testing::Values("tiny-v41", "tiny-v4"),
                         [](const auto& info) { return std::string(info.param) == "tiny-v41" ? "v41" : "v4"; });

}  // namespace
}  // namespace flashseek::forward
