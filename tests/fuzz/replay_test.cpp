// The fuzz harnesses (fuzz/targets.h) without libFuzzer, in every build: each harness gets its
// seeds, every file of tests/fuzz/corpus/<name>/ (inputs of findings, fixed since), the inputs
// of tests/fuzz/corpus/<name>.pack (the minimised corpus of the last campaign: the coverage it
// reached), and seeded random mutations of the seeds. A harness aborts on
// a broken property; a crash or an escaping exception fails the test binary.
// FLASHSEEK_FUZZ_REPLAY_MUTATIONS sets the mutations per harness (default 400);
// FLASHSEEK_FUZZ_REPLAY_SAVE=FILE writes each mutated input to FILE before running it, so that
// the input of a crash is left there.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <cstdio>

#include "fuzz/targets.h"
#include "test_util.h"
#include "tokenizer/tokenizer_locate.h"

namespace flashseek::fuzz {
namespace {

namespace fs = std::filesystem;

int mutations_per_target() {
  const char* v = std::getenv("FLASHSEEK_FUZZ_REPLAY_MUTATIONS");
  return v && *v ? std::max(0, std::atoi(v)) : 400;
}

// One to four of: bit flip, byte set to an edge value or a random one, insertion of random bytes
// or of another seed's slice, deletion, duplication of a slice, truncation.
Bytes mutate(const Bytes& base, const std::vector<Bytes>& seeds, std::mt19937_64& rng) {
  Bytes b = base;
  const int ops = 1 + int(rng() % 4);
  static constexpr uint8_t kEdge[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '"', '{', '[', '<', '\\', '\n'};
  for (int i = 0; i < ops; ++i) {
    const size_t n = b.size();
    const size_t at = n ? rng() % n : 0;
    switch (rng() % 7) {
      case 0:
        if (n) b[at] ^= uint8_t(1u << (rng() % 8));
        break;
      case 1:
        if (n) b[at] = kEdge[rng() % std::size(kEdge)];
        break;
      case 2:
        if (n) b[at] = uint8_t(rng());
        break;
      case 3: {
        const size_t k = 1 + rng() % 16;
        for (size_t j = 0; j < k; ++j) b.insert(b.begin() + std::ptrdiff_t(std::min(at, b.size())), uint8_t(rng()));
        break;
      }
      case 4: {
        const Bytes& other = seeds[rng() % seeds.size()];
        if (other.empty()) break;
        const size_t from = rng() % other.size(), len = 1 + rng() % std::min<size_t>(64, other.size() - from);
        b.insert(b.begin() + std::ptrdiff_t(at), other.begin() + std::ptrdiff_t(from),
                 other.begin() + std::ptrdiff_t(from + len));
        break;
      }
      case 5:
        if (n) b.erase(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(std::min(n, at + 1 + rng() % 32)));
        break;
      case 6:
        if (n) b.resize(at);
        break;
    }
  }
  return b;
}

Bytes read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The inputs of a corpus pack (scripts/fuzz.sh --merge-into-tree): "FSFUZZ1\n", then a u32
// little-endian length and that many bytes per input; nullopt when the framing is broken.
std::optional<std::vector<Bytes>> unpack(const Bytes& b) {
  static constexpr char kMagic[] = "FSFUZZ1\n";
  constexpr size_t kMagicLen = sizeof(kMagic) - 1;
  if (b.size() < kMagicLen || std::memcmp(b.data(), kMagic, kMagicLen) != 0) return std::nullopt;
  std::vector<Bytes> out;
  for (size_t at = kMagicLen; at < b.size();) {
    if (b.size() - at < 4) return std::nullopt;
    uint32_t n;
    std::memcpy(&n, b.data() + at, 4);
    at += 4;
    if (n > b.size() - at) return std::nullopt;
    out.emplace_back(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(at + n));
    at += n;
  }
  return out;
}

class FuzzReplay : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzReplay, SeedsCorpusAndMutationsKeepTheProperties) {
  const Target* t = find_target(GetParam());
  ASSERT_NE(t, nullptr);
  if (t->needs_tokenizer) {
    if (auto where = tok::find_tokenizer_json(); !where.ok())
      FS_SKIP_UNLESS_CI("tokenizer data missing: " << where.status().to_string());
  }
  const std::vector<Bytes> seeds = t->seeds();
  ASSERT_FALSE(seeds.empty());
  // Every seed is accepted: the properties are checked on accepted inputs, so a seed the parser
  // refused would leave them unexercised.
  for (size_t i = 0; i < seeds.size(); ++i) EXPECT_TRUE(t->run(seeds[i])) << "seed " << i << " refused";

  int corpus = 0;
  const fs::path root = fs::path(FLASHSEEK_SOURCE_DIR) / "tests/fuzz/corpus";
  const fs::path dir = root / t->name;
  if (fs::is_directory(dir)) {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (!e.is_regular_file()) continue;
      SCOPED_TRACE(e.path().string());
      t->run(read_all(e.path()));
      ++corpus;
    }
  }
  const fs::path pack = root / (std::string(t->name) + ".pack");
  if (fs::exists(pack)) {
    const auto inputs = unpack(read_all(pack));
    ASSERT_TRUE(inputs.has_value()) << pack << " is not a corpus pack";
    for (size_t i = 0; i < inputs->size(); ++i) {
      SCOPED_TRACE(pack.string() + " input " + std::to_string(i));
      t->run((*inputs)[i]);
    }
    corpus += int(inputs->size());
  }
  std::mt19937_64 rng(std::hash<std::string>{}(t->name));
  const int n = mutations_per_target();
  int accepted = 0;
  const char* save = std::getenv("FLASHSEEK_FUZZ_REPLAY_SAVE");
  for (int i = 0; i < n; ++i) {
    const Bytes b = mutate(seeds[size_t(i) % seeds.size()], seeds, rng);
    if (save && *save) std::ofstream(save, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                                                   std::streamsize(b.size()));
    accepted += t->run(b);
  }
  std::printf("%s: %zu seeds, %d corpus files, %d of %d mutations accepted\n", t->name, seeds.size(), corpus,
              accepted, n);
}

std::vector<std::string> names() {
  std::vector<std::string> out;
  for (const Target& t : targets()) out.emplace_back(t.name);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Harnesses, FuzzReplay, ::testing::ValuesIn(names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace flashseek::fuzz
