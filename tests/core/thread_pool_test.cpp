#include <atomic>
#include <vector>

#include <gtest/gtest.h>

#include "core/thread_pool.h"

namespace flashseek {

TEST(ThreadPool, EveryIndexExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 7, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << n << " " << i;
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.parallel_for(8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) { total += int(e2 - b2); });
  });
  EXPECT_EQ(total.load(), 80);
}

// The global pool's size comes from set_global_threads (the CLI's --threads) before its first
// use; sizes out of 1..kMaxThreads and a different size after creation are errors, never a
// silent resize. (That --threads N gives N threads is checked through the CLI, cli_run_test.cpp.)
TEST(ThreadPool, GlobalSizeIsSetBeforeFirstUseOnly) {
  for (int bad : {0, -1, ThreadPool::kMaxThreads + 1}) {
    const Status st = ThreadPool::set_global_threads(bad);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("--threads"), std::string::npos) << st.message();
  }
  const int n = ThreadPool::global().size();  // creates the pool if this process had none yet
  EXPECT_GE(n, 1);
  EXPECT_TRUE(ThreadPool::set_global_threads(n).ok());
  const Status st = ThreadPool::set_global_threads(n + 1);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("already runs"), std::string::npos) << st.message();
  EXPECT_EQ(ThreadPool::global().size(), n);
}

}  // namespace flashseek
