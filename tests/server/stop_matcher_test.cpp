#include "server/stop_matcher.h"

#include <random>

#include <gtest/gtest.h>

namespace flashseek::server {
namespace {

// Reference, byte by byte: stop at the first byte where any stop string is complete; cut at the
// start of the longest stop string ending there.
std::string reference(const std::string& text, const std::vector<std::string>& stops,
                      bool& matched) {
  size_t first = std::string::npos;
  for (size_t end = 1; end <= text.size() && first == std::string::npos; ++end)
    for (const auto& s : stops)
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0)
        first = std::min(first, end - s.size());
  matched = first != std::string::npos;
  return matched ? text.substr(0, first) : text;
}

TEST(StopMatcher, HoldsBackPartialMatchUntilDecided) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("abc ST").text, "abc ");
  auto out = m.push("OX");  // not a stop after all: the held "ST" comes out
  EXPECT_EQ(out.text, "STOX");
  EXPECT_FALSE(out.matched);
  out = m.push("yy S");
  EXPECT_EQ(out.text, "yy ");
  out = m.push("TOP and more");
  EXPECT_TRUE(out.matched);
  EXPECT_EQ(out.text, "");
  EXPECT_EQ(m.push("later").text, "");  // nothing after a match
}

TEST(StopMatcher, FlushReleasesHeldText) {
  StopMatcher m({"</end>"});
  EXPECT_EQ(m.push("x</en").text, "x");
  EXPECT_EQ(m.flush(), "</en");
}

TEST(StopMatcher, EmptyStopsAreIgnored) {
  StopMatcher m({"", ""});
  auto out = m.push("anything");
  EXPECT_EQ(out.text, "anything");
  EXPECT_FALSE(out.matched);
}

// Random texts over a tiny alphabet (so matches and near-matches are common), random stops and
// random piece boundaries: the streamed output must equal the reference cut.
TEST(StopMatcher, RandomSplitsMatchReference) {
  std::mt19937 rng(7);
  auto rand_str = [&](int lo, int hi) {
    std::string s(size_t(std::uniform_int_distribution<int>(lo, hi)(rng)), 'a');
    for (char& c : s) c = "abc"[rng() % 3];
    return s;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops;
    const int n_stops = int(rng() % 4);
    for (int i = 0; i < n_stops; ++i) stops.push_back(rand_str(1, 5));
    const std::string text = rand_str(0, 40);
    StopMatcher m(stops);
    std::string got;
    bool got_match = false;
    size_t pos = 0;
    while (pos < text.size() && !got_match) {
      const size_t len = std::min(text.size() - pos, size_t(rng() % 6));
      auto out = m.push(text.substr(pos, len));
      got += out.text;
      got_match = out.matched;
      pos += len;
    }
    if (!got_match) got += m.flush();
    bool want_match = false;
    const std::string want = reference(text, stops, want_match);
    ASSERT_EQ(got, want) << "trial " << trial << " text=" << text;
    ASSERT_EQ(got_match, want_match) << "trial " << trial << " text=" << text;
  }
}

}  // namespace
}  // namespace flashseek::server
